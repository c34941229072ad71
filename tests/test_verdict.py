"""Each verdict fails, with the right diagnosis, when its premise is broken.

The records are built by hand because these premises (a server that reports APC on but never looks up,
preemptions, an undersized KV cache) cannot all be produced on a CPU; the real-vLLM cases are in
test_e2e_cpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_apc import verdicts
from pytest_apc.measure.records import MeasurementError, Repeat, RunRecord
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.workload.cases import RunKey, predict, workload_for

N = 30


def settings(pytester: pytest.Pytester, *args: str):
    from pytest_apc import config

    return config.resolve(pytester.parseconfig("--cpu-node", *args), environ={})


def delta(queries: int, hits: int, preemptions: int = 0) -> Delta:
    return Delta(queries, hits, queries, queries - hits, hits, 0, preemptions, {})


def off_delta(settings_, case: str, header: int = 26) -> Delta:
    """What a healthy OFF server counts: no lookups, every prompt token computed."""
    tokens = N * (workload_for(RunKey(case, 1).family, settings_).prompt_len + header)
    return Delta(0, 0, tokens, tokens, 0, 0, 0, {})


def record(
    settings_,
    case: str,
    concurrency: int,
    d: Delta | None,
    ttft_ms: float,
    *,
    blocks: int = 32768,
    block_size: int = 128,
    header: int = 26,
    error: str | None = None,
) -> RunRecord:
    key = RunKey(case, concurrency)
    workload = workload_for(key.family, settings_)
    tokens = N * (workload.prompt_len + header)
    rng = np.random.default_rng(len(case) + concurrency)
    bench = {
        "completed": N,
        "failed": 0,
        "total_input_tokens": tokens,
        "duration": ttft_ms / 10,
        "median_ttft_ms": ttft_ms,
        "ttfts": list(rng.normal(ttft_ms, ttft_ms * 0.05, N) / 1000),
    }
    info = ServerInfo(
        mode="apc-on" if key.apc else "apc-off",
        command=[],
        url="",
        log="/tmp/x.log",
        block_size=block_size,
        num_gpu_blocks=blocks,
        cache_config={"enable_prefix_caching": str(key.apc)},
    )
    run = RunRecord(key, workload, info, [Repeat(bench, d, error, None, "r.json", "cmd")], header, 1.0)
    run.prediction = predict(workload, header, block_size, tokens)
    return run


def test_healthy_pure_pair_passes(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    tokens = int(off.bench["total_input_tokens"])
    on = record(s, "D", 8, delta(tokens, off.prediction.expected_hits), 40.0)
    pair = verdicts.Pair(off, on, s)
    assert verdicts.cached_tokens_match(on).passed
    assert verdicts.apc_really_off(off).passed
    assert verdicts.prefill_saved(pair).passed
    gain = verdicts.ttft_gain(pair)
    assert gain.passed, gain.message
    assert gain.numbers["ttft_speedup"] == pytest.approx(3.0, rel=0.1)


def test_on_server_that_never_looks_up_is_diagnosed_as_apc_off(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, Delta(0, 0, 1000, 1000, 0, 0, 0, {}), 40.0)
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert "APC is off on the server: it made no prefix-cache lookups" in v.message


def test_off_server_that_hits_is_not_really_off(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, delta(64000, 59000), 40.0)
    v = verdicts.apc_really_off(off)
    assert not v.passed
    assert "the OFF server looked up the prefix cache, so it is not really off" in v.message


def test_preemptions_and_kv_capacity_are_named(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, delta(64263, 20000, preemptions=11), 40.0, blocks=20)
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert "11 preemptions during the run" in v.message
    assert (
        "KV-cache capacity: concurrency 8 x 1 blocks per request + 16 shared prefix blocks held once = 24 blocks > "
        "the server's 20 (evictions)"
    ) in v.message


def test_kv_capacity_counts_the_shared_prefix_once(pytester) -> None:
    """D-c8's 8 requests hold their 16 shared prefix blocks once: 24 blocks fit in 40, so capacity is not named."""
    s = settings(pytester)
    on = record(s, "D", 8, delta(64263, 20000, preemptions=11), 40.0, blocks=40)
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert "11 preemptions during the run" in v.message
    assert "KV-cache capacity" not in v.message


