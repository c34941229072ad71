"""--apc-resume: a session continues an earlier session's run folder, measuring only the runs it lacks (a
failed or interrupted run is not measured), and refuses to mix in runs measured under other conditions.
Against tests/fake_vllm.py: the fault hits a server's 14th request, the first of the second run on it (each
run sends 4 benchmark requests and 8 answer probes), so a resumed session's fresh server measures that run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pytest_apc.measure.session import ApcSession
from pytest_apc.workload.cases import RunKey, workload_for
from pytest_apc.workload.models import ensure_tiny_model
from tests.test_faults import fake_args
from tests.test_verdict import off_delta, record, settings

SUITE = """
import pytest
from pytest_apc import verdicts

pytestmark = pytest.mark.apc

@pytest.mark.apc_cases("CD", sweep=True)
def test_measured(apc_run):
    assert apc_run.repeats

@pytest.mark.apc_cases("C", sweep=True)
def test_off(apc_run, apc_assert):
    apc_assert(verdicts.apc_really_off(apc_run))
"""
SWEEP = ("--apc-set=sweep_concurrency=1,2", "--apc-set=sweep_cases=CD")


def _args(*fault: str) -> list[str]:
    """The suite's sweep on the fake, with ``fault`` (fake flags) on the APC-on server only."""
    flags = [f"--fake-if-log=apc-on {' '.join(fault)}"] if fault else []
    return [*fake_args(*flags), *SWEEP]


def _folder(root: Path) -> Path:
    (folder,) = root.glob("apc-results/*/results.json")
    return folder.parent


def _doc(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def _runs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["id"]: run for run in doc["runs"]}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_apc", *args], capture_output=True, text=True, check=False)


def test_a_resumed_session_measures_only_the_runs_missing_and_its_file_reads_like_one_sessions(
    tmp_path, run_inner
) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    # The first job's machine has the generated model in its cache; the resumed job runs on another.
    machine = tmp_path / "first-machine"
    tiny = ensure_tiny_model()
    shutil.copytree(tiny, machine / "models" / tiny.name)
    # The APC-on server dies in D-c2, its second run (4 prompts a run; no probe on an exact build).
    fault = ("--fake-die-after-requests", "6")
    first = run_inner(*_args(*fault), env={"PYTEST_APC_CACHE_DIR": str(machine)})
    assert first.ret == 1, first.output[-3000:]
    folder = _folder(tmp_path)
    before = _doc(folder)
    assert sorted(_runs(before)) == ["C-c1", "C-c2", "D-c1"]
    assert list(before["errors"]) == ["D-c2"]

    other = machine.rename(tmp_path / "other-machine")  # the model the first job's runs name is not here
    resumed = run_inner(*_args(*fault), f"--apc-resume={folder}", env={"PYTEST_APC_CACHE_DIR": str(other)})
    assert resumed.ret == 0, resumed.output[-3000:]
    assert str(other / "models" / tiny.name) in (folder / "server-apc-on.log").read_text()
    assert f"resumed: 3 runs from {folder}, measuring 1 (on apc-on)" in resumed.output
    assert "apc-off: launching" not in resumed.output  # every run of the OFF server is there: not started
    assert "apc-on: run 4 of 4: measuring D-c2" in resumed.output
    assert "measuring D-c1" not in resumed.output
    merged = _doc(folder)  # the same folder, continued
    assert list(tmp_path.glob("apc-results/*")) == [folder]
    assert sorted(_runs(merged)) == ["C-c1", "C-c2", "D-c1", "D-c2"]
    assert merged["errors"] == {}
    assert merged["server_launches"] == {"apc-off": 1, "apc-on": 2}
    for run_id in ("C-c1", "C-c2", "D-c1"):  # adopted as measured, every number as the first session wrote it
        assert _runs(merged)[run_id] == _runs(before)[run_id]
    assert merged["started_at"] == before["started_at"]

    # One session that was never interrupted, for what the merged file must read like.
    single = run_inner(*_args(), "--apc-results-dir=single")
    assert single.ret == 0, single.output[-3000:]
    (single_path,) = tmp_path.glob("single/*/results.json")
    one = json.loads(single_path.read_text())
    assert list(merged) == list(one)  # the same blocks, in the same order
    assert [s["mode"] for s in merged["servers"]] == [s["mode"] for s in one["servers"]] == ["apc-off", "apc-on"]
    assert [(v["test"], v["name"], v["passed"]) for v in merged["verdicts"]] == [
        (v["test"], v["name"], v["passed"]) for v in one["verdicts"]
    ]
    # The rows: adopted and new runs alike, the answers under load too (from the runs kept in full).
    same = ("pair", "concurrency", "cached_tokens", "expected_cached_tokens", "answers", "verdict")
    assert [[row[k] for k in same] for row in merged["pairs"]] == [[row[k] for k in same] for row in one["pairs"]]
    assert [row["answers"] for row in merged["pairs"]] == ["4/4", "4/4"]
    for row in merged["pairs"]:  # an adopted run's latencies, as the first session wrote them (not n/a)
        assert row["median_e2el_off_ms"] == _runs(before)[f"C-c{row['concurrency']}"]["median_e2el_ms"] is not None
    hits = {run_id: run["prefix_cache_hits"] for run_id, run in _runs(one).items()}
    assert {run_id: run["prefix_cache_hits"] for run_id, run in _runs(merged).items()} == hits
    for path in (folder / "results.json", single_path):
        report = _cli("report", str(path))
        assert report.returncode == 0, report.stdout + report.stderr
    compared = _cli("compare", str(folder / "results.json"), str(folder / "results.json"), "--repeats", "1")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "baseline gate: passed" in compared.stdout


