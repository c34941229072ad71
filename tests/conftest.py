"""Shared helpers for pytest-apc's own tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_apc.config import Settings, default_for, setting_names
from tests.installed import installed, sdist, wheel  # noqa: F401  (session fixtures: the installed wheel)

REPO = Path(__file__).resolve().parent.parent
FAKE_VLLM = REPO / "tests" / "fake_vllm.py"
TESTS_APC = REPO / "tests_apc"


def default_settings(profile: str | None = "gpu", **changes: Any) -> Settings:
    """Every setting at its default for ``profile``, with ``changes`` (no pytest config, nothing checked)."""
    values = {name: default_for(name, profile) for name in setting_names()}
    return replace(Settings(**{**values, "profile": profile}, sources={}), **changes)


def apc_processes(root_pid: int) -> list[psutil.Process]:
    """Live processes launched by the pytest run whose pid is ``root_pid`` (tagged PYTEST_APC_OWNER)."""
    prefix = f"{root_pid}-"
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("PYTEST_APC_OWNER", "").startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def vllm_servers() -> list[psutil.Process]:
    """Every live vLLM API server or fake on this machine (for no-leftover checks)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if ("vllm.entrypoints.openai.api_server" in cmd or "fake_vllm.py" in cmd) and proc.pid != os.getpid():
            found.append(proc)
    return found


class InnerRun:
    """A pytest subprocess running the plugin, with its output, exit code and pid."""

    def __init__(
        self,
        args: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
        timeout: float = 900,
        command: list[str] | None = None,
    ) -> None:
        """``command``: what runs pytest (default: this interpreter's); an installed ``pytest-apc`` runs without
        this checkout on the path."""
        full_env = {**os.environ, **(env or {})}
        full_env.pop("PYTEST_XDIST_WORKER", None)
        full_env.pop("PYTEST_ADDOPTS", None)
        if command is not None:
            full_env.pop("PYTHONPATH", None)
        self.args = args
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "pytest"]), "-p", "no:cacheprovider", *args],
            cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.timeout = timeout
        self.output = ""
        self.ret: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self) -> InnerRun:
        self.output, _ = self.proc.communicate(timeout=self.timeout)
        self.ret = self.proc.returncode
        return self

    def require_nothing_left(self) -> None:
        """Kill whatever this run left behind, then fail naming it."""
        left = self.leftovers()
        for proc in left:
            proc.kill()
        assert not left, f"processes left behind by {self.args}: {[p.cmdline() for p in left]}"

    def wait_for(self, root: Path, pattern: str, what: str, timeout: float = 90) -> None:
        """Wait until a file matching ``pattern`` exists under ``root`` (the run reached a phase)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not list(root.glob(pattern)):
            time.sleep(0.2)
        assert list(root.glob(pattern)), f"never reached {what}"

    def leftovers(self, settle: float = 5.0) -> list[psutil.Process]:
        deadline = time.monotonic() + settle
        while True:
            left = apc_processes(self.pid)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.25)


@pytest.fixture
def run_inner(tmp_path: Path):
    """Run pytest with the plugin in a subprocess inside tmp_path; asserts nothing is left behind."""
    runs: list[InnerRun] = []

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 900, wait: bool = True) -> InnerRun:
        inner = InnerRun(list(args), tmp_path, env=env, timeout=timeout)
        runs.append(inner)
        return inner.wait() if wait else inner

    yield run
    for inner in runs:
        if inner.ret is None:
            inner.proc.kill()
            inner.proc.wait()
        inner.require_nothing_left()
