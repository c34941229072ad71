"""Fleets without servers: the prediction with prefix groups and a header block, cold prefills from one
replica's counters, per-replica /metrics, run ids and modes of case R, the fleet settings, and which
deployment serves which route."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from pytest_apc import config
from pytest_apc.serving import metrics, process
from pytest_apc.serving.deployment import deployment_for, replica_gpus
from pytest_apc.serving.fleet import Fleet
from pytest_apc.serving.interface import ServerError
from pytest_apc.serving.router import Router, RouterError
from pytest_apc.serving.server import ExternalServer, LaunchedServer
from pytest_apc.workload.cases import DATA_PARALLEL, EXTERNAL_FLEET, RunKey, ServerMode, Workload, predict
from pytest_apc.workload.plan import fleet_routes

# -- predict() and Prediction.cold_prefills --------------------------------------------------------------


def fleet_workload(groups: int, prefix: int = 2048, n: int = 30) -> Workload:
    return Workload("fleet", prefix, 64, 16, n, 0, groups)


def test_prediction_with_prefix_groups_and_a_header_block() -> None:
    # S = 300 + 2048 = 2348 -> 18 blocks of 128: P = 2304; the header alone spans 2 blocks: Q = 256.
    p = predict(fleet_workload(3), header_tokens=300, block_size=128, total_input_tokens=30 * 2412)
    assert (p.group_tokens, p.header_block_tokens, p.prefix_groups) == (2304, 256, 3)
    assert p.expected_hits == (30 - 3) * 2304 + (3 - 1) * 256 == 62_720
    assert p.computed_tokens_on == 30 * 2412 - 62_720
    # One group: the single-server formula (N-1) x P, whatever the header.
    assert predict(fleet_workload(1), 300, 128, 30 * 2412).expected_hits == 29 * 2304
    # A header under one block is shared by nothing: Q = 0.
    assert predict(fleet_workload(5), 26, 128, 0).expected_hits == 25 * 2048


@pytest.mark.parametrize(("header", "groups"), [(300, 3), (26, 1), (26, 5), (130, 10), (1000, 2)])
def test_cold_prefills_invert_replica_hits(header: int, groups: int) -> None:
    p = predict(fleet_workload(groups), header, 128, 0)
    assert p.group_tokens > p.header_block_tokens
    for k in range(1, 31):
        for c in range(1, min(k, groups) + 1):
            hits = p.replica_hits(k, c)
            assert p.cold_prefills(k, hits) == (c, 0), (k, c, hits)
            # Noise of under half a group's blocks still tells the same count, and says how much is left.
            for noise in (-p.block_size, p.block_size, 3 * p.block_size):
                if abs(noise) < (p.group_tokens - p.header_block_tokens) // 2 and hits + noise >= 0:
                    assert p.cold_prefills(k, hits + noise) == (c, noise), (k, c, noise)


def test_cold_prefills_of_a_replica_that_served_nothing() -> None:
    p = predict(fleet_workload(3), 300, 128, 0)
    assert p.replica_hits(0, 0) == 0
    assert p.cold_prefills(0, 0) == (0, 0)
    assert p.cold_prefills(0, 512) == (0, 512)  # hits without requests: all unexplained


def test_cold_prefills_cannot_be_told_when_the_prefix_spans_no_block_beyond_the_header() -> None:
    # S = 300 + 10 = 310 -> 2 blocks = the header's 2 blocks: every request hits the same 256 tokens.
    p = predict(fleet_workload(1, prefix=10), 300, 128, 0)
    assert p.group_tokens == p.header_block_tokens == 256
    assert p.cold_prefills(15, 14 * 256) == (None, 14 * 256)


def test_cold_prefills_are_clamped_to_one_to_min_of_requests_and_groups() -> None:
    p = predict(fleet_workload(3), 300, 128, 0)
    # A warm replica: all 15 requests hit the group (more than one cold prefill can explain).
    cold, left = p.cold_prefills(15, 15 * 2304)
    assert cold == 1
    assert left == 15 * 2304 - p.replica_hits(15, 1) == 2304 - 0
    # No hits at all for 15 requests would take 15 cold prefills, but there are only 3 groups.
    cold, left = p.cold_prefills(15, 0)
    assert cold == 3
    assert left == -p.replica_hits(15, 3)
    # 2 requests cannot hold 3 cold prefills.
    assert p.cold_prefills(2, 0)[0] == 2


# -- /metrics: per-engine parts, merged replicas, their deltas and finished requests -------------------

ENGINES = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 2.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0"} 1.0
"""