def test_block_size_larger_than_prefix_is_named(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, delta(0, 0), 100.0, block_size=4096)
    on = record(s, "D", 8, delta(64263, 0), 100.0, block_size=4096)
    v = verdicts.ttft_gain(verdicts.Pair(off, on, s))
    assert not v.passed
    assert "block size 4096 is larger than the shared prefix of 2074 tokens" in v.message


def test_prefixes_that_differ_are_the_fallback_diagnosis(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, delta(64263, 1024), 40.0)
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert "the prompts did not share the predicted prefix" in v.message


def test_no_significant_gain_fails_ttft_gain(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, delta(0, 0), 100.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 99.0)
    v = verdicts.ttft_gain(verdicts.Pair(off, on, s))
    assert not v.passed
    assert "the gain is not significant" in v.message
    assert "the cache hit as predicted" in v.message


def test_apc_overhead_beyond_tolerance_fails(pytester) -> None:
    s = settings(pytester, "--apc-set=overhead_tolerance=0.1")
    off = record(s, "A", 8, delta(0, 0), 100.0)
    on = record(s, "B", 8, delta(int(off.bench["total_input_tokens"]), 0), 150.0)
    v = verdicts.not_slower(verdicts.Pair(off, on, s))
    assert not v.passed
    assert "median TTFT is slower with APC by at least" in v.message
    assert "took 50% longer with APC" in v.message


def test_min_bound_fraction_gate(pytester) -> None:
    s = settings(pytester, "--apc-set=min_bound_fraction=0.5")
    off = record(s, "C", 8, delta(0, 0), 100.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 50.0)
    v = verdicts.ttft_gain(verdicts.Pair(off, on, s))
    assert not v.passed  # 2x is not half-way to the 13x bound
    assert "below 50% of the way to the bound" in v.message


def test_gpu_profile_fails_a_significant_but_negligible_gain(pytester) -> None:
    from pytest_apc import config

    s = config.resolve(pytester.parseconfig("--gpu-node", "--apc-model-shape=llama-3.1-8b"), environ={})
    assert s.min_bound_fraction == 0.1
    off = record(s, "C", 8, delta(0, 0), 100.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 90.0)
    v = verdicts.ttft_gain(verdicts.Pair(off, on, s))
    assert v.numbers["ttft_speedup_low"] > 1.0  # significant
    assert not v.passed  # but 1.1x of a bound above 100x is nothing
    assert "below 10% of the way to the bound" in v.message


def test_missing_counters_cannot_verify(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, Delta(None, None, 10, None, None, None, None, {}), 40.0)
    with pytest.raises(MeasurementError, match="has no prefix_cache_queries, prefix_cache_hits counter"):
        verdicts.cached_tokens_match(on)
    broken = record(s, "D", 8, None, 40.0, error="/metrics is not valid Prometheus text")
    with pytest.raises(MeasurementError, match="cannot verify the prefix cache of run D-c8"):
        verdicts.cached_tokens_match(broken)


def test_rag_effect_switches_on_concurrency(pytester) -> None:
    s = settings(pytester, "--apc-set=low_concurrency=1")
    off1, on1 = record(s, "E", 1, delta(0, 0), 80.0), record(s, "F", 1, delta(1, 0), 79.0)
    assert verdicts.rag_effect(verdicts.Pair(off1, on1, s)).name == "ttft_gain"
    off8, on8 = record(s, "E", 8, delta(0, 0), 80.0), record(s, "F", 8, delta(1, 0), 79.0)
    assert verdicts.rag_effect(verdicts.Pair(off8, on8, s)).name == "not_slower"
    # The CPU profile's default (0): not slower at every level.
    assert verdicts.rag_effect(verdicts.Pair(off1, on1, settings(pytester))).name == "not_slower"


