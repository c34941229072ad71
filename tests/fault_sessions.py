"""Sessions of the APC suite against fresh real-vLLM servers, healthy or with a test fault
(``tests/vllm_fault.py``): the fault plugin's installation and environment, which the fault tests
(``tests/test_e2e_fault.py``) and the power scripts (``scripts/*_power.py``) share, and the scripts' session
loop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import TESTS_APC
from tests.vllm_fault import FAULT_ENV

HERE = Path(__file__).parent


def install_fault_plugin(folder: Path) -> Path:
    """A distribution whose ``vllm.general_plugins`` entry point is the fault plugin, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "vllm_fault.py", folder / "pytest_apc_test_fault.py")
    info = folder / "pytest_apc_test_fault-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest-apc-test-fault\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\napc_fault = pytest_apc_test_fault:register\n")
    return folder


def fault_env(work: Path, shape: str) -> dict[str, str]:
    """This process's environment with the fault plugin on the servers' path and ``shape`` chosen ("none":
    healthy, the plugin does nothing)."""
    plugin = install_fault_plugin(work / "plugin")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(plugin), os.environ.get("PYTHONPATH")) if p))
    env.pop(FAULT_ENV, None)
    if shape != "none":
        env[FAULT_ENV] = shape
    return env


def pytest_session(
    work: Path, env: dict[str, str], selection: list[str], timeout: float = 3600, node: list[str] | None = None
) -> tuple[subprocess.CompletedProcess, Any]:
    """The APC suite's ``selection`` on the CPU profile in ``work``, with fresh servers: the finished process
    and its results.json (None where it wrote none). ``node``: the profile's arguments instead (e.g.
    ``--gpu-node --apc-model-shape llama-3.1-8b``), with the suite as installed (``--pyargs tests_apc``)."""
    suite = ["--pyargs", "tests_apc", *node] if node else [str(TESTS_APC), "--cpu-node"]
    args = [sys.executable, "-m", "pytest", *suite, *selection, "-q",
            "-p", "no:cacheprovider", f"--apc-results-dir={work}/apc-results"]  # fmt: skip
    done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    files = sorted(work.glob("apc-results/*/results.json"))
    return done, json.loads(files[0].read_text()) if files else None


def record_sessions(
    session: Callable[[str, Path], dict[str, Any]], sessions: int, shapes: list[str], json_path: Path | None
) -> list[dict[str, Any]]:
    """``sessions`` rounds of one session per shape, each in a folder of its own; every record printed as a
    JSON line and the list rewritten to ``json_path`` after each session (an interrupted loop keeps its
    sessions)."""
    records: list[dict[str, Any]] = []
    for number in range(sessions):
        for shape in shapes:
            with tempfile.TemporaryDirectory(prefix=f"apc-session-{shape}-") as work:
                record = session(shape, Path(work))
            record["session"] = number + 1
            records.append(record)
            print(json.dumps(record), flush=True)
            if json_path:
                json_path.write_text(json.dumps(records, indent=1) + "\n")
    return records
