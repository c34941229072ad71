"""Process groups, the GPU node lock, the KV-capacity check before measuring, and the faults of the three
launched processes (server, router, benchmark worker), which share one executor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_apc import config as apc_config
from pytest_apc.measure.bench import BenchError, BenchRunner
from pytest_apc.measure.session import ApcSession
from pytest_apc.serving import process as procs
from pytest_apc.serving.endpoint import Reach
from pytest_apc.serving.fleet import Fleet
from pytest_apc.serving.interface import ServerError, ServerInfo
from pytest_apc.serving.preflight import node_lock_needed
from pytest_apc.serving.router import Router
from pytest_apc.serving.server import LaunchedServer
from pytest_apc.workload.cases import RunKey, ServerMode, workload_for
from pytest_apc.workload.plan import PlannedRun
from tests.conftest import FAKE_VLLM, default_settings

# Both single servers run elsewhere.
ELSEWHERE = {"url_on": "http://on:8000", "url_off": "http://off:8000"}


@pytest.fixture(autouse=True)
def own_tag(tmp_path: Path) -> Iterator[str]:
    """Each test here launches under an owner tag and registry of its own. The xdist workers of one run share
    the run's, and a pytest run inside another worker's test (pytester) that stops with a usage error reaps
    them when it unconfigures: it would kill what this test launched."""
    saved = procs.owner_tag(), str(procs.registry_dir())
    tag, _ = procs.configure(registry=str(tmp_path / "registry"))
    yield tag
    procs.configure(*saved)


def test_node_lock_names_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "node.lock"
    handle = procs.acquire_node_lock(lock)
    try:
        code = (
            "import sys\nfrom pathlib import Path\nfrom pytest_apc.serving import process as procs\n"
            f"try:\n    procs.acquire_node_lock(Path({str(lock)!r}))\nexcept RuntimeError as e:\n"
            "    print(e); sys.exit(7)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        assert out.returncode == 7
        assert "another pytest-apc run holds this node's GPUs (pid" in out.stdout
        assert "--apc-url-on/--apc-url-off" in out.stdout
    finally:
        handle.close()
    procs.acquire_node_lock(lock).close()  # free again once the holder is gone


@pytest.mark.parametrize(
    ("profile", "changes", "runs", "undeclared", "why"),
    [
        ("cpu", {}, ["D-c8"], 0, None),  # the lock is the GPUs'
        ("gpu", {}, ["D-c8"], 0, "run D-c8 starts the apc-on server on this node"),
        ("gpu", ELSEWHERE, ["A-c8", "B-c8", "D-c1"], 0, None),
        ("gpu", ELSEWHERE, ["D-c8", "D-c8-xxhash"], 0, "run D-c8-xxhash starts the apc-on-xxhash server on this node"),
        ("gpu", ELSEWHERE, ["O-c1"], 0, "run O-c1 starts the apc-on-offload-tier server on this node"),
        ("gpu", ELSEWHERE, ["R-c8-dp"], 0, "run R-c8-dp starts the apc-on-fleet-dp server on this node"),
        ("gpu", {**ELSEWHERE, "fleet_url": "http://gw:1"}, ["R-c8-external"], 0, None),
        ("gpu", ELSEWHERE, [], 2, "2 selected tests use apc_session without apc_cases, so any server might start"),
    ],
)
def test_the_node_lock_is_needed_for_a_run_that_starts_a_server_here(
    profile: str, changes: dict[str, str], runs: list[str], undeclared: int, why: str | None
) -> None:
    settings = default_settings(profile, **changes)
    assert node_lock_needed(settings, [RunKey.parse(run) for run in runs], undeclared) == why


def test_stop_escalates_to_sigkill_and_reaches_the_group(tmp_path: Path) -> None:
    import psutil

    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)']) for _ in range(2)]\n"
        "print('ready', flush=True)\ntime.sleep(1000)\n"
    )
    with (tmp_path / "log").open("wb") as log:
        proc = procs.spawn([sys.executable, "-c", script], {}, log)
    import time

    deadline = time.monotonic() + 10
    while b"ready" not in (tmp_path / "log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = psutil.Process(proc.pid).children()
    assert len(kids) == 2
    started = time.monotonic()
    procs.stop(proc, grace=1.0)
    assert time.monotonic() - started < 8
    assert proc.returncode is not None
    assert all(not k.is_running() or k.status() == psutil.STATUS_ZOMBIE for k in kids)
    assert not list(procs.registry_dir().glob(f"{proc.pid}.pgid"))


def test_reap_kills_a_registered_worker_and_not_a_later_process_given_its_pid(tmp_path: Path) -> None:
    """An xdist worker registers itself: when its controller is killed outright, the guard's reap stops it (it
    would go on running tests and starting servers). A registration whose start time does not match the
    process now holding that pid is another process, and lives."""
    registry = procs.registry_dir()
    code = (
        "import sys, time\nfrom pytest_apc.serving import process as p\n"
        f"p.configure('worker-of-another-tag', {str(registry)!r})\np.register_worker()\n"
        "print('ready', flush=True)\ntime.sleep(1000)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == b"ready\n"
        assert (registry / f"{worker.pid}.pid").is_file()
        (registry / f"{bystander.pid}.pid").write_text("12345.0")  # a worker that ran long ago, under this pid
        killed = procs.reap()
        assert worker.pid in killed
        assert bystander.pid not in killed
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
        assert not list(registry.glob("*.pid"))
    finally:
        for proc in (worker, bystander):
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the clock-tick stamp is read from /proc")
def test_a_run_still_running_when_the_wall_clock_is_adjusted_is_not_taken_for_gone(monkeypatch) -> None:
    """The guard asks every half second whether its pytest still runs, and kills the run's servers once it
    does not. An adjustment of the wall clock (NTP) moves psutil's create_time by a whole second; a guard
    that compared it took a live pytest for gone and killed its servers and benchmarks mid-run."""
    import psutil
    import psutil._pslinux as linux

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    try:
        stamp, created = procs.start_stamp(child.pid), psutil.Process(child.pid).create_time()
        real = linux.boot_time
        monkeypatch.setattr(linux, "boot_time", lambda: real() + 1.0)  # the clock stepped by a second
        assert psutil.Process(child.pid).create_time() != created  # what the guard compared before
        assert procs.running(child.pid, stamp)
    finally:
        child.kill()
        child.wait()
    assert not procs.running(child.pid, stamp)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 cannot start a child in a group of its own only")
def test_a_child_has_a_process_group_of_its_own_in_pytests_session(tmp_path: Path) -> None:
    """Its own group, so that stopping reaches its whole tree; pytest's session, so that a server's busy poll
    on a shared core yields to the benchmark client (Linux's autogroups share CPU time between sessions)."""
    with (tmp_path / "log").open("wb") as log:
        proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], {}, log)
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert os.getsid(proc.pid) == os.getsid(0)
    finally:
        procs.stop(proc, grace=1.0)


