"""Sessions of the APC suite against fresh real-vLLM servers, healthy or with a test fault
(``tests/vllm_fault.py``): the loop the power scripts (``scripts/*_power.py``) share."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.test_e2e_fault import install_fault_plugin


def fault_env(work: Path, shape: str) -> dict[str, str]:
    """This process's environment with the fault plugin on the servers' path and ``shape`` chosen ("none":
    healthy, the plugin does nothing)."""
    plugin = install_fault_plugin(work / "plugin")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(plugin), os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTEST_APC_TEST_FAULT", None)
    if shape != "none":
        env["PYTEST_APC_TEST_FAULT"] = shape
    return env


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
