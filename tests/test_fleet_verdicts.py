"""fleet_accounting and prefix_locality on hand-built fleet runs: the numbers of a real two-replica CPU
run pass, and each broken premise (retried or dropped requests, hits that are no whole cold prefills,
missing per-replica counters, a route that broke its promise) fails with the numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_apc import verdicts
from pytest_apc.measure.records import MeasurementError, Repeat, RunRecord
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.workload.cases import RunKey, predict, workload_for

N = 30
HEADER = 26  # the tiny model's chat template header
BLOCK = 128
# The real CPU run: P = floor((26 + 2048) / 128) x 128 = 2048, Q = 0; 15 requests hit 14 x 2048.
P = 2048
HALF = 14 * P  # 28,672


def settings(pytester: pytest.Pytester):
    from pytest_apc import config

    return config.resolve(pytester.parseconfig("--cpu-node"), environ={})


def part(requests: int | None, hits: int, per_request: int) -> Delta:
    queries = (requests or 0) * per_request
    return Delta(queries, hits, queries, queries - hits, hits, 0, 0, {}, requests=requests)


def fleet_run(
    s,
    route: str,
    spread: list[tuple[int | None, int]],
    *,
    groups: int = 1,
    header: int = HEADER,
    block_size: int = BLOCK,
    sent: int = N,
) -> RunRecord:
    """A fleet run whose replica i served spread[i] = (requests, hits); the benchmark sent ``sent``."""
    key = RunKey("R", 8, route=route)
    workload = replace(workload_for("fleet", s), prefix_groups=groups)
    per_request = workload.prompt_len + header
    tokens = sent * per_request
    parts = {f"replica {i + 1}": part(k, hits, per_request) for i, (k, hits) in enumerate(spread)}
    total = Delta(
        sum(d.prefix_cache_queries or 0 for d in parts.values()),
        sum(d.prefix_cache_hits or 0 for d in parts.values()),
        sum(d.prompt_tokens or 0 for d in parts.values()),
        sum(d.computed_tokens or 0 for d in parts.values()),
        sum(d.cached_tokens or 0 for d in parts.values()),
        0,
        0,
        {},
        requests=sum(d.requests or 0 for d in parts.values()),
    )
    bench = {"completed": sent, "failed": 0, "total_input_tokens": tokens, "duration": 1.0, "median_ttft_ms": 10.0}
    info = ServerInfo(
        mode=key.mode.name, command=[], url="", log="/tmp/x.log", block_size=block_size, num_gpu_blocks=32768,
        cache_config={"enable_prefix_caching": "True", "block_size": str(block_size)},
    )  # fmt: skip
    repeat = Repeat(bench, total, None, "reset", "r.json", "cmd", parts, "vllm-router ...")
    run = RunRecord(key, workload, info, [repeat], header, 1.0)
    run.prediction = predict(workload, header, block_size, tokens)
    return run


def test_the_real_cpu_runs_pass_with_their_numbers(pytester) -> None:
    s = settings(pytester)
    robin = fleet_run(s, "round_robin", [(15, HALF), (15, HALF)])
    accounting = verdicts.fleet_accounting(robin)
    assert accounting.passed, accounting.message
    assert "replica 1 15 requests, 28,672 hits = 1 cold prefill(s); replica 2 15 requests, 28,672 hits" in (
        accounting.message
    )
    locality = verdicts.prefix_locality(robin, s)
    assert locality.passed, locality.message
    n = locality.numbers
    assert (n["requests"], n["hits"], n["cold_prefills"], n["ideal_cold_prefills"]) == (30, 2 * HALF, 2, 1)
    assert n["ideal_hits"] == 29 * P == 59_392
    assert n["extra_prefill_tokens"] == P
    assert n["routing_cost"] == pytest.approx(2048 / 59_392)
    assert [r["cold_prefills"] for r in n["replicas"]] == [1, 1]
    assert "2 cold prefills for 1 prefix group(s) across 2 replicas" in locality.message
    assert "routing cost 2,048 extra prefill tokens = 3.4% of what APC saves" in locality.message

    consistent = fleet_run(s, "consistent_hash", [(30, 29 * P), (0, 0)])
    assert verdicts.fleet_accounting(consistent).passed
    locality = verdicts.prefix_locality(consistent, s)
    assert locality.passed, locality.message
    n = locality.numbers
    assert (n["cold_prefills"], n["extra_prefill_tokens"], n["routing_cost"]) == (1, 0, 0.0)
    assert [(r["requests"], r["cold_prefills"]) for r in n["replicas"]] == [(30, 1), (0, 0)]


@pytest.mark.parametrize(
    ("spread", "what"),
    [
        ([(16, 15 * P), (15, HALF)], "the replicas finished 31 requests for the benchmark's 30: the router retried "
                                     "or duplicated requests"),
        ([(15, HALF), (14, 13 * P)], "the replicas finished 29 requests for the benchmark's 30: the router dropped "
                                     "requests"),
    ],
)  # fmt: skip
def test_requests_that_do_not_add_up_fail_the_accounting(pytester, spread, what: str) -> None:
    v = verdicts.fleet_accounting(fleet_run(settings(pytester), "round_robin", spread))
    assert not v.passed
    assert what in v.message
    assert "the replicas looked up" in v.message  # their prompt tokens do not add up either


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (8 * BLOCK, "off by +1,024, allowed ±1,023"),  # 8 blocks: half a group's worth
        (-8 * BLOCK, "off by -1,024, allowed ±1,023"),
        (P, "off by +2,048"),  # a warm replica: all 15 requests hit the prefix, the first one too
    ],
)
def test_hits_that_are_no_whole_cold_prefills_fail_the_accounting(pytester, extra: int, why: str) -> None:
    run = fleet_run(settings(pytester), "round_robin", [(15, HALF + extra), (15, HALF)])
    v = verdicts.fleet_accounting(run)
    assert not v.passed
    assert f"replica 1: hits {HALF + extra:,} are no whole number of cold prefills: 15 requests with 1 cold" in (
        v.message
    )
    assert why in v.message
    assert "a cache that was not cold, evictions, or prompts other than the prediction's" in v.message
    assert "replica 2:" not in v.message.split("\n- ", 1)[1]  # replica 2 is fine
    assert v.numbers["replicas"][0]["unexplained"] == extra


def test_a_few_blocks_of_tokenisation_noise_are_tolerated(pytester) -> None:
    """Within a block per request and under half a group (min(15 x 128, 2048/2 - 1) = 1,023 tokens), hits
    are still whole cold prefills: chance matches of a few suffix blocks (700 tokens included) pass."""
    s = settings(pytester)
    for extra in (5 * BLOCK, 700, -3 * BLOCK):
        v = verdicts.fleet_accounting(fleet_run(s, "round_robin", [(15, HALF + extra), (15, HALF)]))
        assert v.passed, v.message
        assert f"= 1 cold prefill(s) {extra:+,}" in v.message


def test_missing_per_replica_counters_cannot_be_accounted(pytester) -> None:
    s = settings(pytester)
    run = fleet_run(s, "round_robin", [(15, HALF), (15, HALF)])
    run.repeats[0].parts = {}
    for check in (verdicts.fleet_accounting, lambda r: verdicts.prefix_locality(r, s)):
        with pytest.raises(MeasurementError, match="its counters came from one source, not per replica"):
            check(run)


def test_a_replica_without_the_requests_counter_cannot_be_accounted(pytester) -> None:
    s = settings(pytester)
    run = fleet_run(s, "round_robin", [(15, HALF), (None, HALF)])
    for check in (verdicts.fleet_accounting, lambda r: verdicts.prefix_locality(r, s)):
        with pytest.raises(
            MeasurementError, match="replica 2 has no vllm:request_success_total counter, so the requests it served"
        ):
            check(run)


def test_a_run_without_a_prediction_or_counters_cannot_be_accounted(pytester) -> None:
    run = fleet_run(settings(pytester), "round_robin", [(15, HALF), (15, HALF)])
    run.prediction = None
    with pytest.raises(MeasurementError, match="cannot account for the fleet run R-c8-round_robin: no prediction"):
        verdicts.fleet_accounting(run)
    run = fleet_run(settings(pytester), "round_robin", [(15, HALF), (15, HALF)])
    run.repeats[0].metrics_error = "GET /metrics answered HTTP 500"
    with pytest.raises(MeasurementError, match="cannot verify the prefix cache of run R-c8-round_robin: GET /metrics"):
        verdicts.fleet_accounting(run)


def test_a_prefix_within_the_header_blocks_cannot_tell_cold_prefills(pytester) -> None:
    # Block 4096 > S = 2074: no block is shared at all (P = Q = 0).
    run = fleet_run(settings(pytester), "round_robin", [(15, 0), (15, 0)], block_size=4096)
    v = verdicts.fleet_accounting(run)
    assert not v.passed
    assert "spans no block of 4096 beyond the template header, so cold prefills cannot be told from hits" in v.message


def test_round_robin_must_spread_evenly(pytester) -> None:
    s = settings(pytester)
    uneven = fleet_run(s, "round_robin", [(20, 19 * P), (10, 9 * P)])
    assert verdicts.fleet_accounting(uneven).passed  # the books balance ...
    v = verdicts.prefix_locality(uneven, s)
    assert not v.passed  # ... but the route broke its promise
    assert "round_robin must spread requests evenly, but the replicas served [20, 10]" in v.message
    assert "round_robin: requests spread evenly: replicas differ by at most one request" in v.message
    assert verdicts.prefix_locality(fleet_run(s, "round_robin", [(16, 15 * P), (14, 13 * P)]), s).passed is False
    # Odd splits differ by one at most.
    three = fleet_run(s, "round_robin", [(10, 9 * P), (10, 9 * P), (10, 9 * P)])
    assert verdicts.prefix_locality(three, s).passed


def test_consistent_hash_with_one_key_must_keep_one_replica(pytester) -> None:
    s = settings(pytester)
    v = verdicts.prefix_locality(fleet_run(s, "consistent_hash", [(15, HALF), (15, HALF)]), s)
    assert not v.passed
    assert "consistent_hash with one routing key must use one replica, but requests spread as [15, 15]" in v.message
    assert v.numbers["cold_prefills"] == 2
    assert verdicts.prefix_locality(fleet_run(s, "consistent_hash", [(0, 0), (30, 29 * P)]), s).passed


@pytest.mark.parametrize("route", ["cache_aware", "dp", "external", "power_of_two"])
@pytest.mark.parametrize("spread", [[(30, 29 * P), (0, 0)], [(15, HALF), (15, HALF)], [(20, 19 * P), (10, 9 * P)]])
def test_routes_without_a_promise_pass_with_any_spread_and_report_the_cost(pytester, route, spread) -> None:
    s = settings(pytester)
    v = verdicts.prefix_locality(fleet_run(s, route, spread), s)
    assert v.passed, v.message
    active = sum(1 for k, _ in spread if k)
    assert v.numbers["cold_prefills"] == active
    assert v.numbers["extra_prefill_tokens"] == (active - 1) * P
    assert "no fixed outcome" in v.message


def test_prefix_groups_and_a_header_block_replica_by_replica(pytester) -> None:
    """3 groups, header 300 (Q = 256), P = 2304: round_robin puts every group on both replicas (3 cold
    prefills each); the books balance and the routing cost is 3 x (P - Q)."""
    s = settings(pytester)
    p = predict(replace(workload_for("fleet", s), prefix_groups=3), 300, BLOCK, 0)
    assert (p.group_tokens, p.header_block_tokens) == (2304, 256)
    each = p.replica_hits(15, 3)
    assert each == 12 * 2304 + 2 * 256
    robin = fleet_run(s, "round_robin", [(15, each), (15, each)], groups=3, header=300)
    accounting = verdicts.fleet_accounting(robin)
    assert accounting.passed, accounting.message
    assert "(P = 2,304 tokens per group hit, Q = 256 header tokens)" in accounting.message
    locality = verdicts.prefix_locality(robin, s)
    assert locality.passed, locality.message
    assert (locality.numbers["cold_prefills"], locality.numbers["ideal_cold_prefills"]) == (6, 3)
    # Three split groups, and the header replica 2 computes again: exactly what one server would not.
    assert locality.numbers["extra_prefill_tokens"] == 3 * (2304 - 256) + 256
    assert locality.numbers["ideal_hits"] == 27 * 2304 + 2 * 256
    assert locality.numbers["extra_prefill_tokens"] == locality.numbers["ideal_hits"] - locality.numbers["hits"]
    # All on one replica: exactly the single-server prediction, no routing cost.
    one = fleet_run(s, "consistent_hash", [(30, p.expected_hits), (0, 0)], groups=3, header=300)
    assert verdicts.fleet_accounting(one).passed
    assert verdicts.prefix_locality(one, s).numbers["extra_prefill_tokens"] == 0
    # Groups kept apart (group 1 on replica 1, groups 2 and 3 on replica 2): 3 cold prefills, the ideal.
    apart = fleet_run(
        s, "cache_aware", [(10, p.replica_hits(10, 1)), (20, p.replica_hits(20, 2))], groups=3, header=300
    )
    assert verdicts.fleet_accounting(apart).passed
    assert verdicts.prefix_locality(apart, s).numbers["cold_prefills"] == 3


def test_locality_is_not_judged_on_counters_that_missed_the_requests(pytester) -> None:
    """Replicas whose counters saw none of the benchmark's requests (an external fleet's --apc-metrics-url
    at servers its gateway does not route to) have no locality to pass: not 0 cold prefills at a negative
    routing cost."""
    s = settings(pytester)
    for route in ("external", "round_robin", "consistent_hash"):
        v = verdicts.prefix_locality(fleet_run(s, route, [(0, 0), (0, 0)]), s)
        assert not v.passed, v.message
        assert "the replicas finished 0 of the benchmark's 30 requests" in v.message
    assert not verdicts.prefix_locality(fleet_run(s, "cache_aware", [(20, 19 * P), (9, 8 * P)]), s).passed


def test_the_failing_repeat_is_the_one_shown(pytester) -> None:
    s = settings(pytester)
    run = fleet_run(s, "round_robin", [(15, HALF), (15, HALF)])
    bad = fleet_run(s, "round_robin", [(20, 19 * P), (10, 9 * P)])
    run.repeats.append(bad.repeats[0])
    v = verdicts.prefix_locality(run, s)
    assert not v.passed
    assert [r["requests"] for r in v.numbers["replicas"]] == [20, 10]
    assert len(v.numbers["repeats"]) == 2


# -- an external fleet's promise (--apc-set fleet_promise) and the routing-cost bound (--apc-set max_routing_cost) ---


def gateway(pytester, *args: str):
    """The settings of an external fleet of two replicas behind a gateway labelled gke_gw."""
    from pytest_apc import config

    fleet = ("--apc-fleet-url=http://gw", "--apc-metrics-url=http://r1", "--apc-metrics-url=http://r2")
    return config.resolve(pytester.parseconfig("--cpu-node", *fleet, "--apc-set=route_label=gke_gw", *args), environ={})


def test_a_gateway_that_promises_spread_must_leave_no_replica_idle(pytester) -> None:
    s = gateway(pytester, "--apc-set=fleet_promise=spread")
    v = verdicts.prefix_locality(fleet_run(s, "gke_gw", [(30, 29 * P), (0, 0)]), s)
    assert not v.passed
    assert "spread: no replica may be left idle, but replica 2 served none of the 30 requests (requests per " in (
        v.message
    )
    assert "(requests per replica: replica 1 30, replica 2 0)" in v.message
    assert (
        "gke_gw: spread (--apc-set fleet_promise): requests spread over the replicas: no replica left idle" in v.message
    )
    assert v.numbers["promise"] == "spread"
    # Uneven is still spread: the promise is no idle replica, not round robin's evenness.
    kept = verdicts.prefix_locality(fleet_run(s, "gke_gw", [(20, 19 * P), (10, 9 * P)]), s)
    assert kept.passed, kept.message


def test_a_gateway_that_promises_affinity_must_keep_every_group_on_one_replica(pytester) -> None:
    s = gateway(pytester, "--apc-set=fleet_promise=affinity")
    each = predict(replace(workload_for("fleet", s), prefix_groups=3), HEADER, BLOCK, 0).replica_hits(15, 3)
    split = fleet_run(s, "gke_gw", [(15, each), (15, each)], groups=3)
    assert verdicts.fleet_accounting(split).passed
    v = verdicts.prefix_locality(split, s)
    assert not v.passed
    assert (
        "affinity: every prefix group must stay on one replica, but 6 cold prefills were computed for 3 prefix "
        "group(s): 3 more than one per group, so groups were split across replicas; cold prefills per replica: "
        "replica 1 3 (15 requests), replica 2 3 (15 requests)"
    ) in v.message
    assert "gke_gw: affinity (--apc-set fleet_promise): every prefix group on one replica" in v.message
    # Groups kept apart: group 1 on replica 1, groups 2 and 3 on replica 2 (load need not be even).
    p = predict(replace(workload_for("fleet", s), prefix_groups=3), HEADER, BLOCK, 0)
    apart = fleet_run(s, "gke_gw", [(10, p.replica_hits(10, 1)), (20, p.replica_hits(20, 2))], groups=3)
    kept = verdicts.prefix_locality(apart, s)
    assert kept.passed, kept.message
    assert kept.numbers["cold_prefills"] == 3


def test_the_gateway_promise_holds_the_external_route_only(pytester) -> None:
    """A router policy keeps its own promise whatever --apc-set fleet_promise says; cache_aware has none."""
    s = replace(settings(pytester), fleet_promise="affinity")
    assert verdicts.prefix_locality(fleet_run(s, "cache_aware", [(15, HALF), (15, HALF)]), s).passed
    robin = verdicts.prefix_locality(fleet_run(s, "round_robin", [(15, HALF), (15, HALF)]), s)
    assert robin.passed, robin.message
    assert "affinity" not in robin.message


@pytest.mark.parametrize("route", ["round_robin", "cache_aware", "dp", "gke_gw"])
def test_the_routing_cost_bound_fails_a_run_above_it_on_every_route(pytester, route: str) -> None:
    """Round robin's split of one group over two replicas costs P of (N - 1) x P: 1/29 = 3.45 %."""
    spread = [(15, HALF), (15, HALF)]
    above = gateway(pytester, "--apc-set=max_routing_cost=3.4")
    v = verdicts.prefix_locality(fleet_run(above, route, spread), above)
    assert not v.passed
    assert (
        "routing cost 3.45% is above --apc-set max_routing_cost=3.4%: 2,048 extra prefill tokens of the 59,392 APC "
        "saves on one server (2 cold prefills for 1 prefix group(s))"
    ) in v.message
    assert v.numbers["max_routing_cost"] == 3.4
    within = gateway(pytester, "--apc-set=max_routing_cost=3.5")
    kept = verdicts.prefix_locality(fleet_run(within, route, spread), within)
    assert kept.passed, kept.message
    unset = settings(pytester)
    assert unset.max_routing_cost is None
    assert verdicts.prefix_locality(fleet_run(unset, route, spread), unset).passed


def test_a_routing_cost_bound_that_cannot_be_checked_fails(pytester) -> None:
    s = gateway(pytester, "--apc-set=max_routing_cost=50")
    v = verdicts.prefix_locality(fleet_run(s, "gke_gw", [(15, 0), (15, 0)], block_size=4096), s)
    assert not v.passed
    assert "the routing cost cannot be told" in v.message
    assert "--apc-set max_routing_cost=50% cannot be checked" in v.message
