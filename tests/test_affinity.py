"""Case M behind a router: the routing told from every replica's counters (workload/affinity.py) and the
conversation_affinity verdict. Token ids and counters are made up; the real-vLLM run is
tests/test_e2e_fleet.py."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pytest_apc.measure.multiturn import prediction
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.verdicts import conversation_affinity
from pytest_apc.workload import affinity
from pytest_apc.workload.cases import RunKey, ServerMode, Workload
from pytest_apc.workload.multiturn import TurnRecord, cached_tokens, predict_rounds
from tests.test_multiturn import B, conv, rounds_of

NAMES = ["replica 1", "replica 2"]
ROUNDS = rounds_of(conv(conversations=4, turns=3))


def counters(rounds: Sequence[Sequence[Sequence[int]]], routing: Sequence[Sequence[int]]) -> tuple[list, list]:
    """Every replica's requests and hits per round when round t's conversation c went to routing[t][c]
    (requests sent in order, each replica's cache keeping everything it prefilled)."""
    seen: list[list[Sequence[int]]] = [[] for _ in NAMES]
    requests, hits = [], []
    for t, where in enumerate(routing):
        n, h = [0] * len(NAMES), [0] * len(NAMES)
        for c, r in enumerate(where):
            n[r] += 1
            h[r] += cached_tokens(rounds[t][c], seen[r], B)
            seen[r].append(rounds[t][c])
        requests.append(n)
        hits.append(h)
    return requests, hits


def test_a_constant_routing_is_found_and_predicts_every_replica_exactly() -> None:
    routing = [[0, 1, 0, 1]] * 3
    requests, hits = counters(ROUNDS, routing)
    found = affinity.explain(ROUNDS, B, NAMES, requests, hits)
    assert found.found
    assert found.constant
    assert found.moves == 0
    for t in range(3):
        assert [found.predicted[t][n] for n in NAMES] == hits[t]
        assert sorted(len(found.held[t][n]) for n in NAMES) == [2, 2]
    # Each replica's first conversation computes the global prefix: one server would have hit it once more.
    one_server = predict_rounds(ROUNDS, B)
    assert sum(hits[0]) < sum(one_server[0])
    assert [sum(h) for h in hits[1:]] == [sum(p) for p in one_server[1:]]


def test_a_conversation_that_moved_is_found_with_its_move() -> None:
    routing = [[0, 1, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1]]  # conversations 1 and 2 swap replicas in turn 2
    requests, hits = counters(ROUNDS, routing)
    found = affinity.explain(ROUNDS, B, NAMES, requests, hits)
    assert found.found
    assert not found.constant
    assert found.moves == 2
    assert found.moved[:2] == [[], []]
    assert len(found.moved[2]) == 2
    assert [found.predicted[2][n] for n in NAMES] == hits[2]


def test_hits_that_no_routing_explains_are_not_explained() -> None:
    requests, hits = counters(ROUNDS, [[0, 1, 0, 1]] * 3)
    hits[2][0] += B  # a block more than any routing can give
    found = affinity.explain(ROUNDS, B, NAMES, requests, hits)
    assert not found.found
    assert found.exhaustive


def test_too_many_conversations_for_the_search_are_said_to_be_bounded() -> None:
    rounds = rounds_of(conv(conversations=17, turns=2))
    found = affinity.explain(rounds, B, NAMES, [[9, 8]] * 2, [[0, 0]] * 2)
    assert not found.found
    assert not found.exhaustive


def record(route: str, routing: Sequence[Sequence[int]], *, hits_delta: int = 0, lost: int = 0) -> RunRecord:
    """A case M run behind the router whose counters are what ``routing`` gives (``hits_delta`` added to the
    fleet's total of the last round, ``lost`` requests missing from replica 1's count there)."""
    from pytest_apc.measure.multiturn import locate

    key = RunKey("M", 8, route=route)
    assert key.mode == ServerMode(True, fleet="router")
    info = ServerInfo(key.mode.name, [], "", "", block_size=B)
    requests, hits = counters(ROUNDS, routing)
    one_server = predict_rounds(ROUNDS, B)
    turns = [
        TurnRecord(0, t, False, [len(x) for x in ROUNDS[t]], one_server[t], sum(hits[t]), 100, [1.0] * 4)
        for t in range(3)
    ]
    deltas = [
        {n: Delta(100, hits[t][r], 0, 0, 0, 0, 0, {}, requests=requests[t][r]) for r, n in enumerate(NAMES)}
        for t in range(3)
    ]
    locate(turns, deltas, ROUNDS, B)
    turns[-1].hits = (turns[-1].hits or 0) + hits_delta
    assert turns[-1].replica_requests is not None
    turns[-1].replica_requests["replica 1"] -= lost
    bench = {"completed": 4, "failed": 0, "total_input_tokens": 10, "duration": 1.0, "ttfts": [0.1]}
    repeat = Repeat(bench, Delta(100, 0, 0, 0, 0, 0, 0, {}, requests=12), None, None, "", "")
    run = RunRecord(key, Workload("multiturn", 20, 40, 4, 4, 0), info, [repeat], 0, 1)
    run.turns = turns
    run.prediction = prediction(ROUNDS, one_server, B, 24)
    return run


def test_consistent_hash_passes_with_one_cold_prefill_per_conversation() -> None:
    v = conversation_affinity(record("consistent_hash", [[0, 1, 1, 0]] * 3))
    assert v.passed, v.message
    (rep,) = v.numbers["repeats"]
    assert rep["cold_prefills"] == 4
    assert rep["moved"] == 0
    held = rep["held"]
    assert sorted(len(held[n]) for n in NAMES) == [2, 2]
    assert "replica 1: conversations " + ",".join(map(str, held["replica 1"])) in v.message
    # Conversations whose turns hit alike cannot be told apart: the held ones are one of the routings.
    assert rep["alternatives"] >= 0


def test_consistent_hash_fails_when_a_conversation_moved_and_round_robin_reports_it() -> None:
    routing = [[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]]  # every turn away from the previous one
    v = conversation_affinity(record("consistent_hash", routing))
    assert not v.passed
    assert "landed away from their history" in v.message
    (rep,) = v.numbers["repeats"]
    assert rep["cold_prefills"] == 4 + rep["moved"]
    assert rep["moved"] == 8
    rr = conversation_affinity(record("round_robin", routing))
    assert rr.passed, rr.message  # no promise of affinity; the round is spread evenly
    assert "8 caused by routing" in rr.message


def test_counters_that_do_not_add_up_fail_every_route() -> None:
    v = conversation_affinity(record("round_robin", [[0, 1, 0, 1]] * 3, hits_delta=B))
    assert not v.passed
    assert "do not add up" in v.message
    v = conversation_affinity(record("round_robin", [[0, 1, 0, 1]] * 3, lost=1))
    assert not v.passed
    assert "finished 3 requests" in v.message
    lopsided = conversation_affinity(record("round_robin", [[0, 0, 0, 1]] * 3))
    assert not lopsided.passed
    assert "spread the round evenly" in lopsided.message


def test_run_ids_of_case_m_behind_the_router() -> None:
    key = RunKey.parse("M-c8-consistent_hash")
    assert key == RunKey("M", 8, route="consistent_hash")
    assert key.id == "M-c8-consistent_hash"
    assert key.mode == ServerMode(True, fleet="router")
    assert RunKey("R", 8, route="round_robin").mode == key.mode  # the same replicas as case R
    assert RunKey.parse("M-c8").mode == ServerMode(True)


def test_case_m_behind_the_router_runs_once_per_policy_at_the_highest_level() -> None:
    from pytest_apc.workload.plan import TestUse, parametrization, unused_settings
    from tests.conftest import default_settings

    s = default_settings(multiturn_concurrency=(1, 4), router_policies=("round_robin", "consistent_hash"))
    params = parametrization("M", {"fleet": True}, s)
    assert [p.run_id for p in params] == ["M-c4-round_robin", "M-c4-consistent_hash"]
    assert all(p.skip is None for p in params)
    assert {RunKey.parse(p.run_id).mode for p in params} == {RunKey("R", 8, route="round_robin").mode}
    (none,) = parametrization("M", {"fleet": True}, default_settings(router_policies=()))
    assert none.skip is not None
    assert "--apc-set router_policies" in none.skip
    # A router policy given explicitly is used by case M behind the router alone: no "unused" message.
    given = default_settings(router_policies=("consistent_hash",))
    given.sources["router_policies"] = "option --apc-set"
    use = TestUse((RunKey("M", 8, route="consistent_hash"),), markers=frozenset({"fleet"}))
    assert unused_settings(given, [use], [], [], "-m fleet", ["fleet", "multiturn"]) == []


def test_the_conversation_id_is_the_request_id_and_no_session_header_is_sent(tmp_path) -> None:
    from types import SimpleNamespace

    from pytest_apc.measure.bench import bench_args
    from pytest_apc.measure.bench_worker import chat_samples
    from pytest_apc.measure.multiturn import conversation_id
    from pytest_apc.workload.cases import workload_for
    from tests.conftest import default_settings

    key = RunKey("M", 8, route="consistent_hash")
    assert conversation_id(key, 3) == "pytest-apc-M-c8-consistent_hash-conversation-3"
    argv = bench_args(workload_for("multiturn", default_settings()), key, base_url="http://x", model="m",
                      tokenizer="t", served_model_name="m", result_dir=tmp_path, result_filename="r.json")  # fmt: skip
    assert "--header" not in argv
    r_argv = bench_args(workload_for("fleet", default_settings()), RunKey("R", 8, route="consistent_hash"),
                        base_url="http://x", model="m", tokenizer="t", served_model_name="m", result_dir=tmp_path,
                        result_filename="r.json")  # fmt: skip
    assert "X-Session-ID=pytest-apc-R-c8-consistent_hash" in r_argv
    data = tmp_path / "t1.jsonl"
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "prompt_len": 5, "output_tokens": 2,
             "request_id": conversation_id(key, c)} for c in range(2)]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    samples = chat_samples(SimpleNamespace(dataset_name="custom", dataset_path=str(data), request_id_prefix="x-"))
    assert samples is not None
    assert [s.request_id for s in samples] == [conversation_id(key, 0), conversation_id(key, 1)]