@pytest.mark.parametrize(("mode", "measured"), [("warn", True), ("fail", False)])
def test_kv_working_set_beyond_capacity(pytester: pytest.Pytester, tmp_path: Path, mode: str, measured: bool) -> None:
    """C-c8 holds 8 x 17 blocks (APC off: nothing shared) and is warned or refused; D-c8 holds its 16 blocks of
    shared prefix once and 1 block per request, 24 in all, and runs without a warning in either mode."""
    settings = apc_config.resolve(pytester.parseconfig("--cpu-node", f"--apc-set=kv_check={mode}"), environ={})
    session = ApcSession(settings=settings, run_dir=tmp_path, json_path=tmp_path / "r.json")
    pure = workload_for("pure", settings)
    kept = []
    for server_mode, case in (("apc-off", "C"), ("apc-on", "D")):  # each case on the server it runs on
        info = ServerInfo(mode=server_mode, command=[], url="", log="", block_size=128, num_gpu_blocks=40,
                          chat_header_tokens=26)  # fmt: skip
        runs = [PlannedRun(RunKey(case, c), pure) for c in (1, 8)]
        kept += [run.key for run in session._check_kv_capacity(runs, info)]
    assert (RunKey("C", 8) in kept) is measured
    assert {RunKey("C", 1), RunKey("D", 1), RunKey("D", 8)} <= set(kept)  # 17 blocks fit in 40; D-c8 holds 24
    assert session.measured.warnings == [
        "run C-c8: concurrency 8 x 17 blocks per request = 136 KV-cache blocks, more than the apc-off server's 40 "
        "(block size 128): expect preemptions and evicted prefix blocks"
    ]
    assert (RunKey("C", 8) in session.measured.errors) is not measured
    assert RunKey("D", 8) not in session.measured.errors


