"""End to end against real vLLM: a session that measured the OFF run only, resumed with the whole pure pair.
The resumed session starts the APC-on server alone, and its verdicts judge the adopted OFF run with the new
ON run: on the exact CPU build every request's answer must still be the twin's, across the two sessions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TESTS_APC, InnerRun

pytestmark = pytest.mark.e2e


def test_a_resumed_session_starts_only_the_server_it_lacks_and_judges_across_sessions(tmp_path) -> None:
    common = [str(TESTS_APC), "-m", "pure and not sweep", "--cpu-node", f"--apc-results-dir={tmp_path}/apc-results"]
    first = InnerRun([*common, "-k", "test_apc_really_off"], tmp_path, timeout=900).wait()
    assert first.ret == 0, first.output[-5000:]
    (path,) = tmp_path.glob("apc-results/*/results.json")
    off = {run["id"]: run for run in json.loads(path.read_text())["runs"]}["C-c8"]

    resumed = InnerRun([*common, f"--apc-resume={path.parent}"], tmp_path, timeout=900).wait()
    assert resumed.ret == 0, resumed.output[-5000:]
    assert f"resumed: 1 run from {path.parent}, measuring 1 (on apc-on)" in resumed.output
    data = json.loads(path.read_text())
    assert data["server_launches"] == {"apc-off": 1, "apc-on": 1}
    assert {run["id"]: run for run in data["runs"]}["C-c8"] == off
    assert [pair["answers"] for pair in data["pairs"]] == ["30/30"]
    assert {v["name"] for v in data["verdicts"]} == {
        "apc_really_off", "cached_tokens_match", "prefill_saved", "ttft_gain", "same_answers",
    }  # fmt: skip
    assert all(v["passed"] for v in data["verdicts"]), data["verdicts"]
    report = subprocess.run([sys.executable, "-m", "pytest_apc", "report", str(path)], capture_output=True, text=True)
    assert report.returncode == 0, report.stdout + report.stderr
    resumed.require_nothing_left()
