"""Verdicts of the offload case: hits across the GPU cache and the CPU tier, the tier's payoff, and the
local hits of a GPU cache too small for the workload (eviction).

Counters: ``prompt_tokens_by_source`` splits every prompt token into ``local_cache_hit`` (the GPU prefix
cache), ``external_kv_transfer`` (loaded from the tier) and ``local_compute``; the three add up to the
prompt tokens. They are the source of truth here, because vLLM's ``prefix_cache_queries``/``hits`` over-count
under KV-cache pressure (diagnoses.overcount), which is this case's normal state.
"""

from __future__ import annotations

from typing import Any

from pytest_apc.measure.records import MeasurementError, Repeat, RunRecord, tier_hits
from pytest_apc.verdicts.diagnoses import overcount, window_text
from pytest_apc.verdicts.pairs import Pair
from pytest_apc.verdicts.verdict import Repeats, Verdict
from pytest_apc.workload.offload import OffloadSizes


def _prediction(run: RunRecord) -> Any:
    if run.prediction is None:
        raise MeasurementError(
            f"cannot predict the hits of run {run.key.id}: block size {run.block_size or 'unknown'}, chat header "
            f"{run.server.chat_header_error or 'unknown'}"
        )
    return run.prediction


def _sources(run: RunRecord) -> list[tuple[int, int, int, int]]:
    """(input tokens, local hits, tier hits, computed) of every repeat; a failure when the server does not
    split its prompt tokens by source (vLLM before 0.12), since nothing else tells the tiers apart."""
    found = []
    for repeat, d in run.require_counters():
        if d.cached_tokens is None or d.computed_tokens is None:
            raise MeasurementError(
                f"cannot tell the tiers apart in run {run.key.id}: the {run.server.mode} server's /metrics has no "
                "vllm:prompt_tokens_by_source_total (vLLM 0.12 or later exports it)"
            )
        found.append(
            (int(repeat.bench["total_input_tokens"]), d.cached_tokens, d.external_tokens or 0, d.computed_tokens)
        )
    return found


def hits_across_tiers(run: RunRecord) -> Verdict:
    """Case O: local + tier hits are what one server with room for everything hits,
    (N - G) x P + (G - 1) x Q; the tier served some of them; the sources add up to the prompt tokens."""
    p = _prediction(run)
    found = Repeats()
    for repeat, (tokens, local, tier, computed) in zip(run.repeats, _sources(run), strict=True):
        problems: list[str] = []
        total = local + tier
        line = (
            f"{run.key.id}: hits {total:,} = {local:,} from the GPU cache + {tier:,} from the CPU tier; predicted "
            f"{p.expected_hits:,} = ({run.workload.num_prompts} - {p.prefix_groups}) x {p.group_tokens:,} + "
            f"({p.prefix_groups} - 1) x {p.header_block_tokens} {window_text(p)}; computed {computed:,} of {tokens:,}"
        )
        if local + tier + computed != tokens:
            problems.append(
                f"the sources add up to {local + tier + computed:,}, not the benchmark's {tokens:,} prompt tokens"
            )
        if tier <= 0:
            problems.append("the CPU tier served nothing (external_kv_transfer 0): is the tier configured?")
        if total < p.expected_hits - p.tolerance:
            problems.append(f"hits {total:,} fall {p.expected_hits - total:,} short of the prediction")
            problems.append("diagnosis: " + _diagnose_short(run))
        elif total > p.expected_hits + p.tolerance_above:
            problems.append(f"hits {total:,} exceed the prediction by {total - p.expected_hits:,}")
            problems.append(
                "diagnosis: prefixes survived the reset before the run: the first request of a group hit them. "
                f"The reset was {repeat.reset!r}; a KV connector whose reset does not empty its store (e.g. "
                "LMCache's, which report success and clear nothing) shows exactly this"
            )
        numbers = {"hits_all_tiers": total, "local": local, "tier": tier, "computed": computed,
                   "expected_hits": p.expected_hits, "input_tokens": tokens}  # fmt: skip
        found.add(line, numbers, problems, _overcounted(repeat))
    return found.verdict("hits_across_tiers", [run.key.id])