def test_a_run_interrupted_by_sigterm_is_measured_again(tmp_path, run_inner) -> None:
    """A pre-empted job: SIGTERM while D-c2's benchmark runs (its server hangs), then the same command with
    --apc-resume. The interrupted run is not in the first file; the resumed session measures it, and only it."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    fault = ("--fake-hang-after-requests", "6")
    first = run_inner(*_args(*fault), wait=False)
    first.wait_for(tmp_path, "apc-results/*/bench/D-c2.log", "D-c2's benchmark")
    time.sleep(1.5)
    first.proc.send_signal(signal.SIGTERM)
    first.wait()
    assert first.ret == 2, first.output[-3000:]  # interrupted
    folder = _folder(tmp_path)
    assert sorted(_runs(_doc(folder))) == ["C-c1", "C-c2", "D-c1"]

    resumed = run_inner(*_args(*fault), f"--apc-resume={folder}")
    assert resumed.ret == 0, resumed.output[-3000:]
    assert f"resumed: 3 runs from {folder}, measuring 1 (on apc-on)" in resumed.output
    merged = _doc(folder)
    assert sorted(_runs(merged)) == ["C-c1", "C-c2", "D-c1", "D-c2"]
    assert merged["errors"] == {}


def test_a_session_measured_under_other_conditions_is_refused_naming_what_differs(tmp_path, run_inner) -> None:
    """A setting that changes what is measured and another pytest-apc are refused before anything starts;
    another vLLM once a server says so (as a baseline of another block size is): one line, exit code 4."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    first = run_inner(*_args(), "-k", "test_off", "--apc-set=sweep_concurrency=1")  # C-c1 only
    assert first.ret == 0, first.output[-3000:]
    measured = _folder(tmp_path)

    def copy(name: str, **environment: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(measured, folder)
        doc = _doc(folder)
        doc["environment"].update(environment)
        for server in doc["servers"]:
            server["version"] = environment.get("vllm", server["version"])
        (folder / "results.json").write_text(json.dumps(doc))
        return folder

    folder = copy("settings")
    changed = run_inner(*_args(), f"--apc-resume={folder}", "--apc-set=num_prompts=8")
    assert changed.ret == 4, changed.output[-3000:]
    assert f"ERROR: cannot resume {folder}: num_prompts 8 here vs 4 there (there: the session that measured it)" in (
        changed.output
    )
    assert "launching" not in changed.output

    folder = copy("plugin", pytest_apc="0.0.1")
    other_plugin = run_inner(*_args(), f"--apc-resume={folder}")
    assert other_plugin.ret == 4, other_plugin.output[-3000:]
    assert f"cannot resume {folder}: pytest_apc " in other_plugin.output
    assert " here vs 0.0.1 there" in other_plugin.output

    folder = copy("vllm", vllm="0.26.0")
    (folder / "store.json").unlink()  # without the store, C-c1 is adopted as the results file holds it
    other_vllm = run_inner(*_args(), f"--apc-resume={folder}", "-k", "test_off")  # C-c2 needs the OFF server
    assert other_vllm.ret == 4, other_vllm.output[-3000:]
    refusal = f"cannot resume {folder}: vllm 0.0.0-fake here vs 0.26.0 there (there: the session that measured it)"
    assert refusal in other_vllm.output
    assert f"resumed: 1 run from {folder}, measuring 1 (on apc-off)" in other_vllm.output
    doc = _doc(folder)
    assert doc["errors"] == {"C-c2": f"run C-c2 was not measured: {refusal}"}
    assert sorted(_runs(doc)) == ["C-c1"]  # the adopted run stays


def test_a_session_with_a_time_limit_begins_nothing_that_could_end_after_it(tmp_path, run_inner) -> None:
    """--apc-set stop_after: the APC-off server takes 10 s to start, so once its runs are measured a second
    start-up (the mean so far) and a run cannot end within 20 s. The APC-on server is not started, its runs fail
    naming the limit and the resume command, and --apc-resume measures only them."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    slow_off = fake_args("--fake-if-log=apc-off --fake-startup-delay 10")
    first = run_inner(*slow_off, *SWEEP, "--apc-set=stop_after=20")
    assert first.ret == 1, first.output[-3000:]
    folder = _folder(tmp_path)
    assert "not measuring any more: the session's time is up (--apc-set stop_after=20)" in first.output
    assert f"measure the runs left with --apc-resume {folder}" in first.output
    assert "apc-on: launching" not in first.output
    before = _doc(folder)
    measured = sorted(_runs(before))
    assert measured[:1] == ["C-c1"]  # 10 s in, and no run measured yet: it may take any time
    assert set(measured) <= {"C-c1", "C-c2"}
    assert {"D-c1", "D-c2"} <= set(before["errors"])
    assert all("the session's time is up" in message for message in before["errors"].values())

    resumed = run_inner(*slow_off, *SWEEP, f"--apc-resume={folder}")
    assert resumed.ret == 0, resumed.output[-3000:]
    left = 4 - len(measured)
    runs = "run" if len(measured) == 1 else "runs"  # one when the machine is slow: only C-c1 fitted
    assert f"resumed: {len(measured)} {runs} from {folder}, measuring {left}" in resumed.output
    merged = _doc(folder)
    assert sorted(_runs(merged)) == ["C-c1", "C-c2", "D-c1", "D-c2"]
    assert merged["errors"] == {}
    for run_id in measured:
        assert _runs(merged)[run_id] == _runs(before)[run_id]
    compared = _cli("compare", str(folder / "results.json"), str(folder / "results.json"), "--repeats", "1")
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_a_run_of_a_kind_not_measured_yet_is_estimated_from_the_prompt_tokens_it_sends(pytester, tmp_path) -> None:
    """--apc-set stop_after before the first run of a case family at a concurrency: the longest run at that
    concurrency, scaled by the prompt tokens the two send. Seen on one H100 (8B shape, full scale, 3 repeats):
    C-c1 took 315 s, and E-c1, whose prompts are twice as long, was still measuring 530 s after it began."""
    s = settings(pytester, "--apc-length-scale=1", "--apc-set=num_prompts=30", "--apc-set=stop_after=1000")
    session = ApcSession(settings=s, run_dir=tmp_path, json_path=tmp_path / "results.json")
    c1 = record(s, "C", 1, off_delta(s, "C"), 1375.0)
    c1.wall_s = 315.0
    a8 = record(s, "A", 8, off_delta(s, "A"), 3133.0)
    a8.wall_s = 180.0
    session.measured.records.update({c1.key: c1, a8.key: a8})
    session.began -= 500  # 500 s into the session
    rag, pure = (c1.workload.prompt_len, workload_for("rag", s).prompt_len)[::-1]
    assert (rag, pure) == (32_000 + 32_768, 32_768 + 1024)
    scaled = 315.0 * rag / pure  # 604 s: 500 + 604 > 1000
    why = session._out_of_time(RunKey("E", 1), starting=False)
    assert why is not None
    assert f"run E-c1 could take {scaled:,.0f} s (the longest at its concurrency so far, C-c1, scaled" in why
    assert session._out_of_time(RunKey("C", 2), starting=False) is None  # none at c2: C-c1's 315 s, of any
    session.began -= 200  # 700 s in
    assert "D-c1 could take 315 s (the longest like it so far)" in (session._out_of_time(RunKey("D", 1), False) or "")
    session.began += 600  # 100 s in: E-c1 fits
    assert session._out_of_time(RunKey("E", 1), starting=False) is None