def one_engine(queries: float, hits: float, finished: float, block_size: int = 16) -> metrics.Snapshot:
    return metrics.parse(
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
        f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {finished}\n'
        f'vllm:cache_config_info{{block_size="{block_size}",engine="0"}} 1.0\n'
    )


def test_each_engine_is_a_part_only_when_there_are_two_or_more() -> None:
    snap = metrics.parse(ENGINES)
    assert snap.counter("prefix_cache_queries") == 150
    assert list(snap.parts) == ["engine 0", "engine 1"]
    assert snap.parts["engine 0"].counter("prefix_cache_queries") == 100
    assert snap.parts["engine 1"].counter("prefix_cache_queries") == 50
    assert snap.parts["engine 0"].counter("requests") == 4  # every finished_reason
    assert snap.parts["engine 1"].counter("requests") == 2
    assert snap.parts["engine 1"].cache_config["block_size"] == "16"
    assert one_engine(1, 0, 0).parts == {}
    assert metrics.parse("vllm:prefix_cache_hits_total 5.0\n").parts == {}  # no engine label at all


def test_merge_sums_replicas_and_keeps_each_as_a_part() -> None:
    a, b = one_engine(100, 10, 3), one_engine(40, 16, 2, block_size=32)
    merged = metrics.merge({"replica 1": a, "replica 2": b})
    assert merged.counter("prefix_cache_queries") == 140
    assert merged.counter("prefix_cache_hits") == 26
    assert merged.counter("requests") == 5
    assert merged.parts == {"replica 1": a, "replica 2": b}
    assert merged.cache_config["block_size"] == "16"  # the first replica's
    empty = metrics.merge({})
    assert (dict(empty.samples), dict(empty.cache_config), dict(empty.parts)) == ({}, {}, {})


def test_part_deltas_per_replica() -> None:
    before = metrics.merge({"replica 1": one_engine(100, 10, 3), "replica 2": one_engine(40, 16, 2)})
    after = metrics.merge({"replica 1": one_engine(700, 490, 9), "replica 2": one_engine(40, 16, 2)})
    parts = metrics.part_deltas(before, after)
    assert sorted(parts) == ["replica 1", "replica 2"]
    assert (parts["replica 1"].prefix_cache_queries, parts["replica 1"].prefix_cache_hits) == (600, 480)
    assert parts["replica 1"].requests == 6
    assert (parts["replica 2"].prefix_cache_hits, parts["replica 2"].requests) == (0, 0)
    total = metrics.delta(before, after)
    assert (total.prefix_cache_hits, total.requests) == (480, 6)
    # A replica missing from one scrape has no delta; one server has no parts.
    partial = metrics.merge({"replica 1": one_engine(700, 490, 9)})
    assert list(metrics.part_deltas(before, partial)) == ["replica 1"]
    assert metrics.part_deltas(one_engine(1, 0, 0), one_engine(2, 0, 1)) == {}
    # Data-parallel engines of one server are parts too.
    engines = metrics.part_deltas(metrics.parse(ENGINES), metrics.parse(ENGINES.replace("} 50.0", "} 80.0")))
    assert {name: d.prefix_cache_queries for name, d in engines.items()} == {"engine 0": 0, "engine 1": 30}


def test_requests_are_finished_requests_of_every_reason_or_none() -> None:
    before = metrics.parse(ENGINES)
    after = metrics.parse(
        ENGINES.replace('"length",model_name="m"} 3.0', '"length",model_name="m"} 13.0').replace(
            '"abort",model_name="m"} 0.0', '"abort",model_name="m"} 1.0'
        )
    )
    assert metrics.delta(before, after).requests == 11
    assert metrics.delta(before, after).metric_names["requests"] == "vllm:request_success_total"
    bare = "vllm:prefix_cache_hits_total 5.0\n"
    assert metrics.delta(metrics.parse(bare), metrics.parse(bare)).requests is None