def test_an_unmarked_test_of_case_m_behind_the_router_is_a_fleet_test(pytester) -> None:
    """-m multiturn (one server) must not select a test of case M behind the router, marked or not: it
    would start the replicas and the router."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.apc_cases("M", fleet=True)
        def test_my_conversations(apc_run):
            pass

        @pytest.mark.apc_cases("M")
        def test_my_turns(apc_run):
            pass
        """
    )
    fleet = pytester.runpytest("--cpu-node", "-m", "fleet", "--collect-only", "-q")
    fleet.stdout.fnmatch_lines(["*test_my_conversations[M-c8-round_robin]*", "*2/4 tests collected (2 deselected)*"])
    one = pytester.runpytest("--cpu-node", "-m", "multiturn", "--collect-only", "-q")
    one.stdout.fnmatch_lines(["*test_my_turns[M-c1]*", "*2/4 tests collected (2 deselected)*"])
    assert "test_my_conversations" not in one.stdout.str()


def test_a_skipped_parameter_of_case_m_behind_the_router_has_a_run_id_that_parses() -> None:
    from pytest_apc.workload.plan import parametrization
    from tests.conftest import default_settings

    s = default_settings(fleet_url="http://gw", metrics_url=("http://a", "http://b"))
    (param,) = parametrization("M", {"fleet": True}, s)
    assert param.skip is not None
    assert RunKey.parse(param.run_id).route == "none"
