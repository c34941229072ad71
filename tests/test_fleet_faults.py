"""Fleet faults, injected with tests/fake_vllm.py behind the real vllm-router: the suite's own
tests_apc/test_fleet.py run with ``-m fleet --cpu-node``. Each fault is a loud failure that names the
replica, and nothing is left running."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time

import psutil
import pytest
import requests

from tests.conftest import FAKE_VLLM, TESTS_APC
from tests.test_faults import _start_fake

FLEET_IDS = [
    f"test_fleet.py::{test}[R-c8-{route}]"
    for test in ("test_fleet_accounting", "test_prefix_locality")
    for route in ("consistent_hash", "round_robin")
]


@pytest.fixture(autouse=True)
def fleet_suite(tmp_path):
    """The suite's fleet tests, copied: the inner run's rootdir (and results) stay in tmp_path. Afterwards
    no vllm-router may be left: run_inner's leftover check cannot see one (``_fleet_processes``)."""
    (tmp_path / "test_fleet.py").write_text((TESTS_APC / "test_fleet.py").read_text())
    yield
    routers, _ = _fleet_processes(tmp_path)
    for proc in routers:
        proc.kill()
    assert not routers, "vllm-router left behind"


def fleet_args(*fake_flags: str) -> list[str]:
    """The fleet tests on fake replicas (tokenizing like the benchmark, so that hits are predictable)."""
    args = [
        "-m",
        "fleet",
        "-k",
        "not multiturn",  # case R only: case M behind the router is tests/test_affinity.py's and the e2e's
        "--cpu-node",
        f"--apc-set=server_command={{python}} {FAKE_VLLM}",
        "--apc-server-arg=--fake-model-tokenizer",
        "--apc-length-scale=0.01",
        "--apc-set=startup_timeout=20",
        "--apc-set=stop_timeout=3",
        "-p",
        "no:randomly",
        "-rA",
    ]
    return args + [f"--apc-server-arg={flag}" for flag in fake_flags]


def results(tmp_path) -> dict:
    return json.loads(next(tmp_path.glob("apc-results/*/results.json")).read_text())


def errored_all(output: str) -> None:
    """Every fleet test errored (none passed, none was skipped)."""
    for test_id in FLEET_IDS:
        assert f"ERROR {test_id}" in output, output[-3000:]
    assert "passed" not in output.splitlines()[-1]