# -- case R: run ids and the deployment each route is measured on -------------------------------------


@pytest.mark.parametrize("text", ["R-c8-round_robin", "R-c1-consistent_hash", "R-c4-dp", "R-c8-external"])
def test_fleet_run_ids_round_trip(text: str) -> None:
    key = RunKey.parse(text)
    assert key.id == text
    assert key.hash_algo == ""
    assert key.route == text.split("-", 2)[2]
    assert key.family == "fleet"
    assert key.apc


def test_an_external_fleets_label_is_its_route_and_its_run_id() -> None:
    """Any route that is neither a router policy nor dp is an external fleet's --apc-set route_label."""
    key = RunKey.parse("R-c8-gke_gateway_2")
    assert (key.route, key.id) == ("gke_gateway_2", "R-c8-gke_gateway_2")
    assert key.mode == ServerMode(True, "", "external") == RunKey("R", 8, route=EXTERNAL_FLEET).mode
    assert key.mode.name == "apc-on-fleet-external"


def test_a_fleet_run_id_needs_a_route() -> None:
    assert RunKey.parse("R-c8-round_robin") == RunKey("R", 8, route="round_robin")
    with pytest.raises(ValueError, match="not a fleet run id: 'R-c8'"):
        RunKey.parse("R-c8")


def test_every_router_policy_shares_one_fleet_and_dp_and_external_have_their_own() -> None:
    router = ServerMode(True, "", "router")
    for policy in config.ROUTER_POLICIES:
        assert RunKey("R", 8, route=policy).mode == router
    assert RunKey("R", 8, route=DATA_PARALLEL).mode == ServerMode(True, "", "dp")
    assert RunKey("R", 8, route=EXTERNAL_FLEET).mode == ServerMode(True, "", "external")
    assert router.name == "apc-on-fleet-router"
    assert RunKey("R", 8, route=DATA_PARALLEL).mode.name == "apc-on-fleet-dp"
    assert RunKey("D", 8).mode == ServerMode(True)  # the A-F cases are no fleet


# -- settings ---------------------------------------------------------------------------------------------


def resolve(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None) -> config.Settings:
    return config.resolve(pytester.parseconfig("--cpu-node", *args), environ=env or {})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--apc-set=prefix_groups=4"], "Invalid apc_prefix_groups 4 from option --apc-set: it must divide "
                                    "apc_num_prompts 30 (equal groups)"),
        (["--apc-fleet-url=http://gw:8000"], "Invalid apc_fleet_url 'http://gw:8000' from option --apc-fleet-url: "
                                             "a fleet needs the base URL of each of its replicas"),
        (["--apc-fleet-url=http://gw:8000", "--apc-metrics-url=http://r1:8000"], "Invalid apc_fleet_url"),
        (["--apc-metrics-url=http://r1:8000", "--apc-metrics-url=http://r2:8000"],
         "Invalid apc_metrics_url ('http://r1:8000', 'http://r2:8000') from option --apc-metrics-url: replica URLs "
         "are only read for a fleet given by --apc-fleet-url"),
        (["--apc-set=data_parallel_size=1"], "Invalid apc_data_parallel_size 1 from option --apc-set: "
                                         "one rank is not data parallel"),
        (["--apc-set=router_policies=round_robin,fastest"], "Invalid apc_router_policies 'round_robin,fastest' from "
                                                        "option --apc-set: unknown vllm-router policy "
                                                        "'fastest'"),
        (["--apc-set=replicas=1"], "Invalid apc_replicas '1' from option --apc-set: must be >= 2"),
        (["--apc-fleet-url=gw:8000"], "Invalid apc_fleet_url 'gw:8000' from option --apc-fleet-url: must start"),
    ],
)  # fmt: skip
def test_fleet_settings_are_one_line_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("--cpu-node", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if "Invalid apc_" in line]
    assert len(errors) == 1, result.stderr.lines
    assert message in errors[0]


