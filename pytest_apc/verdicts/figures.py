"""The numbers that a verdict judges and a report row shows, computed here once, on every repeat of a run:
the TTFT gain of a pair and the TTFT ratio of a hash algorithm (bootstrap intervals over every repeat's
requests), the cached tokens of each repeat as ``cached_tokens_match`` judges them, the hits an algorithm's
run and the default's compare, and where a fleet run's requests landed in each repeat. A figure shown as
one number is that of the repeat :func:`~pytest_apc.verdicts.verdict.shown_repeat` picks (the first that
failed, else the first), so a row always shows what its verdict showed."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_apc.config import Settings
from pytest_apc.measure.records import MeasurementError, RunRecord
from pytest_apc.serving.metrics import Delta
from pytest_apc.verdicts import locality
from pytest_apc.verdicts.diagnoses import diagnose_extra_hits, diagnose_short_hits, overcount, window_text
from pytest_apc.verdicts.stats import Interval, ratio_of_medians
from pytest_apc.verdicts.verdict import shown_repeat
from pytest_apc.workload.cases import Prediction


def ttft_gain(off: RunRecord, on: RunRecord, settings: Settings) -> Interval:
    """median TTFT OFF / median TTFT ON over every repeat's requests, with its bootstrap interval (> 1: APC
    is faster); a ValueError without per-request TTFTs."""
    return ratio_of_medians(
        off.samples_ms("ttfts"), on.samples_ms("ttfts"),
        samples=settings.bootstrap_samples, confidence=settings.confidence,
    )  # fmt: skip


def ttft_ratio(run: RunRecord, default: RunRecord, settings: Settings) -> Interval:
    """median TTFT on the algorithm's server / on the default's, over every repeat's requests, with its
    bootstrap interval (> 1: the algorithm is slower); a ValueError without per-request TTFTs."""
    return ratio_of_medians(
        run.samples_ms(), default.samples_ms(), samples=settings.bootstrap_samples, confidence=settings.confidence
    )


def counted_hits(d: Delta) -> int:
    """The cached tokens of one repeat: prompt_tokens_by_source, exact where vLLM's query and hit counters
    over-count (see ``overcount``), else the hit counter."""
    return int(d.cached_tokens if d.cached_tokens is not None else d.prefix_cache_hits or 0)


@dataclass(frozen=True)
class RepeatHits:
    """One repeat's cached tokens as ``cached_tokens_match`` judges them, with what it found wrong."""

    hits: int
    queries: int
    tokens: int  # the benchmark's total input tokens
    delta: Delta
    problems: tuple[str, ...]
    note: str | None  # vLLM's over-count, where the by-source counters show it

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def prediction_of(run: RunRecord) -> Prediction:
    """The run's predicted hits, or a "cannot predict" failure naming what was missing."""
    p = run.prediction
    if p is None:
        why = run.server.chat_header_error or "the server's cache_config_info or /tokenize was unavailable"
        header = run.header_tokens if run.header_tokens >= 0 else "unknown"  # -1: not measured
        raise MeasurementError(
            f"cannot predict the hits of run {run.key.id}: block size {run.block_size or 'unknown'}, chat header "
            f"tokens {header} ({why})"
        )
    return p


def judged_hits(run: RunRecord) -> list[RepeatHits]:
    """Every repeat's cached tokens against the prediction (N-1)*floor(S/B)*B within its window, and whether
    the books balance; a MeasurementError without a prediction or counters."""
    p = prediction_of(run)
    found = []
    for repeat, d in run.require_counters():
        problems: list[str] = []
        tokens = int(repeat.bench["total_input_tokens"])
        queries = int(d.prefix_cache_queries or 0)
        hits = counted_hits(d)
        recounted = overcount(d, tokens)
        too_few = hits < p.expected_hits - p.tolerance or (hits == 0 and p.expected_hits > 0)
        too_many = hits > p.expected_hits + p.tolerance_above
        if too_few or too_many:
            problems.append(f"hits {hits:,} are not within {window_text(p)} of the predicted {p.expected_hits:,}")
        if hits == 0 and p.expected_hits > 0:
            problems.append("no cached tokens at all, where the prediction expects some")
        if not recounted and queries != tokens:
            problems.append(f"queries {queries:,} != the benchmark's total input tokens {tokens:,}")
        elif not recounted and d.prefix_cache_hits is not None and d.prefix_cache_hits != hits:
            problems.append(f"prompt_tokens_by_source{{local_cache_hit}} {hits:,} != hits {d.prefix_cache_hits:,}")
        if d.computed_tokens is not None and d.computed_tokens != tokens - hits:
            problems.append(f"computed prefill {d.computed_tokens:,} != input tokens - hits = {tokens - hits:,}")
        if too_few:
            problems.append("diagnosis: " + diagnose_short_hits(run, d))
        elif too_many:
            problems.append("diagnosis: " + diagnose_extra_hits(run, hits))
        found.append(RepeatHits(hits, queries, tokens, d, tuple(problems), recounted))
    return found


def hits_shown(run: RunRecord) -> RepeatHits | None:
    """The repeat ``cached_tokens_match`` shows (the first that failed, else the first); None where it
    cannot judge the run (no prediction or no counters)."""
    try:
        judged = judged_hits(run)
    except MeasurementError:
        return None
    return judged[shown_repeat([bool(h.problems) for h in judged])]


def hash_hits(run: RunRecord, default: RunRecord) -> tuple[int | None, int | None]:
    """The prefix-cache hits of an algorithm's run and of the default's that ``same_as_default`` compares,
    repeat by repeat: those of the first repeat where they differ, else of the first."""
    pairs = [
        (mine.delta.prefix_cache_hits if mine.delta else None, theirs.delta.prefix_cache_hits if theirs.delta else None)
        for mine, theirs in zip(run.repeats, default.repeats, strict=False)
    ]
    return next((p for p in pairs if p[0] != p[1]), pairs[0])


@dataclass(frozen=True)
class RepeatLocality:
    """Where one repeat's requests landed, with what ``prefix_locality`` found wrong."""

    found: locality.Locality
    problems: tuple[str, ...]


def judged_localities(run: RunRecord, settings: Settings) -> list[RepeatLocality]:
    """Every repeat's locality against the route's promise and --apc-set max_routing_cost; a MeasurementError
    when the counters to tell it are missing."""
    promise = locality.held_to(run.key, settings.fleet_promise)
    judged = []
    for repeat in run.repeats:
        found = locality.of_repeat(run, repeat)
        problems: list[str] = []
        if found.requests != found.num_prompts:
            problems.append(
                f"the replicas finished {found.requests} of the benchmark's {found.num_prompts} requests, so where "
                "they landed cannot be told (see fleet_accounting)"
            )
        problems += locality.promise_problems(found, promise)
        problems += locality.cost_problems(found, settings.max_routing_cost)
        judged.append(RepeatLocality(found, tuple(problems)))
    return judged


def locality_shown(run: RunRecord, settings: Settings) -> locality.Locality:
    """The repeat ``prefix_locality`` shows (the first that failed, else the first); a MeasurementError when
    the counters to tell it are missing."""
    judged = judged_localities(run, settings)
    return judged[shown_repeat([bool(j.problems) for j in judged])].found