def test_pure_effect_switches_on_the_profile_limit(pytester) -> None:
    cpu = settings(pytester)  # the CPU profile, as the GPU's default (all): a significant gain at every level
    gpu = settings(pytester, "--apc-set=pure_gain_concurrency=all")  # every level
    up_to_1 = settings(pytester, "--apc-set=pure_gain_concurrency=1")
    none = settings(pytester, "--apc-set=pure_gain_concurrency=0")
    off2, on2 = record(cpu, "C", 2, off_delta(cpu, "C"), 100.0), record(cpu, "D", 2, delta(1, 0), 100.0)
    assert verdicts.pure_effect(verdicts.Pair(off2, on2, cpu)).name == "ttft_gain"
    assert verdicts.pure_effect(verdicts.Pair(off2, on2, gpu)).name == "ttft_gain"
    assert verdicts.pure_effect(verdicts.Pair(off2, on2, up_to_1)).name == "not_slower"
    assert verdicts.pure_effect(verdicts.Pair(off2, on2, none)).name == "not_slower"
    off4, on4 = record(cpu, "C", 4, off_delta(cpu, "C"), 100.0), record(cpu, "D", 4, delta(1, 0), 100.0)
    assert verdicts.pure_effect(verdicts.Pair(off4, on4, cpu)).name == "ttft_gain"
    assert verdicts.pure_effect(
        verdicts.Pair(off4, on4, settings(pytester, "--apc-set=pure_gain_concurrency=2"))
    ).name == ("not_slower")
    off1, on1 = record(cpu, "C", 1, off_delta(cpu, "C"), 100.0), record(cpu, "D", 1, delta(1, 0), 100.0)
    assert verdicts.pure_effect(verdicts.Pair(off1, on1, cpu)).name == "ttft_gain"
    assert verdicts.pure_effect(verdicts.Pair(off1, on1, up_to_1)).name == "ttft_gain"


def test_the_cpu_profile_fails_a_pure_pair_whose_hits_saved_no_time(pytester) -> None:
    """Hits exact and as predicted, the same median TTFT: no payoff, which the CPU profile judges at every
    level; a gain of a fiftieth of the way to the bound passes."""
    cpu = settings(pytester)
    assert (cpu.pure_gain_concurrency, cpu.min_bound_fraction) == ("all", 0.02)
    off = record(cpu, "C", 1, off_delta(cpu, "C"), 100.0)
    hits = off.prediction.expected_hits
    same = record(cpu, "D", 1, delta(int(off.bench["total_input_tokens"]), hits), 100.0)
    v = verdicts.pure_effect(verdicts.Pair(off, same, cpu))
    assert (v.name, v.passed) == ("ttft_gain", False), v.message
    assert "diagnosis: the cache hit as predicted" in v.message
    faster = record(cpu, "D", 1, delta(int(off.bench["total_input_tokens"]), hits), 25.0)
    assert verdicts.pure_effect(verdicts.Pair(off, faster, cpu)).passed
    # Significant, but short of a fiftieth of the way to the bound: diagnosed the same way.
    slight = record(cpu, "D", 1, delta(int(off.bench["total_input_tokens"]), hits), 90.0)
    v = verdicts.pure_effect(verdicts.Pair(off, slight, cpu))
    assert v.numbers["ttft_speedup_low"] > 1.0, v.message
    assert not v.passed
    assert "of the way to the bound" in v.message
    assert "diagnosis: the cache hit as predicted" in v.message


def test_same_as_default_fails_on_other_hits_and_slowness(pytester) -> None:
    s = settings(pytester, "--apc-set=overhead_tolerance=0.1")
    default = record(s, "D", 8, delta(64263, 59392), 40.0)
    algo = record(s, "D", 8, delta(64263, 58368), 80.0)
    algo.key = RunKey("D", 8, "xxhash")
    v = verdicts.same_as_default(algo, default, s)
    assert not v.passed
    assert "cached tokens 58,368 differ from the default's 59,392" in v.message
    assert "median TTFT is slower than the default by at least" in v.message
    assert "the run took 100% longer than with the default (tolerance 10%)" in v.message
    assert verdicts.same_as_default(default, default, s).passed