def test_prefix_groups_from_the_environment_name_it(pytester: pytest.Pytester) -> None:
    with pytest.raises(config.SettingError, match="from environment variable PYTEST_APC_SET: it must divide"):
        resolve(pytester, env={"PYTEST_APC_SET": "prefix_groups=7"})
    assert resolve(pytester, "--apc-set=num_prompts=28", env={"PYTEST_APC_SET": "prefix_groups=7"}).prefix_groups == 7


def test_fleet_routes(pytester: pytest.Pytester) -> None:
    assert fleet_routes(resolve(pytester)) == ("round_robin", "consistent_hash")
    assert fleet_routes(resolve(pytester, "--apc-set=data_parallel_size=2")) == (
        "round_robin", "consistent_hash", DATA_PARALLEL,
    )  # fmt: skip
    assert fleet_routes(resolve(pytester, "--apc-set=router_policies=cache_aware,round_robin,cache_aware")) == (
        "cache_aware", "round_robin",
    )  # fmt: skip
    assert fleet_routes(resolve(pytester, "--apc-set=router_policies=")) == ()
    assert fleet_routes(resolve(pytester, "--apc-set=router_policies=", "--apc-set=data_parallel_size=4")) == ("dp",)
    external = resolve(
        pytester, "--apc-fleet-url=http://gw", "--apc-metrics-url=http://r1", "--apc-metrics-url=http://r2",
        "--apc-set=data_parallel_size=2",
    )  # fmt: skip
    assert fleet_routes(external) == (EXTERNAL_FLEET,)
    labelled = resolve(
        pytester, "--apc-fleet-url=http://gw", "--apc-metrics-url=http://r1", "--apc-metrics-url=http://r2",
        "--apc-set=route_label=llm_d",
    )  # fmt: skip
    assert fleet_routes(labelled) == ("llm_d",)


EXTERNAL = ("--apc-fleet-url=http://gw", "--apc-metrics-url=http://r1", "--apc-metrics-url=http://r2")


@pytest.mark.parametrize(
    ("label", "why"),
    [
        ("My-Gateway", "must be 1 to 40 lower-case letters, digits or _ (it becomes part of the run id)"),
        ("a" * 41, "must be 1 to 40 lower-case letters"),
        ("round_robin", "is the route of a vllm-router policy, so run ids and baselines could not tell them apart"),
        ("cache_aware", "is the route of a vllm-router policy"),
        ("dp", "is the route of vLLM's data-parallel route"),
    ],
)
def test_a_route_label_must_be_a_run_id_word_of_its_own(pytester: pytest.Pytester, label: str, why: str) -> None:
    with pytest.raises(config.SettingError, match=re.escape(f"Invalid apc_route_label {label!r} from option")) as err:
        resolve(pytester, *EXTERNAL, f"--apc-set=route_label={label}")
    assert why in str(err.value)


@pytest.mark.parametrize("given", ["--apc-set=route_label=gw", "--apc-set=fleet_promise=affinity"])
def test_the_external_fleets_label_and_promise_need_an_external_fleet(pytester: pytest.Pytester, given: str) -> None:
    with pytest.raises(config.SettingError, match="--apc-fleet-url"):
        resolve(pytester, given)
    assert resolve(pytester, *EXTERNAL, given)


def test_the_routing_cost_bound_is_a_percentage(pytester: pytest.Pytester) -> None:
    assert resolve(pytester).max_routing_cost is None
    assert resolve(pytester, "--apc-set=max_routing_cost=12.5").max_routing_cost == 12.5
    assert resolve(pytester, env={"PYTEST_APC_SET": "max_routing_cost=0"}).max_routing_cost == 0
    for wrong in ("101", "-1", "nan", "5%"):
        with pytest.raises(config.SettingError, match="Invalid apc_max_routing_cost"):
            resolve(pytester, f"--apc-set=max_routing_cost={wrong}")
    with pytest.raises(config.SettingError, match="must be spread or affinity or none"):
        resolve(pytester, *EXTERNAL, "--apc-set=fleet_promise=sticky")