def test_missing_router_errors_every_fleet_test_at_once_naming_the_extra(tmp_path, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(*fleet_args(), "--apc-set=router_command=/nonexistent/vllm-router")
    assert inner.ret == 1
    assert time.monotonic() - started < 60
    errored_all(inner.output)
    assert "the fleet tests start vllm-router ('/nonexistent/vllm-router'), which is not installed" in inner.output
    assert "pip install 'vllm-router>=0.1.17'" in inner.output
    assert not list(tmp_path.glob("apc-results/*/server-*-r1.log")), "replicas were launched without a router"


def fake_router(*flags: str) -> list[str]:
    """tests/fake_vllm.py as vllm-router (it takes the router's flags and answers /health), with ``flags``; one
    policy, so each test starts it once."""
    return [
        f"--apc-set=router_command={sys.executable} {FAKE_VLLM} {' '.join(flags)}",
        "--apc-set=router_policies=round_robin",
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--fake-crash-on-start",), "vllm-router (round_robin) exited with code 3 while starting"),
        (("--fake-refuse=--no-such-flag",), "vllm-router (round_robin) exited with code 2 while starting"),
        (
            ("--fake-startup-delay=600", "--fake-children=2", "--fake-ignore-sigterm"),
            "vllm-router (round_robin) did not answer /health within 10 s",
        ),
    ],
    ids=["exits-at-once", "bad-flag", "never-listens"],
)
def test_a_router_that_does_not_start_fails_its_runs_with_its_log(tmp_path, run_inner, flags, message) -> None:
    """The replicas start; the router exits at once, refuses a flag of --apc-set router_arg, or never opens its
    port (with children, ignoring SIGTERM): its runs fail naming it with its log, and nothing is left."""
    inner = run_inner(
        *fleet_args(),
        *fake_router(*flags),
        "--apc-set=router_arg=--no-such-flag",
        "--apc-set=startup_timeout=10",
        "-rA",
    )
    assert inner.ret == 1
    assert message in inner.output, inner.output[-4000:]
    assert "--- last lines of the router log ---" in inner.output
    if "--fake-crash-on-start" in flags:
        assert "RuntimeError: CUDA out of memory (fake)" in inner.output
    if "--fake-refuse=--no-such-flag" in flags:
        assert "error: unrecognized arguments: --no-such-flag" in inner.output
    assert "passed" not in inner.output.splitlines()[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_while_the_router_starts_leaves_nothing(tmp_path, run_inner, sig) -> None:
    """Ctrl-C (or SIGTERM) while pytest waits for a router that never answers, ignoring SIGTERM, with children."""
    if signal.getsignal(sig) is signal.SIG_IGN:
        pytest.skip(f"{signal.Signals(sig).name} is ignored by this process (a background job?)")
    router = fake_router("--fake-never-ready", "--fake-children=2", "--fake-ignore-sigterm")
    inner = run_inner(*fleet_args(), *router, "--apc-set=startup_timeout=300", wait=False)
    inner.wait_for(tmp_path, "apc-results/*/router-*.log", "the router's start", timeout=120)
    time.sleep(1.5)
    inner.proc.send_signal(sig)
    signalled = time.monotonic()
    inner.wait()
    assert inner.ret != 0
    assert time.monotonic() - signalled < 60, "the interrupted run waited for its router"
    assert _fleet_processes(tmp_path) == ([], [])
    assert not inner.leftovers(), "interrupted fleet run left its router behind"


def test_one_replica_that_cannot_start_is_named_with_its_log(tmp_path, run_inner) -> None:
    """Only replica 2 crashes (its log is server-...-r2.log): the error names it, shows its log, and the
    replica that did start is stopped."""
    inner = run_inner(*fleet_args("--fake-if-log=-r2.log --fake-crash-on-start"))
    assert inner.ret == 1
    errored_all(inner.output)
    assert "replica 2 of 2 could not start:" in inner.output
    assert "replica 1 of 2 could not start" not in inner.output
    assert "apc-on-fleet-router server exited with code 3 while starting" in inner.output
    assert "server-apc-on-fleet-router-r2.log" in inner.output
    assert "CUDA out of memory (fake)" in inner.output  # replica 2's log tail


def test_replicas_that_differ_in_block_size_are_refused(tmp_path, run_inner) -> None:
    inner = run_inner(*fleet_args("--fake-if-log=-r2.log --block-size 32"))
    assert inner.ret == 1
    errored_all(inner.output)
    assert "the apc-on-fleet-router replicas are not alike" in inner.output
    assert "replica 2 has block_size='32', replica 1 '16'" in inner.output
    assert not list(tmp_path.glob("apc-results/*/bench/*.json")), "a fleet of unlike replicas was measured"


def test_a_replica_that_does_not_reset_fails_its_runs_naming_it(tmp_path, run_inner) -> None:
    inner = run_inner(*fleet_args("--fake-if-log=-r2.log --fake-reset false"))
    assert inner.ret == 1
    errored_all(inner.output)
    assert "replica 2 of the apc-on-fleet-router fleet: apc-on-fleet-router server did not reset its prefix cache" in (
        inner.output
    )


def _free_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed


def test_external_fleet_with_a_replica_that_does_not_answer_fails_naming_it(tmp_path, run_inner) -> None:
    gateway, gateway_url = _start_fake(tmp_path)
    replica, replica_url = _start_fake(tmp_path)
    dead_url = _free_url()
    try:
        started = time.monotonic()
        inner = run_inner(
            *fleet_args(), f"--apc-fleet-url={gateway_url}", f"--apc-metrics-url={replica_url}",
            f"--apc-metrics-url={dead_url}", "--apc-set=startup_timeout=1800",
        )  # fmt: skip
        assert time.monotonic() - started < 30  # not --apc-set startup_timeout: it is up already or a wrong URL
        assert inner.ret == 1
        for test in ("test_fleet_accounting", "test_prefix_locality"):
            assert f"ERROR test_fleet.py::{test}[R-c8-external]" in inner.output
        assert "passed" not in inner.output.splitlines()[-1]
        assert "replica 2 of 2 could not start:" in inner.output
        assert (
            f"apc-on-fleet-external server (external, {dead_url}) does not answer: GET {dead_url}/health: "
            "connection refused (nothing listens there) (for 10 s; a server run elsewhere must be up already)"
        ) in inner.output
        assert gateway.poll() is None, "the plugin stopped a server it did not launch"
        assert replica.poll() is None, "the plugin stopped a server it did not launch"
    finally:
        gateway.kill()
        replica.kill()


def test_external_fleet_whose_gateway_does_not_answer_fails_in_seconds_naming_it(tmp_path, run_inner) -> None:
    one, one_url = _start_fake(tmp_path)
    two, two_url = _start_fake(tmp_path)
    dead_url = _free_url()
    try:
        started = time.monotonic()
        inner = run_inner(
            *fleet_args(), f"--apc-fleet-url={dead_url}", f"--apc-metrics-url={one_url}",
            f"--apc-metrics-url={two_url}", "--apc-set=startup_timeout=1800",
        )  # fmt: skip
        assert time.monotonic() - started < 30
        assert inner.ret == 1
        assert (
            f"the apc-on-fleet-external gateway (--apc-fleet-url {dead_url}) does not answer: "
            f"GET {dead_url}/v1/models: connection refused"
        ) in inner.output
    finally:
        one.kill()
        two.kill()


def test_external_fleet_whose_gateway_lists_another_model_is_refused(tmp_path, run_inner) -> None:
    """The replicas serve apc-model, the gateway routes a model of another name: another deployment."""
    gateway, gateway_url = _start_fake(tmp_path, "--served-model-name", "llama-70b")
    one, one_url = _start_fake(tmp_path)
    two, two_url = _start_fake(tmp_path)
    try:
        inner = run_inner(
            *fleet_args(), f"--apc-fleet-url={gateway_url}", f"--apc-metrics-url={one_url}",
            f"--apc-metrics-url={two_url}",
        )  # fmt: skip
        assert inner.ret == 1
        assert (
            f"the apc-on-fleet-external gateway (--apc-fleet-url {gateway_url}) serves ['llama-70b'], not "
            "'apc-model', which its replicas serve"
        ) in inner.output
    finally:
        gateway.kill()
        one.kill()
        two.kill()


def test_external_fleet_gets_the_replica_key_on_its_replicas_and_the_api_key_on_its_gateway(
    tmp_path, run_inner
) -> None:
    """Gateway and replicas want different keys on /v1 (as vLLM's with VLLM_API_KEY): readiness reads every
    replica's /v1/models with the replica key, the benchmark sends its requests to the gateway with the
    API key. The gateway here is a fake server, not a router, so the replicas count none of the requests:
    fleet_accounting fails on that, which it can only do once every key was accepted."""
    gateway, gateway_url = _start_fake(tmp_path, api_key="gateway-key-1")
    one, one_url = _start_fake(tmp_path, api_key="replica-key-2")
    two, two_url = _start_fake(tmp_path, api_key="replica-key-2")
    try:
        inner = run_inner(
            *fleet_args(), f"--apc-fleet-url={gateway_url}", f"--apc-metrics-url={one_url}",
            f"--apc-metrics-url={two_url}", "--apc-api-key=gateway-key-1",
            env={"PYTEST_APC_SET": "replica_api_key=replica-key-2"},
        )  # fmt: skip
        assert "HTTP 401" not in inner.output, inner.output[-3000:]
        assert "FAILED test_fleet.py::test_fleet_accounting[R-c8-external]" in inner.output, inner.output[-3000:]
        assert "the replicas finished 0 requests for the benchmark's 30" in inner.output
        for key in ("gateway-key-1", "replica-key-2"):
            assert key not in inner.output
            for path in tmp_path.glob("apc-results/**/*"):
                if path.is_file():
                    assert key not in path.read_text(errors="replace"), path
    finally:
        gateway.kill()
        one.kill()
        two.kill()


def test_external_fleet_whose_replicas_did_not_serve_the_requests_fails(tmp_path, run_inner) -> None:
    """--apc-metrics-url at servers the gateway does not route to: their counters saw none of the
    benchmark's requests, which the verdicts must not pass as a fleet with perfect locality."""
    gateway, gateway_url = _start_fake(tmp_path)
    one, one_url = _start_fake(tmp_path)
    two, two_url = _start_fake(tmp_path)
    try:
        inner = run_inner(
            *fleet_args(), f"--apc-fleet-url={gateway_url}", f"--apc-metrics-url={one_url}",
            f"--apc-metrics-url={two_url}",
        )  # fmt: skip
        assert inner.ret == 1
        assert "FAILED test_fleet.py::test_fleet_accounting[R-c8-external]" in inner.output
        assert "FAILED test_fleet.py::test_prefix_locality[R-c8-external]" in inner.output
        assert "the replicas finished 0 requests for the benchmark's 30: the router dropped requests" in inner.output
    finally:
        gateway.kill()
        one.kill()
        two.kill()


@pytest.fixture
def gateway(tmp_path):
    """An external fleet as a deployment elsewhere would be: two fake replicas that tokenize like the
    benchmark, behind a vllm-router (round_robin) that the test starts itself, with no pytest-apc tag, in a
    folder of its own. Yields the router's URL and the replicas' --apc-metrics-url options."""
    import shutil
    import subprocess

    from pytest_apc.workload.models import ensure_tiny_model

    model = str(ensure_tiny_model())
    one, one_url = _start_fake(tmp_path, "--model", model, "--fake-model-tokenizer")
    two, two_url = _start_fake(tmp_path, "--model", model, "--fake-model-tokenizer")
    router_dir = tmp_path / "gateway"
    router_dir.mkdir()
    port, metrics_port = (int(_free_url().rsplit(":", 1)[1]) for _ in range(2))
    url = f"http://127.0.0.1:{port}"
    started = [one, two]  # stopped whatever happens next, a router that cannot start too
    try:
        router = subprocess.Popen(
            [shutil.which("vllm-router") or "vllm-router", "--worker-urls", one_url, two_url, "--policy",
             "round_robin", "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics_port)],
            cwd=router_dir, stdout=(router_dir / "router.log").open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(router)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert router.poll() is None, (router_dir / "router.log").read_text()
            assert time.monotonic() < deadline, (router_dir / "router.log").read_text()
            time.sleep(0.2)
        yield url, [f"--apc-metrics-url={one_url}", f"--apc-metrics-url={two_url}"]
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


# Round robin splits the one prefix group over both replicas: P = 320 (the fake's header of 4 tokens and the
# prefix of 328, in blocks of 16), Q = 0; 2 cold prefills where 1 would do, and the extra prefill P of the
# (N - 1) x P = 9,280 tokens APC saves on one server: a routing cost of 1/29 = 3.45 %.
ROUND_ROBIN_COST = "320 extra prefill tokens of the 9,280 APC saves on one server"


def test_an_external_fleet_that_breaks_its_promise_fails_naming_the_replicas(tmp_path, run_inner, gateway) -> None:
    url, replicas = gateway
    inner = run_inner(
        *fleet_args(), f"--apc-fleet-url={url}", *replicas, "--apc-set=route_label=gke_gw",
        "--apc-set=fleet_promise=affinity", "--apc-set=max_routing_cost=3.5",
    )  # fmt: skip
    assert inner.ret == 1, inner.output[-6000:]
    assert "PASSED test_fleet.py::test_fleet_accounting[R-c8-gke_gw]" in inner.output
    assert "FAILED test_fleet.py::test_prefix_locality[R-c8-gke_gw]" in inner.output
    assert (
        "affinity: every prefix group must stay on one replica, but 2 cold prefills were computed for 1 prefix "
        "group(s): 1 more than one per group, so groups were split across replicas; cold prefills per replica: "
        "replica 1 1 (15 requests), replica 2 1 (15 requests)"
    ) in inner.output
    assert "above --apc-set max_routing_cost" not in inner.output  # 3.45 % is within 3.5 %
    data = results(tmp_path)
    (run,) = data["runs"]
    assert (run["id"], run["route"]) == ("R-c8-gke_gw", "gke_gw")
    assert "X-Session-ID=pytest-apc-R-c8-gke_gw" in run["bench_command"]
    assert [(row["id"], row["route"], row["passed"]) for row in data["fleet"]] == [("R-c8-gke_gw", "gke_gw", False)]
    locality = next(v for v in data["verdicts"] if v["name"] == "prefix_locality")
    assert (locality["runs"], locality["numbers"]["promise"]) == (["R-c8-gke_gw"], "affinity")
    assert "gke_gw" in next(tmp_path.glob("apc-results/*/summary.md")).read_text()


@pytest.mark.parametrize(("bound", "passes"), [("3.4", False), ("3.5", True)])
def test_an_external_fleets_routing_cost_is_held_to_its_bound(tmp_path, run_inner, gateway, bound, passes) -> None:
    """Either side of round robin's measured 3.45 %, with a promise the gateway keeps (spread)."""
    url, replicas = gateway
    inner = run_inner(
        *fleet_args(), f"--apc-fleet-url={url}", *replicas, "--apc-set=route_label=gke_gw",
        "--apc-set=fleet_promise=spread", f"--apc-set=max_routing_cost={bound}",
    )  # fmt: skip
    assert inner.ret == (0 if passes else 1), inner.output[-6000:]
    outcome = "PASSED" if passes else "FAILED"
    assert f"{outcome} test_fleet.py::test_prefix_locality[R-c8-gke_gw]" in inner.output
    assert "PASSED test_fleet.py::test_fleet_accounting[R-c8-gke_gw]" in inner.output
    assert "spread: no replica may be left idle" not in inner.output
    above = f"routing cost 3.45% is above --apc-set max_routing_cost={bound}%: {ROUND_ROBIN_COST}"
    assert (above in inner.output) is not passes
    locality = next(v for v in results(tmp_path)["verdicts"] if v["name"] == "prefix_locality")
    assert locality["numbers"]["routing_cost"] == pytest.approx(1 / 29)
    assert locality["numbers"]["max_routing_cost"] == float(bound)


def test_fleet_behind_vllm_router_is_accounted_replica_by_replica(tmp_path, run_inner) -> None:
    """Two fake replicas behind the real vllm-router, 3 prefix groups and a template header of one block
    (block size 4, header 4 tokens: Q = 4): every request lands on one replica, each replica's hits are
    whole cold prefills, round_robin splits 15/15 and consistent_hash keeps all 30 on one replica."""
    inner = run_inner(
        *fleet_args("--block-size", "4"), "--apc-set=prefix_groups=3", "--apc-set=prefix_len=33000"
    )  # prefix 330 tokens: S = 334, P = 332, Q = 4
    assert inner.ret == 0, inner.output[-6000:]
    data = results(tmp_path)
    runs = {r["id"]: r for r in data["runs"]}
    assert set(runs) == {"R-c8-round_robin", "R-c8-consistent_hash"}
    p = runs["R-c8-round_robin"]["prediction"]
    assert (p["shared_blocks"] * p["block_size"], p["header_block_tokens"], p["prefix_groups"]) == (332, 4, 3)
    assert p["expected_hits"] == 27 * 332 + 2 * 4
    spread = {}
    for run_id, run in runs.items():
        parts = run["repeat_counters"][0]["parts"]
        assert set(parts) == {"replica 1", "replica 2"}
        spread[run_id] = sorted(part["requests"] for part in parts.values())
        assert sum(part["prefix_cache_hits"] for part in parts.values()) == run["prefix_cache_hits"]
        assert f"--policy {run['route']}" in run["repeat_counters"][0]["router_command"]
        assert "--prometheus-port" in run["repeat_counters"][0]["router_command"]  # not the shared 29000
    assert spread == {"R-c8-round_robin": [15, 15], "R-c8-consistent_hash": [0, 30]}
    consistent = runs["R-c8-consistent_hash"]
    assert consistent["prefix_cache_hits"] == p["expected_hits"]  # one replica: exactly the prediction
    verdicts = {(v["name"], v["runs"][0]): v for v in data["verdicts"]}
    assert all(v["passed"] for v in verdicts.values()), [v["message"] for v in verdicts.values()]
    robin = verdicts[("prefix_locality", "R-c8-round_robin")]["numbers"]
    # Each replica saw every group: 3 cold prefills each, 6 in all where 3 would do.
    assert [r["cold_prefills"] for r in robin["replicas"]] == [3, 3]
    assert robin["extra_prefill_tokens"] == 3 * (332 - 4) + 4  # and replica 2 computes the header again
    assert robin["extra_prefill_tokens"] == robin["ideal_hits"] - robin["hits"]
    assert runs["R-c8-round_robin"]["prefix_cache_hits"] == 2 * (12 * 332 + 2 * 4)
    assert verdicts[("prefix_locality", "R-c8-consistent_hash")]["numbers"]["cold_prefills"] == 3


def test_an_api_key_reaches_every_replica_through_the_router(tmp_path, run_inner) -> None:
    """Replicas launched with --apc-api-key answer /v1 only with the bearer token (as vLLM does with
    VLLM_API_KEY): the benchmark sends it to vllm-router, which passes it on. The key is on no command
    line and in no file."""
    key = "sekrit-fleet-42"
    inner = run_inner(*fleet_args(), f"--apc-api-key={key}")
    assert inner.ret == 0, inner.output[-6000:]
    data = results(tmp_path)
    runs = {r["id"]: r for r in data["runs"]}
    assert set(runs) == {"R-c8-round_robin", "R-c8-consistent_hash"}
    for run in runs.values():
        assert sum(p["requests"] for p in run["repeat_counters"][0]["parts"].values()) == run["num_prompts"]
        assert "api-key" not in run["repeat_counters"][0]["router_command"]
    for member in data["servers"][0]["members"]:  # results.json is redacted: look for the flag, not the key
        assert "--api-key" not in member["command"]
    for replica in (1, 2):  # each replica was started with the key in its environment, and so wanted it
        log = next(tmp_path.glob(f"apc-results/*/server-apc-on-fleet-router-r{replica}.log")).read_text()
        assert "an API key is required on the /v1 routes" in log
    for path in tmp_path.glob("apc-results/**/*"):
        if path.is_file() and path.suffix in (".json", ".md", ".log"):
            assert key not in path.read_text(errors="replace"), path
    assert key not in inner.output


def _fleet_processes(run_dir) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(vllm-router processes, fake replicas) of the pytest run working in ``run_dir``. Found by their
    working directory: vllm-router writes its process title ("vllm::router") over its environment, so the
    PYTEST_APC_OWNER tag that tests/conftest.py's leftover check looks for is gone from it."""
    routers, replicas = [], []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.cwd() != str(run_dir) or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            argv = proc.cmdline()
        except (psutil.Error, OSError):
            continue
        if any(a.startswith("vllm::router") for a in argv[:1]) or any(a.endswith("/vllm-router") for a in argv[:2]):
            routers.append(proc)
        elif argv[1:2] == [str(FAKE_VLLM)]:
            replicas.append(proc)
    return routers, replicas


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


@pytest.mark.parametrize(
    ("phase", "extra"),
    [
        # Interrupted while the replicas load (they never get ready); their children must go too.
        ("startup", ("--fake-never-ready", "--fake-children", "2")),
        # Interrupted while the benchmark runs through the router (30,000 output tokens at 1 ms each).
        ("bench", ("--fake-children", "2", "--fake-ignore-sigterm")),
    ],
)
def test_interrupted_fleet_run_leaves_no_replica_or_router(tmp_path, run_inner, phase, extra) -> None:
    inner = run_inner(*fleet_args(*extra), "--apc-set=output_len=3000000", "--apc-set=startup_timeout=300", wait=False)
    marker = "apc-results/*/server-*-r2.log" if phase == "startup" else "apc-results/*/bench/*.log"
    inner.wait_for(tmp_path, marker, f"the {phase} phase", timeout=120)
    time.sleep(1.5)
    routers, replicas = _fleet_processes(tmp_path)
    assert len(replicas) == 2, [p.cmdline() for p in replicas]
    if phase == "bench":
        assert len(routers) == 1, "no vllm-router in front of the replicas"
    inner.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    inner.wait()
    assert inner.ret != 0
    assert time.monotonic() - signalled < 60, "the interrupted run waited for its replicas to become ready"
    assert not _running(routers + replicas), "interrupted fleet run left a router or a replica behind"
    assert _fleet_processes(tmp_path) == ([], [])
    assert not inner.leftovers(), "interrupted fleet run left processes behind"