def test_a_warm_cache_is_too_many_hits(pytester) -> None:
    """N x the shared prefix instead of (N-1) x: every request hit, the first one too. At CPU scale one
    request's share (2,048) is less than one block per request (3,712), so only the asymmetric window
    catches it."""
    s = settings(pytester)
    tokens = int(record(s, "D", 8, None, 40.0).bench["total_input_tokens"])
    cold = record(s, "D", 8, delta(tokens, 59392), 40.0)
    assert cold.prediction.tolerance_above == 1024  # half of one request's 16 shared blocks of 128
    assert verdicts.cached_tokens_match(cold).passed
    warm = record(s, "D", 8, delta(tokens, 59392 + 2048), 40.0)
    v = verdicts.cached_tokens_match(warm)
    assert not v.passed
    assert "hits 61,440 are not within -3,712/+1,024 of the predicted 59,392" in v.message
    assert "diagnosis: the cache was warm: 61,440 is about N x 2,048" in v.message
    chance = record(s, "D", 8, delta(tokens, 59392 + 128), 40.0)  # one suffix block shared by chance
    assert verdicts.cached_tokens_match(chance).passed
    more = verdicts.cached_tokens_match(record(s, "D", 8, delta(tokens, 59392 + 3328), 40.0))  # beyond warm
    assert not more.passed
    assert "diagnosis: the prompts shared more than the predicted prefix" in more.message


def test_no_hits_fail_even_within_one_block_per_request(pytester) -> None:
    """With one shared block per request, the lower tolerance equals the whole prediction: zero must still fail."""
    s = settings(pytester)
    tokens = int(record(s, "D", 8, None, 40.0).bench["total_input_tokens"])
    on = record(s, "D", 8, delta(tokens, 0), 40.0, block_size=2048)
    assert on.prediction.expected_hits == on.prediction.tolerance == 29 * 2048
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert "no cached tokens at all, where the prediction expects some" in v.message
    assert "diagnosis:" in v.message


def test_runs_with_other_prompts_or_servers_are_not_comparable(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), 59392), 40.0)
    assert verdicts.not_comparable(off, on) == []
    on.repeats[0].bench["total_input_tokens"] += 5
    on.server.version, off.server.version = "0.32.0", "0.26.0"
    off.server.cache_config.update(cache_dtype="auto", num_gpu_blocks="58546")
    on.server.cache_config.update(cache_dtype="fp8", num_gpu_blocks="58576")  # blocks: measured, may differ
    problems = verdicts.not_comparable(off, on)
    assert problems[0].startswith("the benchmark sent other prompts: total input tokens [64140] vs [64145]")
    assert problems[1] == "vLLM version 0.26.0 on apc-off vs 0.32.0 on apc-on"
    assert problems[2:] == ["cache config cache_dtype=auto on apc-off vs fp8 on apc-on"]


def test_prefill_cost_fit_is_non_negative_least_squares_not_clipping() -> None:
    """Data whose unconstrained fit has a < 0: clipping a to 0 keeps the wrong b; the NNLS fit refits b."""
    from pytest_apc.verdicts.stats import fit_prefill_cost, prefill_cost_residual

    lengths, seconds = [1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 4.0, 9.0]  # (L-1)^2: unconstrained a = -0.95 < 0
    x, y = np.asarray(lengths), np.asarray(seconds)
    (a_free, b_free), *_ = np.linalg.lstsq(np.stack([x, x * x], axis=1), y, rcond=None)
    assert a_free < 0 < b_free
    clipped = (max(float(a_free), 0.0), max(float(b_free), 0.0))  # what the fit used to return

    fit = fit_prefill_cost(lengths, seconds)
    assert fit is not None
    assert min(fit) >= 0
    assert prefill_cost_residual(fit, lengths, seconds) < prefill_cost_residual(clipped, lengths, seconds) - 1
    assert fit != pytest.approx(clipped)

    # The optimum over a >= 0, b >= 0, brute force on a fine grid, and in closed form (a = 0, b = <L^2,T>/<L^4>).
    a_grid, b_grid = np.meshgrid(np.linspace(0, 2, 801), np.linspace(0, 2, 801), indexing="ij")
    grid = ((y - a_grid[..., None] * x - b_grid[..., None] * x * x) ** 2).sum(axis=-1)
    i, j = np.unravel_index(np.argmin(grid), grid.shape)
    assert prefill_cost_residual(fit, lengths, seconds) <= grid[i, j] + 1e-12
    assert fit == pytest.approx((a_grid[i, j], b_grid[i, j]), abs=2 / 800)
    assert fit == pytest.approx((0.0, float(np.sum(x**2 * y) / np.sum(x**4))))