FLEET_SUITE = """
import pytest
from pytest_apc import verdicts

pytestmark = [pytest.mark.fleet]

@pytest.mark.apc_cases("R", fleet=True)
def test_fleet_accounting(apc_run, apc_assert):
    apc_assert(verdicts.fleet_accounting(apc_run))

@pytest.mark.apc_cases("D")
def test_single(apc_run):
    pass
"""


def test_fleet_tests_are_parametrized_by_route_and_kept_out_of_apc(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fleet=FLEET_SUITE.replace("@pytest.mark.apc_cases(\"D\")", "@pytest.mark.apc\n"
                                                       "@pytest.mark.apc_cases(\"D\")"))  # fmt: skip
    fleet_ids = pytester.runpytest(
        "--cpu-node", "--collect-only", "-q", "-m", "fleet", "--apc-set=data_parallel_size=2"
    )
    fleet_ids.stdout.fnmatch_lines([
        "test_fleet.py::test_fleet_accounting[[]R-c8-round_robin[]]",
        "test_fleet.py::test_fleet_accounting[[]R-c8-consistent_hash[]]",
        "test_fleet.py::test_fleet_accounting[[]R-c8-dp[]]",
    ])  # fmt: skip
    assert "test_single" in fleet_ids.stdout.str()  # module-level fleet mark
    apc = pytester.runpytest("--cpu-node", "--collect-only", "-q", "-m", "apc and not fleet")
    assert "test_fleet_accounting" not in apc.stdout.str()
    none = pytester.runpytest("--cpu-node", "--collect-only", "-q", "-m", "fleet", "--apc-set=router_policies=", "-rs")
    none.stdout.fnmatch_lines(["test_fleet.py::test_fleet_accounting[[]no-routes[]]"])


# -- deployments -------------------------------------------------------------------------------------------


