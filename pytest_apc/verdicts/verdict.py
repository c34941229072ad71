"""Verdicts: true statements about APC, each a check that can fail, with a diagnosis when it does.

A verdict function takes measured runs and returns a :class:`Verdict` (passed or not, a message that
carries the numbers, and the numbers themselves for the results file). Tests hand it to the
``apc_assert`` fixture, which records it and fails the test when it did not pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.measure.records import MeasurementError, RunRecord
from pytest_apc.serving.metrics import Delta
from pytest_apc.verdicts import locality
from pytest_apc.verdicts.stats import Interval, fit_prefill_cost, prefill_speedup_bound, ratio_of_medians
from pytest_apc.workload.cases import Prediction, RunKey


@dataclass
class Verdict:
    name: str
    runs: list[str]
    passed: bool
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "passed": self.passed,
            "message": self.message,
            "numbers": self.numbers,
        }


@dataclass
class Pair:
    """The OFF and ON run of one pair (A/B, C/D or E/F) at one concurrency, and every other measured run."""

    off: RunRecord
    on: RunRecord
    settings: Settings
    runs: Mapping[RunKey, RunRecord] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.off.key.id}/{self.on.key.id}"

    def ttft_speedup(self) -> Interval:
        """median TTFT OFF / median TTFT ON with its bootstrap interval (> 1: APC is faster)."""
        return ratio_of_medians(
            self.off.samples_ms("ttfts"), self.on.samples_ms("ttfts"),
            samples=self.settings.bootstrap_samples, confidence=self.settings.confidence,
        )  # fmt: skip

    def modelled_ttft_bound(self) -> float | None:
        """The most TTFT can improve for this pair, from a prefill cost model fitted on OFF runs.

        Fitted on the OFF runs measured at concurrency 1 (A, C, E: TTFT is then the prefill of one
        request), T(L) = a*L + b*L^2; the bound is T(L)/(T(L) - T(cached)). None without such runs.
        """
        lengths, seconds = [], []
        for key, run in sorted(self.runs.items()):
            if not key.apc and key.concurrency == 1 and not key.hash_algo:
                lengths.append(float(run.bench["total_input_tokens"]) / run.workload.num_prompts)
                seconds.append(run.median_ms("ttfts") / 1000.0)
        cost = fit_prefill_cost(lengths, seconds)
        p = self.on.prediction
        if cost is None or p is None or self.on.workload.num_prompts < 2:
            return None
        prompt_len = float(self.on.bench["total_input_tokens"]) / self.on.workload.num_prompts
        cached = p.expected_hits / (self.on.workload.num_prompts - 1)
        return prefill_speedup_bound(cost, prompt_len, cached)


# vllm:cache_config_info labels that two comparable servers may differ in: the APC setting itself, and
# what the server measures at start-up (the H200's servers got 58,546 and 58,576 blocks).
CACHE_CONFIG_MAY_DIFFER = {
    "enable_prefix_caching", "prefix_caching_hash_algo", "engine",
    "num_gpu_blocks", "num_cpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency",
}  # fmt: skip


def not_comparable(a: RunRecord, b: RunRecord) -> list[str]:
    """Why two runs that a verdict compares (OFF/ON, default/algorithm) do not measure the same thing:
    other prompts, or servers that differ in more than their APC setting (e.g. --apc-url-on/off
    pointing at different deployments); block size and the rest of the cache come from cache_config_info."""
    problems = []
    tokens_a = [int(r.bench["total_input_tokens"]) for r in a.repeats]
    tokens_b = [int(r.bench["total_input_tokens"]) for r in b.repeats]
    if tokens_a != tokens_b:
        problems.append(f"the benchmark sent other prompts: total input tokens {tokens_a} vs {tokens_b}")
    for label, value_a, value_b in (
        ("vLLM version", a.server.version, b.server.version),
        ("max model length", a.server.max_model_len, b.server.max_model_len),
        ("chat template header tokens", a.server.chat_header_tokens, b.server.chat_header_tokens),
    ):
        if value_a is not None and value_b is not None and value_a != value_b:
            problems.append(f"{label} {value_a} on {a.server.mode} vs {value_b} on {b.server.mode}")
    config_a, config_b = a.server.cache_config, b.server.cache_config
    tier_pair = {a.key.case, b.key.case} == {"N", "O"}  # the offload case compares without and with a tier
    for name in sorted((set(config_a) & set(config_b)) - CACHE_CONFIG_MAY_DIFFER):
        if tier_pair and name.startswith("kv_offloading"):
            continue
        if config_a[name] != config_b[name]:
            problems.append(
                f"cache config {name}={config_a[name]} on {a.server.mode} vs {config_b[name]} on {b.server.mode}"
            )
    return problems


def apc_really_off(run: RunRecord) -> Verdict:
    """An APC-off server looks nothing up and hits nothing, while it still counts the prompt tokens."""
    lines: list[str] = []
    per_repeat: list[dict[str, Any]] = []
    failed: list[bool] = []
    for repeat, d in run.require_counters():
        tokens = int(repeat.bench["total_input_tokens"])
        computed = d.prefill_computed
        good = d.prefix_cache_queries == 0 and d.prefix_cache_hits == 0 and computed == tokens
        per_repeat.append({"queries": d.prefix_cache_queries, "hits": d.prefix_cache_hits, "computed_tokens": computed})
        failed.append(not good)
        lines.append(
            f"{run.key.id} (APC off): prefix-cache queries {d.prefix_cache_queries}, hits {d.prefix_cache_hits} "
            f"(both must be 0); prompt tokens computed {computed} (must equal the benchmark's {tokens})"
        )
        if not good and (d.prefix_cache_queries or d.prefix_cache_hits):
            lines.append("diagnosis: the OFF server looked up the prefix cache, so it is not really off")
        elif not good:
            lines.append("diagnosis: the server did not count every prompt token (requests lost or still running)")
    return Verdict(
        "apc_really_off", [run.key.id], not any(failed), "\n".join(lines), repeat_numbers(per_repeat, failed)
    )


def repeat_numbers(per_repeat: list[dict[str, Any]], failed: list[bool]) -> dict[str, Any]:
    """Every repeat's numbers, and at the top level those of the first repeat that failed (else the first),
    so that the results file shows what failed without hiding the other repeats."""
    shown = per_repeat[failed.index(True)] if any(failed) else per_repeat[0]
    return {**shown, "repeats": per_repeat}


def cached_tokens_match(run: RunRecord) -> Verdict:
    """Hits equal the prediction (N-1)*floor(S/B)*B within one block per request; the books balance."""
    p = run.prediction
    if p is None:
        why = run.server.chat_header_error or "the server's cache_config_info or /tokenize was unavailable"
        header = run.header_tokens if run.header_tokens >= 0 else "unknown"  # -1: not measured
        raise MeasurementError(
            f"cannot predict the hits of run {run.key.id}: block size {run.block_size or 'unknown'}, chat header "
            f"tokens {header} ({why})"
        )
    lines: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    per_repeat: list[dict[str, Any]] = []
    failed: list[bool] = []
    for repeat, d in run.require_counters():
        known = len(problems)
        tokens = int(repeat.bench["total_input_tokens"])
        queries = int(d.prefix_cache_queries or 0)
        # prompt_tokens_by_source is exact where vLLM's query and hit counters over-count (see overcount).
        hits = int(d.cached_tokens if d.cached_tokens is not None else d.prefix_cache_hits or 0)
        recounted = overcount(d, tokens)
        too_few = hits < p.expected_hits - p.tolerance or (hits == 0 and p.expected_hits > 0)
        too_many = hits > p.expected_hits + p.tolerance_above
        if too_few or too_many:
            problems.append(f"hits {hits:,} are not within {window_text(p)} of the predicted {p.expected_hits:,}")
        if hits == 0 and p.expected_hits > 0:
            problems.append("no cached tokens at all, where the prediction expects some")
        if recounted:
            notes.append(recounted)
        elif queries != tokens:
            problems.append(f"queries {queries:,} != the benchmark's total input tokens {tokens:,}")
        elif d.prefix_cache_hits is not None and d.prefix_cache_hits != hits:
            problems.append(f"prompt_tokens_by_source{{local_cache_hit}} {hits:,} != hits {d.prefix_cache_hits:,}")
        if d.computed_tokens is not None and d.computed_tokens != tokens - hits:
            problems.append(f"computed prefill {d.computed_tokens:,} != input tokens - hits = {tokens - hits:,}")
        lines.append(
            f"{run.key.id}: cached tokens {hits:,} of {queries:,} queried (hit ratio "
            f"{(hits / queries if queries else 0):.1%}); predicted {p.expected_hits:,} = "
            f"({run.workload.num_prompts}-1) x floor({p.shared_prefix_tokens}/{p.block_size}) x {p.block_size} "
            f"(shared prefix S = {run.header_tokens} template + {run.workload.prefix_len} prefix tokens) "
            f"{window_text(p)}"
        )
        per_repeat.append(
            {
                "hits": hits,
                "queries": queries,
                "expected_hits": p.expected_hits,
                "tolerance": p.tolerance,
                "tolerance_above": p.tolerance_above,
                "computed_tokens": d.computed_tokens,
                "cached_tokens": d.cached_tokens,
            }
        )
        if too_few:
            problems.append("diagnosis: " + diagnose_short_hits(run, d))
        elif too_many:
            problems.append("diagnosis: " + diagnose_extra_hits(run, hits))
        failed.append(len(problems) > known)
    message = "\n".join(
        lines + [f"- {problem}" for problem in dict.fromkeys(problems)] + [f"note: {n}" for n in dict.fromkeys(notes)]
    )
    return Verdict("cached_tokens_match", [run.key.id], not problems, message, repeat_numbers(per_repeat, failed))


def prefill_saved(pair: Pair) -> Verdict:
    """The prefill the ON server computed is what the prediction leaves, so APC saved what it should."""
    p = pair.on.prediction
    if p is None:
        return cached_tokens_match(pair.on)  # raises the "cannot predict" failure
    (_, off), (_, on) = pair.off.require_counters()[0], pair.on.require_counters()[0]
    computed_off, computed_on = off.prefill_computed, on.prefill_computed
    ok = computed_off is not None and computed_on is not None and computed_on <= p.computed_tokens_on + p.tolerance
    ratio = (computed_off / computed_on) if computed_off and computed_on else None
    message = (
        f"{pair.id}: prefill computed OFF {_tokens(computed_off)} tokens, ON {_tokens(computed_on)} tokens: "
        f"{ratio or 0:.2f}x less work (bound from the workload {p.prefill_bound:.2f}x, "
        f"predicted ON {p.computed_tokens_on:,}, at most {p.tolerance:,} more)"
    )
    if not ok:
        message += "\ndiagnosis: " + diagnose_short_hits(pair.on, on)
    return Verdict(
        "prefill_saved",
        [pair.off.key.id, pair.on.key.id],
        ok,
        message,
        {"computed_off": computed_off, "computed_on": computed_on, "ratio": ratio, "bound": p.prefill_bound},
    )


def _tokens(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _slower_problems(
    ttft_slowdown_low: float, duration_ratio: float, tol: float, slower: str, longer: str
) -> list[str]:
    """Slower beyond tolerance: the low end of the median-TTFT slowdown interval, or the duration ratio."""
    problems = []
    if ttft_slowdown_low > 1 + tol:
        problems.append(f"median TTFT is slower {slower} by at least {ttft_slowdown_low - 1:.0%} (tolerance {tol:.0%})")
    if duration_ratio > 1 + tol:
        problems.append(f"the run took {duration_ratio - 1:.0%} longer {longer} (tolerance {tol:.0%})")
    return problems


def _timing_numbers(pair: Pair) -> dict[str, Any]:
    speedup = pair.ttft_speedup()
    return {
        "median_ttft_off_ms": pair.off.median_ms(), "median_ttft_on_ms": pair.on.median_ms(),
        "ttft_speedup": speedup.estimate, "ttft_speedup_low": speedup.low, "ttft_speedup_high": speedup.high,
        "confidence": speedup.confidence,
        "prefill_bound": pair.on.prediction.prefill_bound if pair.on.prediction else None,
        "modelled_ttft_bound": pair.modelled_ttft_bound(),
        "duration_off_s": pair.off.duration_s, "duration_on_s": pair.on.duration_s,
        "duration_speedup": pair.off.duration_s / pair.on.duration_s if pair.on.duration_s else None,
    }  # fmt: skip


def _bounds_text(n: dict[str, Any]) -> str:
    text = f"prefill-token bound {n['prefill_bound']:.2f}x" if n["prefill_bound"] else "no prefill bound"
    if n["modelled_ttft_bound"]:
        text += f", modelled TTFT bound {n['modelled_ttft_bound']:.2f}x (cost model fitted on the OFF runs at c1)"
    return text


def ttft_gain(pair: Pair) -> Verdict:
    """Median TTFT improves significantly: the bootstrap interval of OFF/ON lies above 1."""
    n = _timing_numbers(pair)
    low = n["ttft_speedup_low"]
    ok = low > 1.0
    message = (
        f"{pair.id} at concurrency {pair.on.key.concurrency}: median TTFT {n['median_ttft_off_ms']:,.1f} -> "
        f"{n['median_ttft_on_ms']:,.1f} ms, gain {n['ttft_speedup']:.2f}x [{low:.2f}, {n['ttft_speedup_high']:.2f}] "
        f"({n['confidence']:.0%} CI) next to its {_bounds_text(n)}; duration {n['duration_off_s']:.2f} -> "
        f"{n['duration_on_s']:.2f} s"
    )
    fraction = pair.settings.min_bound_fraction
    bound = n["modelled_ttft_bound"] or n["prefill_bound"]
    if ok and fraction and bound:
        target = 1 + fraction * (bound - 1)
        if n["ttft_speedup"] < target:
            ok = False
            message += (
                f"\n- gain {n['ttft_speedup']:.2f}x is below {fraction:.0%} of the way to the bound ({target:.2f}x)"
            )
    if not ok and low <= 1.0:
        message += "\n- the gain is not significant: its interval reaches 1.0 (no improvement)"
        message += "\ndiagnosis: " + diagnose_no_gain(pair)
    return Verdict("ttft_gain", [pair.off.key.id, pair.on.key.id], ok, message, n)


def not_slower(pair: Pair) -> Verdict:
    """APC on is not slower than off beyond --apc-overhead-tolerance (median TTFT interval and duration)."""
    n = _timing_numbers(pair)
    tol = pair.settings.overhead_tolerance
    # ON/OFF slowdown interval = 1/speedup; significantly slower when its low end is above 1 + tol.
    slowdown_low = 1 / n["ttft_speedup_high"] if n["ttft_speedup_high"] else float("inf")
    duration_ratio = n["duration_on_s"] / n["duration_off_s"] if n["duration_off_s"] else float("inf")
    problems = _slower_problems(slowdown_low, duration_ratio, tol, "with APC", "with APC")
    message = (
        f"{pair.id} at concurrency {pair.on.key.concurrency}: median TTFT {n['median_ttft_off_ms']:,.1f} -> "
        f"{n['median_ttft_on_ms']:,.1f} ms (gain {n['ttft_speedup']:.2f}x [{n['ttft_speedup_low']:.2f}, "
        f"{n['ttft_speedup_high']:.2f}]); duration {n['duration_off_s']:.2f} -> {n['duration_on_s']:.2f} s; "
        f"{_bounds_text(n)}; tolerance {tol:.0%}"
    )
    if problems:
        message += "\n" + "\n".join(f"- {p}" for p in problems)
        message += "\ndiagnosis: APC overhead (hashing, lookups, block management) costs more than it saves here"
    return Verdict("not_slower", [pair.off.key.id, pair.on.key.id], not problems, message, n)


def pure_effect(pair: Pair) -> Verdict:
    """C/D: a significant TTFT gain up to --apc-pure-gain-concurrency (every level by default, none at -1);
    above it, not slower."""
    limit = pair.settings.pure_gain_concurrency
    if limit >= 0 and (not limit or pair.on.key.concurrency <= limit):
        return ttft_gain(pair)
    return not_slower(pair)


def rag_effect(pair: Pair) -> Verdict:
    """E/F: a significant TTFT gain up to --apc-low-concurrency (0: at no level); above it, queueing dominates
    TTFT, so not slower."""
    if pair.on.key.concurrency <= pair.settings.low_concurrency:
        return ttft_gain(pair)
    return not_slower(pair)


def same_as_default(run: RunRecord, default: RunRecord, settings: Settings) -> Verdict:
    """A hash algorithm changes how blocks are named, not which: identical hits, timing within tolerance."""
    (_, d_algo), (_, d_default) = run.require_counters()[0], default.require_counters()[0]
    hits, base = d_algo.prefix_cache_hits, d_default.prefix_cache_hits
    problems = []
    if hits != base:
        problems.append(f"cached tokens {hits:,} differ from the default's {base:,}")
    slowdown = ratio_of_medians(
        run.samples_ms(), default.samples_ms(), samples=settings.bootstrap_samples, confidence=settings.confidence
    )
    throughput = run.duration_s / default.duration_s if default.duration_s else float("inf")
    problems += _slower_problems(
        slowdown.low, throughput, settings.overhead_tolerance, "than the default", "than with the default"
    )
    algo = run.key.hash_algo
    message = (
        f"{run.key.id} vs {default.key.id} ({algo} vs {default.server.prefix_caching_hash_algo}): cached tokens "
        f"{hits:,} vs {base:,}; median TTFT {run.median_ms():,.1f} vs {default.median_ms():,.1f} ms "
        f"(ratio {slowdown}); duration {run.duration_s:.2f} vs {default.duration_s:.2f} s"
    )
    message += "".join(f"\n- {p}" for p in problems)
    return Verdict(
        "same_as_default",
        [default.key.id, run.key.id],
        not problems,
        message,
        {
            "hits": hits,
            "default_hits": base,
            "ttft_ratio": slowdown.estimate,
            "ttft_ratio_low": slowdown.low,
            "duration_ratio": throughput,
        },
    )


def diagnose_no_gain(pair: Pair) -> str:
    """Why an ON run is not faster: first whether the cache hit at all, then what else eats the gain."""
    p = pair.on.prediction
    hits = pair.on.delta.prefix_cache_hits if pair.on.delta else None
    if p is not None and p.shared_blocks == 0:
        return diagnose_short_hits(pair.on, pair.on.delta)
    if p is not None and hits is not None and hits < p.expected_hits - p.tolerance:
        return f"too few cache hits ({hits:,} of {p.expected_hits:,} predicted): " + diagnose_short_hits(
            pair.on, pair.on.delta
        )
    return (
        f"the cache hit as predicted ({hits if hits is not None else '?'} tokens), so the prefill it saves is a "
        "small share of TTFT here: queueing at this concurrency, a decode-bound or tiny workload, or APC overhead"
    )


def overcount(d: Delta, input_tokens: int) -> str | None:
    """Why prefix-cache queries exceed the prompt tokens, when the by-source counters show the prompts
    were counted right: vLLM up to 0.26 recorded a lookup each time the scheduler tried to admit a waiting
    request, so under KV-cache pressure a request that waited was counted again (vLLM issue 43736; later
    versions count at admission, pull request 45202). None when the counters agree, or cannot tell."""
    if d.prefix_cache_queries is None or d.prefix_cache_queries <= input_tokens:
        return None
    sources = (d.computed_tokens, d.cached_tokens)
    if any(v is None for v in sources) or sum(v or 0 for v in sources) + (d.external_tokens or 0) != input_tokens:
        return None
    return (
        f"prefix-cache queries {d.prefix_cache_queries:,} (hits {d.prefix_cache_hits or 0:,}) exceed the "
        f"{input_tokens:,} prompt tokens: vLLM's re-queue over-count (up to vLLM 0.26, a request that waited for "
        "KV-cache space was looked up and counted again on every try; vLLM issue 43736, fixed by pull request "
        "45202), not APC misbehaving; prompt_tokens_by_source adds up to the prompt tokens and is what is judged"
    )


def window_text(p: Prediction) -> str:
    if p.tolerance == p.tolerance_above:
        return f"+/- {p.tolerance:,}"
    return f"-{p.tolerance:,}/+{p.tolerance_above:,}"


def diagnose_extra_hits(run: RunRecord, hits: int) -> str:
    """More hits than a cold cache can give: what was cached before the run."""
    p = run.prediction
    assert p is not None
    per_request = p.shared_blocks * p.block_size
    if per_request and abs(hits - (p.expected_hits + per_request)) <= p.tolerance_above:
        return (
            f"the cache was warm: {hits:,} is about N x {per_request:,} (every request hit the prefix, the first "
            f"one too), as when the prefix cache was not reset before the run or an offloaded KV tier (e.g. "
            f"--kv-transfer-config) kept the prefix; check the reset lines of the run and the server's arguments"
        )
    return (
        "the prompts shared more than the predicted prefix: check the dataset arguments (prefix and suffix "
        "lengths, number of prefixes) against the workload"
    )


def diagnose_short_hits(run: RunRecord, d: Delta | None) -> str:
    """The likeliest cause of too few hits, from what was measured; the most direct evidence first (no
    lookups, preemptions, KV-cache capacity, block size)."""
    info = run.server
    p = run.prediction
    causes = []
    if d is not None and d.prefix_cache_queries == 0:
        causes.append(
            f"APC is off on the server: it made no prefix-cache lookups "
            f"(cache_config_info enable_prefix_caching={info.cache_config.get('enable_prefix_caching')!r})"
        )
    if d is not None and d.preemptions:
        causes.append(f"{d.preemptions} preemptions during the run: blocks were freed and recomputed")
    if p is not None and info.num_gpu_blocks is not None and info.block_size:
        prompt_blocks = run.workload.kv_blocks_per_request(run.header_tokens, info.block_size)
        working_set = run.key.concurrency * prompt_blocks
        if working_set > info.num_gpu_blocks:
            causes.append(
                f"KV-cache capacity: concurrency {run.key.concurrency} x {prompt_blocks} blocks per request = "
                f"{working_set} blocks > the server's {info.num_gpu_blocks} (evictions)"
            )
    if p is not None and p.shared_blocks == 0:
        causes.append(
            f"block size {p.block_size} is larger than the shared prefix of {p.shared_prefix_tokens} tokens: "
            "no whole block can be shared"
        )
    if not causes:
        causes.append(
            "the prompts did not share the predicted prefix: check that the benchmark generated identical "
            "prefixes (dataset, seed, tokenizer) and that the server's tokenizer matches the client's"
        )
    return "; ".join(causes)


def fleet_accounting(run: RunRecord) -> Verdict:
    """A fleet run's books balance replica by replica: every request reached exactly one replica (none
    dropped, none retried), every prompt token was looked up, and each replica's hits are whole cold
    prefills: (k - c) x P + (c - 1) x Q for its k requests and c groups first seen there."""
    lines: list[str] = []
    problems: list[str] = []
    per_repeat: list[dict[str, Any]] = []
    failed: list[bool] = []
    for repeat in run.repeats:
        known = len(problems)
        found = locality.of_repeat(run, repeat)
        p = found.prediction
        tokens = int(repeat.bench["total_input_tokens"])
        queries = sum(r.queries for r in found.replicas)
        if found.requests != found.num_prompts:
            problems.append(
                f"the replicas finished {found.requests} requests for the benchmark's {found.num_prompts}: the "
                f"router {'retried or duplicated' if found.requests > found.num_prompts else 'dropped'} requests"
            )
        if queries != tokens:
            problems.append(f"the replicas looked up {queries:,} prompt tokens, the benchmark sent {tokens:,}")
        for r in found.replicas:
            if r.cold_prefills is None:
                problems.append(
                    f"{r.name}: the shared prefix ({p.shared_prefix_tokens} tokens with the template) spans no block "
                    f"of {p.block_size} beyond the template header, so cold prefills cannot be told from hits"
                )
            elif abs(r.unexplained) > found.tolerance(r.requests):
                problems.append(
                    f"{r.name}: hits {r.hits:,} are no whole number of cold prefills: {r.requests} requests with "
                    f"{r.cold_prefills} cold would hit {p.replica_hits(r.requests, r.cold_prefills):,} "
                    f"(off by {r.unexplained:+,}, allowed ±{found.tolerance(r.requests):,}); "
                    "diagnosis: a cache that was not cold, evictions, or prompts other than the prediction's"
                )
        lines.append(
            f"{run.key.id}: "
            + "; ".join(
                f"{r.name} {r.requests} requests, {r.hits:,} hits = {r.cold_prefills} cold prefill(s)"
                + (f" {r.unexplained:+,}" if r.unexplained else "")
                for r in found.replicas
            )
            + f" (P = {p.group_tokens:,} tokens per group hit, Q = {p.header_block_tokens} header tokens)"
        )
        per_repeat.append(found.as_dict())
        failed.append(len(problems) > known)
    message = "\n".join(lines + [f"- {problem}" for problem in dict.fromkeys(problems)])
    return Verdict("fleet_accounting", [run.key.id], not problems, message, repeat_numbers(per_repeat, failed))


def prefix_locality(run: RunRecord, settings: Settings) -> Verdict:
    """Cold prefills C against the ideal G (one per prefix group) and against what the route promises;
    the routing cost as extra prefill tokens and as a share of what APC saves on one replica. Fails when
    the route broke its promise (round_robin: even spread; consistent_hash with one key: one replica; an
    external fleet: its --apc-fleet-promise), when the routing cost exceeds --apc-max-routing-cost, and
    when the replicas' counters do not hold the benchmark's requests (nothing to tell locality from)."""
    lines: list[str] = []
    problems: list[str] = []
    per_repeat: list[dict[str, Any]] = []
    failed: list[bool] = []
    route = run.key.route
    promise = locality.held_to(run.key, settings.fleet_promise)
    for repeat in run.repeats:
        known = len(problems)
        found = locality.of_repeat(run, repeat)
        if found.requests != found.num_prompts:
            problems.append(
                f"the replicas finished {found.requests} of the benchmark's {found.num_prompts} requests, so where "
                "they landed cannot be told (see fleet_accounting)"
            )
        problems += locality.promise_problems(found, promise)
        problems += locality.cost_problems(found, settings.max_routing_cost)
        cost = found.routing_cost
        lines.append(
            f"{run.key.id}: {found.cold_prefills} cold prefills for {found.ideal} prefix group(s) across "
            f"{len(found.replicas)} replicas (ideal {found.ideal}); hits {found.hits:,} of the "
            f"{found.prediction.expected_hits:,} one server would serve"
            + (
                f"; routing cost {found.extra_prefill_tokens:,} extra prefill tokens = {cost:.1%} of what APC saves"
                if cost is not None
                else ""
            )
        )
        per_repeat.append(found.as_dict())
        failed.append(len(problems) > known)
    lines.append(f"{route}: {locality.promise_text(run.key, promise)}")
    message = "\n".join(lines + [f"- {problem}" for problem in dict.fromkeys(problems)])
    numbers = repeat_numbers(per_repeat, failed) | {
        "promise": promise or None,
        "max_routing_cost": settings.max_routing_cost,
    }
    return Verdict("prefix_locality", [run.key.id], not problems, message, numbers)