def test_port_taken_between_choice_and_bind_is_retried(tmp_path: Path, monkeypatch) -> None:
    """Another process grabs the chosen port first: the server fails with "Address already in use" and the
    launch is retried on a fresh port (one server in the end, nothing left behind)."""
    import socket

    from pytest_apc.serving import executor
    from pytest_apc.serving import server as server_mod
    from tests.conftest import FAKE_VLLM

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1]])
    real_free_port = executor.free_port
    monkeypatch.setattr(executor, "free_port", lambda host: next(ports, None) or real_free_port(host))
    fake = [sys.executable, str(FAKE_VLLM), "--model", "m", "--served-model-name", "apc-model"]
    srv = server_mod.LaunchedServer(
        ServerMode(True),
        lambda port: [*fake, "--port", str(port), "--enable-prefix-caching"],
        Reach(served_model_name="apc-model", log_path=tmp_path / "server.log", startup_timeout=30),
        bind_host="127.0.0.1",
        connect_host="127.0.0.1",
        env={},
        stop_timeout=3,
    )
    try:
        info = srv.start()
        assert srv.port != busy.getsockname()[1]
        assert info.block_size == 16
        assert "Address already in use" in (tmp_path / "server.log").read_text()
    finally:
        srv.stop()
        busy.close()


# -- the three launchers share one executor: each fault fails alike, with its log, and leaves nothing ----------

FAKE = [sys.executable, str(FAKE_VLLM)]


@dataclass
class Launcher:
    """One of the three launchers, run on the fake: ``start`` raises the launcher's own error when the
    process will not serve; ``stop`` is what the session calls at the end."""

    start: Callable[[], object]
    stop: Callable[[], None]


def server(tmp_path: Path, *flags: str, timeout: float) -> Launcher:
    srv = LaunchedServer(
        ServerMode(True),
        lambda port: [*FAKE, "--served-model-name", "apc-model", "--port", str(port), *flags],
        Reach(served_model_name="apc-model", log_path=tmp_path / "server.log", startup_timeout=timeout),
        bind_host="127.0.0.1", connect_host="127.0.0.1", env={}, stop_timeout=1,
    )  # fmt: skip
    return Launcher(srv.start, srv.stop)


def router(tmp_path: Path, *flags: str, timeout: float, extra: tuple[str, ...] = ()) -> Router:
    return Router(
        [*FAKE, *flags], extra, bind_host="127.0.0.1", connect_host="127.0.0.1", log_path=tmp_path / "router.log",
        env={}, startup_timeout=timeout, stop_timeout=1,
    )  # fmt: skip


def routed(tmp_path: Path, *flags: str, timeout: float) -> Launcher:
    r = router(tmp_path, *flags, timeout=timeout)
    return Launcher(lambda: r.start("round_robin", ["http://127.0.0.1:1"]), r.stop)


def worker(tmp_path: Path, *flags: str, timeout: float) -> Launcher:
    runner = BenchRunner(tmp_path / "bench-worker", command=[*FAKE, "--fake-bench-worker", *flags])
    return Launcher(lambda: runner.run([], tmp_path / "r.json", 1, tmp_path / "run.log", timeout), runner.close)


LAUNCHERS = {"server": server, "router": routed, "worker": worker}
LOG_KIND = {"server": "server", "router": "router", "worker": "benchmark worker"}
ERROR = (ServerError, BenchError)


@pytest.fixture
def nothing_left(own_tag: str) -> Callable[[], None]:
    """Checks that no process this test launched lives on."""

    def check() -> None:
        left = procs.leftovers(own_tag)
        for proc in left:
            proc.kill()
        assert not left, [p.cmdline() for p in left]

    return check


# fault: (fake switches, timeout, what each launcher says, the line of the log's tail that says why)
FAULTS = {
    "crashes-at-start": (
        ("--fake-crash-on-start", "--fake-children", "2"),
        120,
        {
            "server": "apc-on server exited with code 3 while starting",
            "router": "vllm-router (round_robin) exited with code 3 while starting",
            "worker": "benchmark process died with exit code 3",
        },
        "RuntimeError: CUDA out of memory (fake)",
    ),
    # A flag the program does not know (from --apc-server-arg, --apc-set router_arg, in a worker command).
    "refuses-a-flag": (
        ("--fake-refuse=--no-such-flag", "--no-such-flag"),
        120,
        {
            "server": "apc-on server exited with code 2 while starting",
            "router": "vllm-router (round_robin) exited with code 2 while starting",
            "worker": "benchmark process died with exit code 2",
        },
        "error: unrecognized arguments: --no-such-flag",
    ),
    # Never ready (it never listens, the worker never reads its request), with children, ignoring SIGTERM:
    # after the timeout the whole group is killed, SIGTERM escalated to SIGKILL.
    "hangs": (
        ("--fake-startup-delay=600", "--fake-children", "2", "--fake-ignore-sigterm"),
        2,
        {
            "server": "apc-on server was not ready after 2 s (still waiting for the process to listen (/health))",
            "router": "vllm-router (round_robin) did not answer /health within 2 s",
            "worker": "benchmark did not finish within 2 s (--apc-set bench_timeout); it was killed",
        },
        "INFO fake child pid=",
    ),
}