def test_every_repeat_reaches_the_numbers_and_the_first_failure_leads(pytester) -> None:
    """With --apc-repeats 2, a first repeat that failed is kept next to a second one that passed."""
    import dataclasses

    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    tokens = int(off.bench["total_input_tokens"])
    looked_up = dataclasses.replace(off.repeats[0], delta=delta(tokens, 0))  # an OFF server that queried
    off = dataclasses.replace(off, repeats=[looked_up, off.repeats[0]])
    v = verdicts.apc_really_off(off)
    assert not v.passed
    assert [r["queries"] for r in v.numbers["repeats"]] == [tokens, 0]
    assert v.numbers["queries"] == tokens  # the failed repeat, not the last one

    on = record(s, "D", 8, delta(tokens, off.prediction.expected_hits), 40.0)
    short = dataclasses.replace(on.repeats[0], delta=delta(tokens, on.prediction.expected_hits // 2))
    on = dataclasses.replace(on, repeats=[short, on.repeats[0]])
    v = verdicts.cached_tokens_match(on)
    assert not v.passed
    assert [r["hits"] for r in v.numbers["repeats"]] == [on.prediction.expected_hits // 2, on.prediction.expected_hits]
    assert v.numbers["hits"] == on.prediction.expected_hits // 2
    assert v.numbers["expected_hits"] == on.prediction.expected_hits

    healthy = dataclasses.replace(on, repeats=[on.repeats[1], on.repeats[1]])
    v = verdicts.cached_tokens_match(healthy)
    assert v.passed
    assert len(v.numbers["repeats"]) == 2
    assert v.numbers["hits"] == on.prediction.expected_hits


def test_a_timing_verdict_owns_the_rule_it_held_the_pair_to(pytester) -> None:
    """The rule that applied is the verdict's own value (``held_to``), in results.json too; a verdict that does
    not pass or fail on timing alone has none, and a file written before verdicts carried it reads the rule
    from the verdict's name."""
    from pytest_apc.verdicts.verdict import FASTER, NOT_SLOWER, found, held_to

    s = settings(pytester, "--apc-set=low_concurrency=1")
    off1, on1 = record(s, "E", 1, delta(0, 0), 80.0), record(s, "F", 1, delta(1, 0), 40.0)
    off8, on8 = record(s, "E", 8, delta(0, 0), 80.0), record(s, "F", 8, delta(1, 0), 79.0)
    low, high = verdicts.rag_effect(verdicts.Pair(off1, on1, s)), verdicts.rag_effect(verdicts.Pair(off8, on8, s))
    assert (low.held_to, high.held_to) == (FASTER, NOT_SLOWER)
    assert (low.to_json()["held_to"], high.to_json()["held_to"]) == ("faster", "not slower")
    assert verdicts.apc_really_off(off8).held_to is None
    assert "held_to" not in verdicts.apc_really_off(off8).to_json()
    for v in (low, high):
        older = {k: x for k, x in v.to_json().items() if k != "held_to"}
        assert held_to(older) == v.held_to
    assert held_to(verdicts.apc_really_off(off8).to_json()) is None
    assert [found(FASTER, True), found(FASTER, False), found(NOT_SLOWER, True), found(NOT_SLOWER, False)] == [
        "faster", "not faster", "not slower", "slower"
    ]  # fmt: skip