def _overcounted(repeat: Repeat) -> list[str]:
    """A note where vLLM's counters over-counted this repeat's prefix-cache queries."""
    note = overcount(repeat.delta, int(repeat.bench["total_input_tokens"])) if repeat.delta else None
    return [note] if note else []


def _diagnose_short(run: RunRecord) -> str:
    sizes = OffloadSizes.of(run.server.offload) if run.server.offload else None
    if sizes is not None and sizes.tokens_short:
        return (
            f"the CPU tier holds {sizes.tier_tokens:,} tokens, less than the working set of "
            f"{sizes.working_set_tokens:,}: it evicted prefixes before they were asked for again"
        )
    return (
        "blocks the GPU cache evicted were neither in the tier nor computed into it in time: check the "
        "server log for offload errors and the tier size (--apc-set offload_tier_gib)"
    )


def tier_pays_off(pair: Pair) -> Verdict:
    """O vs N (the same small GPU cache without a tier): the tier hit more, and median TTFT improved
    significantly (the bootstrap interval of N/O lies above 1)."""
    without, with_tier = pair.off, pair.on
    hits_without = sum(tier_hits(d) or 0 for _, d in without.require_counters()) / len(without.repeats)
    hits_with = sum(tier_hits(d) or 0 for _, d in with_tier.require_counters()) / len(with_tier.repeats)
    gain = pair.ttft_speedup()
    problems = []
    if hits_with <= hits_without:
        problems.append(f"the tier did not add hits: {hits_with:,.0f} with it, {hits_without:,.0f} without")
    if gain.low <= 1.0:
        problems.append("the TTFT gain is not significant: its interval reaches 1.0")
    message = (
        f"{pair.id}: hits per repeat {hits_without:,.0f} without the tier -> {hits_with:,.0f} with it; median TTFT "
        f"{without.median_ms():,.1f} -> {with_tier.median_ms():,.1f} ms, gain {gain.estimate:.2f}x [{gain.low:.2f}, "
        f"{gain.high:.2f}] ({gain.confidence:.0%} CI)"
    )
    if problems:
        message += "\n" + "\n".join(f"- {p}" for p in problems)
    numbers = {
        "hits_without_tier": hits_without, "hits_with_tier": hits_with,
        "median_ttft_without_ms": without.median_ms(), "median_ttft_with_ms": with_tier.median_ms(),
        "ttft_speedup": gain.estimate, "ttft_speedup_low": gain.low, "ttft_speedup_high": gain.high,
        "confidence": gain.confidence,
    }  # fmt: skip
    return Verdict("tier_pays_off", [without.key.id, with_tier.key.id], not problems, message, numbers)


def eviction_predicted(run: RunRecord) -> Verdict:
    """At concurrency 1 the GPU cache's own hits equal, exactly, a replay of vLLM's block pool over the
    requests as sent (eviction.py): where a group returns after others evicted its prefix from the tail,
    it hits the head that is left."""
    if run.local_hits_predicted is None:
        raise MeasurementError(
            f"cannot replay the block pool for run {run.key.id}: the benchmark did not report each request's "
            "prefix group and prompt length, or the server its GPU blocks"
        )
    predicted = run.local_hits_predicted
    found = Repeats()
    for repeat, (_, local, _, _) in zip(run.repeats, _sources(run), strict=True):
        off = local - predicted
        problems = []
        line = (
            f"{run.key.id}: GPU-cache hits {local:,}, replay of vLLM's block pool {predicted:,} ({off:+,}); "
            f"{run.server.num_gpu_blocks or 0:,} GPU blocks, "
            f"{run.workload.prefix_groups} prefix groups of {run.prediction.group_tokens if run.prediction else 0:,} "
            "tokens"
        )
        if off:
            problems.append(
                f"the GPU cache hit {off:+,} tokens against the replay: its eviction is not the LRU order "
                "replayed (free blocks reused least recently freed first, a request's blocks freed tail first, "
                "its partial last block reused first); a vLLM whose block pool changed, or blocks freed out of "
                "order (preemption, a KV connector), do this"
            )
        numbers = {"local_hits": local, "predicted": predicted, "difference": off}
        found.add(line, numbers, problems, _overcounted(repeat))
    return found.verdict("eviction_predicted", [run.key.id])