def test_router_policies_run_on_launched_replicas_behind_a_router(pytester, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    settings = resolve(pytester, "--apc-set=replicas=3")
    d = deployment_for(ServerMode(True, "", "router"), settings, "/model", tmp_path, lambda m: None)
    assert isinstance(d, Fleet)
    assert d.router is not None
    assert d.launched
    assert [type(r) for r in d.replicas] == [LaunchedServer] * 3
    assert [r.log_path.name for r in d.replicas] == [f"server-apc-on-fleet-router-r{i}.log" for i in (1, 2, 3)]
    assert d.log_path == tmp_path / "router-apc-on-fleet-router.log"
    binds = [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in d.replicas if isinstance(r, LaunchedServer)]
    assert len(binds) == 3
    assert all(binds)
    if len(os.sched_getaffinity(0)) >= 3:
        assert len(set(binds)) == 3  # each replica its own cores


def test_a_data_parallel_route_is_one_launched_server_with_its_ranks(pytester, tmp_path) -> None:
    settings = resolve(pytester, "--apc-set=data_parallel_size=2")
    d = deployment_for(ServerMode(True, "", DATA_PARALLEL), settings, "/model", tmp_path, lambda m: None)
    assert isinstance(d, LaunchedServer)
    argv = d._command_for_port(1234)
    assert argv[argv.index("--data-parallel-size") + 1] == "2"


def test_an_external_fleet_is_measured_at_its_replicas(pytester, tmp_path) -> None:
    settings = resolve(
        pytester, "--apc-fleet-url=http://gw:80", "--apc-metrics-url=http://r1:81", "--apc-metrics-url=http://r2:82"
    )
    d = deployment_for(ServerMode(True, "", EXTERNAL_FLEET), settings, "/model", tmp_path, lambda m: None)
    assert isinstance(d, Fleet)
    assert d.router is None
    assert not d.launched
    assert d.url == "http://gw:80"
    assert [(type(r), r.url) for r in d.replicas] == [
        (ExternalServer, "http://r1:81"),
        (ExternalServer, "http://r2:82"),
    ]
    assert d.route("round_robin") == ""  # nothing to start


@pytest.mark.parametrize("route", ["router", DATA_PARALLEL])
def test_an_external_apc_on_server_does_not_stand_in_for_a_fleet(pytester, tmp_path, route: str) -> None:
    """--apc-url-on is the one APC-on server of the A-F cases: the fleet routes are not measured on it
    (one server's counters under a router policy's name)."""
    settings = resolve(pytester, "--apc-url-on=http://on:8000", "--apc-set=data_parallel_size=2")
    d = deployment_for(ServerMode(True, "", route), settings, "/model", tmp_path, lambda m: None)
    assert not isinstance(d, ExternalServer)
    assert isinstance(deployment_for(ServerMode(True), settings, "/model", tmp_path, lambda m: None), ExternalServer)


def test_gpu_replicas_get_their_own_gpus(pytester, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    gpu = config.resolve(pytester.parseconfig("--gpu-node", "--apc-model=/m"), environ={})
    assert replica_gpus(gpu) == [({"CUDA_VISIBLE_DEVICES": "4,5"}, 2), ({"CUDA_VISIBLE_DEVICES": "6,7"}, 2)]
    one_each = config.resolve(pytester.parseconfig("--gpu-node", "--apc-model=/m", "--apc-tensor-parallel-size=1"),
                              environ={})  # fmt: skip
    assert replica_gpus(one_each) == [({"CUDA_VISIBLE_DEVICES": "4"}, 1), ({"CUDA_VISIBLE_DEVICES": "5"}, 1)]
    too_many = config.resolve(pytester.parseconfig("--gpu-node", "--apc-model=/m", "--apc-tensor-parallel-size=3"),
                              environ={})  # fmt: skip
    with pytest.raises(ServerError, match="2 replicas x tensor parallel 3 need 6 GPUs, 4 are visible"):
        replica_gpus(too_many)


# -- the router ------------------------------------------------------------------------------------------


def router(tmp_path: Path, command: list[str], extra: tuple[str, ...] = ()) -> Router:
    return Router(
        command, extra, bind_host="127.0.0.1", connect_host="127.0.0.1", log_path=tmp_path / "router.log",
        env={}, startup_timeout=5, stop_timeout=1,
    )  # fmt: skip


def test_a_missing_router_names_the_requirement_that_installs_it(tmp_path) -> None:
    missing = router(tmp_path, ["/nonexistent/vllm-router"]).missing()
    assert missing is not None
    assert "('/nonexistent/vllm-router'), which is not installed: pip install 'vllm-router>=0.1.17'" in missing
    assert "--apc-fleet-url" in missing
    bare = router(tmp_path, ["no-such-router-here"])
    assert bare.missing() is not None
    assert bare.command == ["no-such-router-here"]


def test_a_router_next_to_this_interpreter_is_found_without_an_activated_virtualenv(tmp_path, monkeypatch) -> None:
    beside = Path(sys.executable).parent / "vllm-router"
    if not beside.is_file():
        pytest.skip("vllm-router is not installed next to this interpreter")
    monkeypatch.setenv("PATH", "/nonexistent")
    found = router(tmp_path, ["vllm-router", "--x"])
    assert found.command == [str(beside), "--x"]
    assert found.missing() is None


def test_the_router_gets_its_own_metrics_port(tmp_path, monkeypatch) -> None:
    """vllm-router serves Prometheus metrics on 127.0.0.1:29000 unless told otherwise: a second router on
    the node (another pytest-apc run, anything else on that port) would make it exit while starting."""

    def spawn(argv, env, log):
        raise OSError("not started in this test")

    monkeypatch.setattr(process, "spawn", spawn)
    r = router(tmp_path, ["/bin/true"], extra=("--log-level", "debug"))
    with pytest.raises(RouterError, match="vllm-router could not be executed: not started in this test"):
        r.start("round_robin", ["http://a:1", "http://b:2"])
    argv = r.argv
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == ["http://a:1", "http://b:2"]
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert "--prometheus-port" in argv
    metrics_port = argv[argv.index("--prometheus-port") + 1]
    assert metrics_port.isdigit()
    assert metrics_port not in ("29000", argv[argv.index("--port") + 1])
    assert argv[-2:] == ["--log-level", "debug"]  # the user's own arguments last: they win