@pytest.mark.parametrize("kind", LAUNCHERS)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_process_that_will_not_serve_fails_in_seconds_with_its_log_and_leaves_nothing(
    tmp_path: Path, nothing_left: Callable[[], None], fault: str, kind: str
) -> None:
    flags, timeout, said, why = FAULTS[fault]
    launcher = LAUNCHERS[kind](tmp_path, *flags, timeout=timeout)
    started = time.monotonic()
    try:
        with pytest.raises(ERROR) as err:
            launcher.start()
    finally:
        launcher.stop()
    assert time.monotonic() - started < 30
    nothing_left()
    message = str(err.value)
    assert said[kind] in message
    if (fault, kind) != ("hangs", "worker"):  # a worker that timed out is described by its benchmark's log
        assert f"--- last lines of the {LOG_KIND[kind]} log ---" in message
        assert why in message
        assert "fake_vllm.py" in message  # the command, or the log's header line that names it


def test_a_router_port_taken_between_choice_and_bind_is_retried(tmp_path: Path, monkeypatch, nothing_left) -> None:
    """As a server's: the router fails with "Address already in use" and starts again on a fresh port."""
    import socket

    from pytest_apc.serving import executor

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    ports = iter([busy.getsockname()[1]])
    real_free_port = executor.free_port
    monkeypatch.setattr(executor, "free_port", lambda host: next(ports, None) or real_free_port(host))
    r = router(tmp_path, timeout=30)
    try:
        r.start("round_robin", ["http://127.0.0.1:1"])
        assert r.port != busy.getsockname()[1]
        assert r.alive()
        assert "Address already in use" in (tmp_path / "router.log").read_text()
    finally:
        r.stop()
        busy.close()
    nothing_left()


def test_a_killed_router_is_named_by_its_fleet_with_its_log(tmp_path: Path, nothing_left) -> None:
    r = router(tmp_path, "--fake-children", "2", timeout=30)
    fleet = Fleet(ServerMode(True, fleet="router"), [], router=r, log_path=r.log_path)
    try:
        r.start("consistent_hash", ["http://127.0.0.1:1"])
        assert fleet.watch() is None
        proc = r._process.proc  # the test plays the OOM killer
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert fleet.watch() == f"vllm-router (consistent_hash) exited; its log: {r.log_path}"
        with pytest.raises(ServerError) as err:
            fleet.check_alive("before the run")
        assert "vllm-router (consistent_hash) is not running before the run\ncommand: " in str(err.value)
        assert "--- last lines of the router log ---" in str(err.value)
    finally:
        r.stop()
    nothing_left()  # its children went with it: the failure stopped its group


def test_a_worker_killed_mid_benchmark_fails_the_run_and_the_next_run_gets_a_new_one(
    tmp_path: Path, nothing_left
) -> None:
    runner = BenchRunner(tmp_path / "w", command=[*FAKE, "--fake-bench-worker", "--fake-hang", "--fake-children", "1"])
    killed: list[int] = []

    def kill() -> None:
        if not killed and runner.proc is not None:
            killed.append(runner.proc.pid)
            os.kill(runner.proc.pid, signal.SIGKILL)

    try:
        with pytest.raises(BenchError) as err:
            runner.run([], tmp_path / "r.json", 1, tmp_path / "run.log", timeout=60, watch=kill)
        assert "benchmark process died with exit code -9\nre-run: " in str(err.value)
        assert "worker log: " in str(err.value)
        assert runner.proc is None
        nothing_left()  # its child went with it
        runner.prewarm()
        assert runner.proc is not None
        assert runner.proc.pid not in killed
    finally:
        runner.close()
    nothing_left()


def test_a_run_stopped_by_a_usage_error_reaps_nothing_of_the_run_around_it(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    """An in-process pytest run that stops with a usage error before it configured its own owner tag
    (an invalid setting) must not reap the processes of the run it runs inside: they carry that run's tag."""
    with (tmp_path / "log").open("wb") as log:
        proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], {}, log)
    try:
        result = pytester.runpytest_inprocess("--cpu-node", "--apc-set=num_prompts=0")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        time.sleep(0.2)
        assert proc.poll() is None, "the inner run's unconfigure killed a process of the outer run"
    finally:
        procs.stop(proc, grace=1.0)
