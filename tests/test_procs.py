"""Process groups, the GPU node lock, and the KV-capacity check before measuring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_apc import config as apc_config
from pytest_apc.measure.session import ApcSession
from pytest_apc.serving import process as procs
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload.cases import RunKey, ServerMode


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


@pytest.mark.parametrize(("mode", "measured"), [("warn", True), ("fail", False)])
def test_kv_working_set_beyond_capacity(pytester: pytest.Pytester, tmp_path: Path, mode: str, measured: bool) -> None:
    settings = apc_config.resolve(pytester.parseconfig("--cpu-node", f"--apc-kv-check={mode}"), environ={})
    session = ApcSession(settings=settings, run_dir=tmp_path, json_path=tmp_path / "r.json")
    info = ServerInfo(mode="apc-on", command=[], url="", log="", block_size=128, num_gpu_blocks=40,
                      chat_header_tokens=26)  # fmt: skip
    keys = [RunKey("D", 1), RunKey("D", 8)]
    kept = session._check_kv_capacity(keys, info)
    assert (RunKey("D", 8) in kept) is measured
    assert RunKey("D", 1) in kept  # 17 blocks fit in 40
    assert session.measured.warnings == [
        "run D-c8: concurrency 8 x 17 blocks per request = 136 KV-cache blocks, more than the apc-on server's 40 "
        "(block size 128): expect preemptions and evicted prefix blocks"
    ]
    assert (RunKey("D", 8) in session.measured.errors) is not measured


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
        server_mod.Reach(served_model_name="apc-model", log_path=tmp_path / "server.log", startup_timeout=30),
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
