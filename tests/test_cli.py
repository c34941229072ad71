"""``python -m pytest_apc``: a results file re-read (``report``) and two compared (``compare``), on the committed
H200 results (first written by schema_version 1, migrated) and a file with a hash-algorithm row made from them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_apc.__main__ import main

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "docs" / "results" / "h200" / "results.json"
H200_HASH = REPO / "docs" / "results" / "h200" / "hash-sweep" / "results.json"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest_apc", *args], capture_output=True, text=True, env=env)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def _doc(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _cells(line: str) -> list[str]:
    """A terminal table row's cells (two spaces or more apart; a cell such as ``4,351 -> 342`` has single ones)."""
    return re.split(r"\s{2,}", line.strip())


def _row_line(lines: list[str], pair: str, concurrency: int) -> str:
    words = len(pair.split())
    found = [line for line in lines if line.split()[: words + 1] == [*pair.split(), str(concurrency)]]
    assert len(found) == 1, (pair, concurrency, lines)
    return found[0]


def _with_algorithm(tmp_path: Path) -> Path:
    """The H200 file with a hash-algorithm row of its own."""
    doc = _doc(H200)
    doc["settings"]["connect_host"] = "127.0.0.1"
    doc["hash_algos"] = [{
        "case": "D", "concurrency": 8, "hash_algo": "xxhash", "default_hash_algo": "sha256",
        "cached_tokens": 950736, "default_cached_tokens": 950736, "median_ttft_default_ms": 342.0,
        "median_ttft_ms": 351.0, "ttft_ratio": 1.026, "ttft_ratio_low": 0.91, "ttft_ratio_high": 1.12,
        "duration_default_s": 13.8, "duration_s": 14.0, "verdict": "PASS",
    }]  # fmt: skip
    return _write(tmp_path, "algo.json", doc)


@pytest.mark.parametrize("path", [H200, H200_HASH], ids=["h200", "hash-sweep"])
def test_report_prints_every_row_of_a_file_first_written_by_schema_version_1(path: Path) -> None:
    result = _run("report", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    doc = _doc(path)
    assert doc["schema_version"] == 9  # migrated by scripts/migrate_results.py
    assert lines[0].startswith("apc validation: schema_version 9, started ")
    assert lines[1] == (
        "model llama-3.1-8b-shape-v1-e18e6ae6be32 (gpu profile); TTFT, tok/s, E2E: APC off -> on; gain = median TTFT "
        "off/on"
    )
    assert len([line for line in lines if " blocks = " in line]) == len(doc["servers"])
    for row in doc["pairs"]:
        line = _row_line(lines, row["pair"], row["concurrency"])
        assert f" {row['cached_tokens']:,}/{row['expected_cached_tokens']:,} " in line
        assert f" {row['ttft_speedup']:.2f}x/" in line
        assert _cells(line)[-1].split()[0] == row["verdict"]  # then what its TTFT was held to, where judged
    assert lines[-1] == f"results: {path}"


def test_report_shows_the_c_d_c8_row_as_measured(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "report", str(H200))
    assert status == 0
    assert _cells(_row_line(lines, "C/D", 8)) == [
        "C/D", "8", "yes", "950,736/950,736", "94%", "4,351 -> 342", "12.71x/15.9x", "20.3k -> 73.1k", "154 -> 554",
        "13,051 -> 3,326", "PASS faster",
    ]  # fmt: skip
    status, verbose, _ = _cli(capsys, "report", "-v", str(H200))
    assert "gain CI" in verbose[4]
    assert "[4.90,17.94]" in _row_line(verbose, "C/D", 8)


def test_report_of_a_first_version_hash_sweep_keeps_its_algorithm_rows_among_the_pairs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, lines, _ = _cli(capsys, "report", str(H200_HASH))
    assert status == 0
    assert _row_line(lines, "E/F xxhash", 8).endswith(" PASS")
    assert not any(line.startswith("hash algorithms vs the default") for line in lines)  # v1 has no hash_algos


def test_report_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "report", "--markdown", str(H200))
    assert status == 0
    assert lines[0] == "# APC validation"
    assert lines[2] == "Model `/root/.cache/pytest-apc/models/llama-3.1-8b-shape-v1-e18e6ae6be32`, profile `gpu`."
    c8 = [line for line in lines if line.startswith("| C/D ") and line.split("|")[2].strip() == "8"]
    assert len(c8) == 1
    header = next(line for line in lines if line.startswith("| pair "))
    cells = dict(zip(*([cell.strip() for cell in line.split("|")[1:-1]] for line in (header, c8[0])), strict=True))
    assert (cells["cached tokens"], cells["expected"], cells["hit ratio"], cells["verdict"]) == (
        "950,736", "950,736", "93.7%", "PASS faster"
    )  # fmt: skip
    assert "- D: pure APC effect" in lines
    # The file predates pytest's count in results.json: its verdicts, named as such.
    assert lines[-1] == f"Verdicts (a test may record several): {len(_doc(H200)['verdicts'])} passed, 0 failed."

    status, lines, _ = _cli(capsys, "report", "--markdown", str(H200_HASH))
    assert any(line.startswith("| E/F xxhash ") for line in lines)  # the algorithm in the pair's name, as v1 wrote it


def test_report_of_a_file_with_hash_algorithm_rows_shows_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, lines, _ = _cli(capsys, "report", str(_with_algorithm(tmp_path)))
    assert status == 0
    assert lines[0].startswith("apc validation: schema_version 9")
    start = lines.index(
        "hash algorithms vs the default (sha256): cached tokens must be equal, TTFT and duration "
        "(default -> algorithm) not slower beyond the overhead tolerance"
    )
    assert _cells(lines[start + 3]) == ["D xxhash", "8", "950,736/950,736", "342 -> 351", "1.03x [0.91,1.12]",
                                        "13.8 -> 14.0", "PASS"]  # fmt: skip

    status, md, _ = _cli(capsys, "report", "--markdown", str(tmp_path / "algo.json"))
    assert any(line.startswith("| D ") and "| xxhash " in line and line.endswith("| PASS      |") for line in md)


GATE = REPO / "docs" / "results" / "h200-gate"
SAME = [GATE / "same-build" / name / "results.json" for name in ("cd-1", "cd-2", "d-3")]
SLOWER = {ms: GATE / "slower" / f"{ms}ms" / "results.json" for ms in (50, 100, 200)}


def _run_line(lines: list[str], run_id: str) -> str:
    found = [line for line in lines if line.split()[:1] == [run_id]]
    assert len(found) == 1, (run_id, lines)
    return found[0]


def test_compare_two_runs_of_one_build_passes_every_run() -> None:
    result = _run("compare", str(SAME[0]), str(SAME[1]))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{SAME[1]} against baseline {SAME[0]}"
    assert f"baseline {SAME[0]}: 2 runs compared, 0 regressed (baseline -> now (limit))" in lines
    assert any(
        line.startswith("rule: mean TTFT (median of the cold repeats) may rise as far as its noise allows")
        for line in lines
    )
    assert "noise: the gpu profile's default (measured on one H200)" in lines
    for run_id in ("C-c8", "D-c8"):
        assert _run_line(lines, run_id).split()[1] == "5/5"
        assert _run_line(lines, run_id).endswith(" ok")
    assert lines[-1] == "baseline gate: passed"


def test_compare_a_slowed_run_fails_naming_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "compare", str(SAME[0]), str(SLOWER[200]))
    assert status == 1
    assert _run_line(lines, "D-c8").endswith(" REGRESSED")
    failures = [line for line in lines if line.startswith("FAIL baseline: ")]
    assert len(failures) == 1
    assert failures[0].startswith("FAIL baseline: D-c8: mean TTFT (median of the cold repeats) ")
    assert lines[-1] == "baseline gate: FAILED"
    # A false alarm allowed half the time is a much narrower limit: the 50 ms slowdown fails too.
    assert _cli(capsys, "compare", str(SAME[0]), str(SLOWER[50]))[0] == 0
    assert _cli(capsys, "compare", "--false-alarm", "0.5", str(SAME[0]), str(SLOWER[50]))[0] == 1


def test_compare_refuses_a_baseline_with_fewer_repeats_than_asked(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "compare", "--repeats", "6", str(SAME[0]), str(SAME[1]))
    assert status == 4
    assert (
        f"FAIL baseline: baseline {SAME[0]} has 5 cold repeats of C-c8; the gate needs 6 or more (measure the "
        "baseline with --apc-repeats 6)"
    ) in lines


def test_compare_refuses_a_baseline_of_another_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = _doc(SAME[0])
    other["settings"]["num_prompts"] = 10
    status, lines, _ = _cli(capsys, "compare", str(_write(tmp_path, "b.json", other)), str(SAME[1]))
    assert status == 4
    assert (
        f"FAIL baseline: not comparable with baseline {tmp_path / 'b.json'}: num_prompts 30 here vs 10 there" in lines
    )
    assert not any("runs compared" in line for line in lines)


def test_calibrate_prints_the_noise_the_limits_and_checks_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "calibrate", *map(str, SAME), "--slower", str(SLOWER[200]))
    assert status == 0
    assert lines[0].startswith(
        "calibrate: 3 results files of one build; the gate judges mean TTFT (median of the cold repeats)"
    )
    assert "K = 3 repeats on each side; false alarm 1% over 2 runs (0.50% each)" in lines[0]
    assert _run_line(lines, "C-c8").split()[1:3] == ["2", "10"]
    assert _run_line(lines, "D-c8").split()[1:3] == ["3", "15"]
    same = [line for line in lines if line.startswith("same build, ")]
    assert len(same) == 4  # C and D, under the measured noise and under the profile's default
    assert all(" failed (0.0%)" in line for line in same)
    caught = [line for line in lines if line.startswith(f"slower build, D-c8 in {SLOWER[200]} ")]
    assert len(caught) == 2
    assert all(": caught in 300 of 300 pairs (100.0%)" in line for line in caught)


def test_calibrate_writes_the_noise_into_a_baseline_that_compare_then_uses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    baseline = _write(tmp_path, "baseline.json", _doc(SAME[0]))
    status, lines, _ = _cli(capsys, "calibrate", *map(str, SAME), "--write", str(baseline))
    assert status == 0
    assert lines[-1].startswith(f"wrote the noise of 3 results files into {baseline}")
    stored = _doc(baseline)["calibration"]
    assert stored["files"] == list(map(str, SAME))
    assert set(stored["rows"]) == {"C-c8", "D-c8"}
    assert {k: v for k, v in _doc(baseline).items() if k != "calibration"} == _doc(SAME[0])  # nothing else changed
    status, lines, _ = _cli(capsys, "compare", str(baseline), str(SAME[1]))
    assert status == 0
    assert (
        f"noise: the calibration in {baseline} (3 results files; 3 degrees of freedom between runs, 8 or more within "
        "a run)"
    ) in lines


def test_calibrate_needs_two_files_of_the_same_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _cli(capsys, "calibrate", str(SAME[0]))
    assert status == 4
    assert err.startswith(
        "python -m pytest_apc calibrate: calibrate needs at least two results files that measured the same run"
    )


CPU = REPO / "docs" / "results" / "cpu" / "results.json"
RECHECK = REPO / "docs" / "results" / "h200-recheck" / "results.json"


def test_calibrate_refuses_files_the_gate_would_not_compare(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A CPU run and an H200 run once calibrated to a between-run spread of 165% and limits of +95,570%,
    which --write stored and compare then used to pass a +27.9% regression."""
    copy = tmp_path / "copy.json"
    status, lines, err = _cli(capsys, "calibrate", str(CPU), str(SAME[0]), "--write", str(copy))
    assert (status, lines) == (4, [])
    tiny = Path(_doc(CPU)["model"]).name  # the CPU example's generated model
    assert err.splitlines() == [
        f"python -m pytest_apc calibrate: {SAME[0]} is not comparable with {CPU} (the gate's rule): profile gpu here "
        f"vs cpu there; model llama-3.1-8b-shape-v1-e18e6ae6be32 vs {tiny}; length_scale 1.0 vs "
        "0.0625; block_size 16 vs 128; gpu_count 1 vs 0; calibrate runs of one build, measured alike on one kind of "
        "node"
    ]
    assert not copy.exists()
    status, _, err = _cli(capsys, "calibrate", *map(str, SAME), "--slower", str(CPU))
    assert status == 4
    assert f"{CPU} is not comparable with {SAME[0]} (the gate's rule): profile cpu here vs gpu there" in err
    cpu_baseline = _write(tmp_path, "cpu-baseline.json", _doc(CPU))
    status, _, err = _cli(capsys, "calibrate", *map(str, SAME), "--write", str(cpu_baseline))
    assert status == 4
    assert f"{cpu_baseline} is not comparable with {SAME[0]}" in err
    assert _doc(cpu_baseline) == _doc(CPU)  # not written


def test_calibrate_refuses_files_it_cannot_measure_a_spread_from(capsys: pytest.CaptureFixture[str]) -> None:
    """Two files of one repeat each once printed "0 degrees of freedom", exited 0 and, with --write, stored
    a calibration whose noise was null (which the gate then ignored for the profile's default)."""
    status, lines, err = _cli(capsys, "calibrate", str(H200), str(RECHECK))
    assert (status, lines) == (4, [])
    assert err.splitlines() == [
        "python -m pytest_apc calibrate: calibrate cannot measure the noise of these files: it measured no spread "
        "between the cold repeats of A-c8 (0 degrees of freedom); it needs 2 or more cold repeats of each run in each "
        "file, and a run in 2 or more files (measure them with --apc-repeats 3)"
    ]


def test_calibrate_writes_a_new_baseline_where_there_is_no_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--write to a path without a file once printed the whole table and then failed: "cannot read baseline"."""
    new = tmp_path / "ci" / "baseline.json"
    status, lines, _ = _cli(capsys, "calibrate", *map(str, SAME), "--write", str(new))
    assert status == 0
    assert lines[-1] == (
        f"wrote the noise of 3 results files into a new baseline {new} (a copy of {SAME[0]}): compare and "
        "--apc-baseline with it use these limits"
    )
    written = _doc(new)
    assert {k: v for k, v in written.items() if k != "calibration"} == _doc(SAME[0])
    assert list(written)[-2:] == ["calibration", "timing"]
    status, lines, _ = _cli(capsys, "compare", str(new), str(SAME[1]))
    assert status == 0
    assert any(line.startswith(f"noise: the calibration in {new} (3 results files;") for line in lines)


def test_the_gate_refuses_a_stored_calibration_without_noise(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What calibrate --write stored from files of one repeat: null spreads, 0 degrees of freedom."""
    doc = _doc(SAME[0])
    doc["calibration"] = {"statistic": "mean_ttft_ms", "files": ["a.json", "b.json"], "between": None, "between_df": 0,
                          "rows": {"D-c8": {"runs": 2, "repeats": 2, "mean": 765.0, "within": None, "within_df": 0,
                                            "between_var": None, "between_df": 0}}}  # fmt: skip
    baseline = _write(tmp_path, "null-noise.json", doc)
    status, lines, _ = _cli(capsys, "compare", str(baseline), str(SAME[1]))
    assert status == 4
    assert lines[1:-1] == [
        f"FAIL baseline: baseline {baseline} holds a calibration the gate cannot use: it measured no spread between "
        "the cold repeats of D-c8 (0 degrees of freedom) (calibrate it again: python -m pytest_apc calibrate "
        f"RESULTS... --write {baseline})"
    ]
    doc["calibration"]["rows"]["D-c8"].update(within=0.0, within_df=8)  # identical repeats: a limit of +0%
    status, lines, _ = _cli(capsys, "compare", str(_write(tmp_path, "zero.json", doc)), str(SAME[1]))
    assert status == 4
    assert "its spread between the cold repeats of D-c8 is 0.0" in lines[1]


def test_compare_counts_the_runs_it_refused_to_judge(capsys: pytest.CaptureFixture[str]) -> None:
    """The summary once said "4 runs compared, 0 regressed", every row ok, above four FAIL lines."""
    status, lines, _ = _cli(capsys, "compare", str(H200), str(RECHECK))
    assert status == 4
    assert lines[1] == f"baseline {H200}: 4 runs compared, 0 regressed, 4 refused (baseline -> now (limit))"
    assert [line.split()[-1] for line in lines[4:8]] == ["refused"] * 4
    assert len([line for line in lines if line.startswith("FAIL baseline: ")]) == 4


def test_compare_across_schema_versions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A baseline first written by schema_version 1 has one repeat per run: read, and refused for too few
    repeats (a rule of 3 repeats), after the differences of profile and workload that refuse it first."""
    status, lines, _ = _cli(capsys, "compare", str(H200), str(SAME[0]))
    assert status == 4
    assert any(line.startswith(f"FAIL baseline: not comparable with baseline {H200}: ") for line in lines)
    same_shape = _doc(SAME[0])
    same_shape["settings"] = _doc(H200)["settings"]
    status, lines, _ = _cli(capsys, "compare", str(H200), str(_write(tmp_path, "new.json", same_shape)))
    assert f"FAIL baseline: baseline {H200} has 1 cold repeat of C-c8; the gate needs 3 or more (measure the " \
        "baseline with --apc-repeats 3)" in lines  # fmt: skip


def test_a_missing_file_is_one_line_and_exit_4(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = _run("compare", str(H200), str(missing))
    assert result.returncode == 4
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"python -m pytest_apc compare: cannot read results file {missing}: "
        f"[Errno 2] No such file or directory: '{missing}'"
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "is not a pytest-apc results file (not a JSON object)"),
        ('{"pairs": []}', "is not a pytest-apc results file (no schema_version)"),
        ('{"schema_version": 10}', "has schema_version 10; this pytest-apc reads 9"),
        (
            '{"schema_version": 3}',
            "has schema_version 3, older than the 9 this pytest-apc reads; migrate it with: "
            "python scripts/migrate_results.py ",
        ),
        ("{", "cannot read results file"),
    ],
)
def test_a_file_that_is_not_a_results_file_exits_4(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    status, lines, err = _cli(capsys, "report", str(path))
    assert (status, lines) == (4, [])
    assert len(err.splitlines()) == 1
    assert message in err


def test_usage_errors_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    for args in ([], ["compare", str(H200)], ["compare", "--false-alarm", "2", str(H200), str(H200)], ["calibrate"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 4
    assert "argument --false-alarm: must be in (0, 1]" in capsys.readouterr().err


DAMAGED = [
    (lambda d: d["runs"][0].pop("id"), "runs[0].id is missing"),
    (lambda d: d["runs"].__setitem__(0, "C-c8"), 'runs[0] is a string ("C-c8"), not an object'),
    (lambda d: d["runs"][0].__setitem__("repeat_counters", "5"),
     'runs[0].repeat_counters is a string ("5"), not an array'),
    (lambda d: d["runs"][0]["repeat_counters"][0].__setitem__("mean_ttft_ms", "765"),
     'runs[0].repeat_counters[0].mean_ttft_ms is a string ("765"), not a number or null'),
    (lambda d: d.__setitem__("gate", "passed"), 'gate is a string ("passed"), not an object'),
    (lambda d: d["runs"][1].__setitem__("id", "C-c8"), "runs[1].case is \"D\", but its id 'C-c8' says \"C\""),
    (lambda d: d["runs"][0]["repeat_counters"].pop(),
     "runs[0].repeat_counters has 4 entries for 5 repeats (one per repeat)"),
    (lambda d: d["runs"][0]["repeat_counters"][0].pop("median_ttft_ms"),
     "runs[0].repeat_counters[0].median_ttft_ms is missing (its schema_version has it)"),
]  # fmt: skip


@pytest.mark.parametrize(("damage", "message"), DAMAGED)
@pytest.mark.parametrize("command", ["report", "compare", "calibrate"])
def test_a_damaged_results_file_is_one_line_naming_the_field_and_exit_4(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, damage: Any, message: str, command: str
) -> None:
    """Each of these once gave a traceback and exit status 1, the status of a failed gate."""
    doc = _doc(SAME[0])
    damage(doc)
    path = _write(tmp_path, "damaged.json", doc)
    args = {"report": [str(path)], "compare": [str(path), str(SAME[1])], "calibrate": [str(SAME[1]), str(path)]}
    status, lines, err = _cli(capsys, command, *args[command])
    role = "baseline" if command == "compare" else "results file"
    assert (status, lines) == (4, [])
    assert err.splitlines() == [
        f"python -m pytest_apc {command}: {role} {path} is not a valid results file of schema_version 9: {message}"
    ]


def test_help_documents_the_commands_and_exit_statuses() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for text in ("report", "compare", "calibrate", "exit status:", "1  a verdict or the gate failed", "4  bad usage"):
        assert text in result.stdout


def test_the_other_modules_still_run_as_scripts() -> None:
    result = subprocess.run([sys.executable, "-m", "pytest_apc.report.reference"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert result.returncode == 0
    assert result.stdout == (REPO / "docs" / "configuration.md").read_text()


def _console(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The console script ``pytest-apc`` as its entry point runs it (the wheel's tests run the installed one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(REPO)
    script = "import sys; from pytest_apc.__main__ import console; sys.exit(console())"
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)  # fmt: skip


def test_version_prints_the_package_version_and_exits_0() -> None:
    from pytest_apc import __version__

    for result in (_run("--version"), _console("--version")):
        assert (result.returncode, result.stdout, result.stderr) == (0, f"pytest-apc {__version__}\n", "")


def test_the_console_script_runs_the_commands_under_its_own_name(tmp_path: Path) -> None:
    script, module = _console("report", str(H200)), _run("report", str(H200))
    assert script.returncode == module.returncode == 0
    assert script.stdout == module.stdout
    missing = tmp_path / "nope.json"
    failed = _console("compare", str(H200), str(missing))
    assert failed.returncode == 4
    assert failed.stderr.startswith(f"pytest-apc compare: cannot read results file {missing}: ")
    usage = _console("calibrate")
    assert usage.returncode == 4
    assert "usage: pytest-apc calibrate" in usage.stderr


def _collected(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_the_console_script_runs_the_installed_suite_from_any_folder(tmp_path: Path) -> None:
    """``pytest-apc ARGS`` is ``pytest --pyargs tests_apc ARGS``: the same tests, pytest's exit status."""
    collect = ("--collect-only", "-q", "--cpu-node", "-p", "no:cacheprovider")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pyargs = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "tests_apc", "-m", "pure", *collect],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    ids = _collected(_console("-m", "pure", *collect, cwd=tmp_path))
    assert ids == _collected(pyargs)
    assert ids
    assert all(i.startswith("test_pure.py::") for i in ids)
    # A module of the suite named on the command line is what runs, not the whole suite beside it.
    every = _collected(_console(*collect, cwd=tmp_path))
    overhead = _collected(_console("tests_apc.test_overhead", *collect, cwd=tmp_path))
    assert overhead
    assert [i.partition("::")[2] for i in overhead] == [
        i.partition("::")[2] for i in every if i.startswith("test_overhead.py::")
    ]
    assert _console("-m", "no_such_marker", *collect, cwd=tmp_path).returncode == 5  # pytest's: no tests ran
    assert list(tmp_path.iterdir()) == []


def test_the_console_scripts_help_names_its_forms_then_pytests() -> None:
    result = _console("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: pytest-apc [PYTEST ARGS]\n")
    assert "pytest-apc {report,compare,calibrate,settings} ..." in result.stdout
    assert "--apc-baseline=PATH" in result.stdout  # pytest's help, with the plugin's options


def _no_runs(folder: Path) -> str:
    doc = _doc(SAME[0])
    doc.update(runs=[], pairs=[])
    return str(_write(folder, "empty.json", doc))


def _failed_row(folder: Path) -> str:
    doc = _doc(SAME[0])
    doc["pairs"][0]["verdict"] = "FAIL"
    return str(_write(folder, "failed.json", doc))


def _other_workload(folder: Path) -> str:
    doc = _doc(SAME[0])
    doc["settings"]["num_prompts"] = 10
    return str(_write(folder, "other.json", doc))


FAILED_VERDICT = """
from pytest_apc.verdicts.verdict import Verdict

def test_verdict(apc_assert):
    apc_assert(Verdict("cached_tokens_match", ["D-c8"], False, "cached 0 of 100 predicted"))
"""
PASSING = "def test_plain():\n    pass\n"
APC_TEST = "import pytest\n\n@pytest.mark.apc_cases('CD')\ndef test_measured(apc_run):\n    pass\n"


def _cpu_baseline(folder: Path) -> str:
    from tests.test_plugin import cpu_baseline

    return str(cpu_baseline(folder))


# (command, what, test file for pytest, arguments (from the folder), exit status): the table of docs/ci.md.
EXIT_TABLE: list[tuple[str, str, str, Any, int]] = [
    ("pytest", "passed", PASSING, lambda f: ["--cpu-node", "-p", "no:cacheprovider"], 0),
    ("pytest", "a verdict failed", FAILED_VERDICT, lambda f: ["--cpu-node"], 1),
    ("pytest", "bad usage", PASSING, lambda f: ["--apc-set=num_prompts=-3"], 4),
    ("pytest", "no baseline file, no profile", PASSING, lambda f: [f"--apc-baseline={f / 'missing.json'}", "--co"], 4),
    ("pytest", "baseline of too few repeats", APC_TEST,
     lambda f: ["--cpu-node", f"--apc-baseline={_cpu_baseline(f)}", "--apc-set=baseline_repeats=6"], 4),
    ("pytest", "no APC test here", "", lambda f: ["-m", "apc", "--cpu-node"], 5),
    ("report", "passed", "", lambda f: [str(SAME[0])], 0),
    ("report", "a row says FAIL", "", lambda f: [_failed_row(f)], 1),
    ("report", "bad usage", "", lambda f: [], 4),
    ("report", "missing file", "", lambda f: [str(f / "missing.json")], 4),
    ("report", "no runs", "", lambda f: [_no_runs(f)], 5),
    ("compare", "passed", "", lambda f: [str(SAME[0]), str(SAME[1])], 0),
    ("compare", "a run regressed", "", lambda f: [str(SAME[0]), str(SLOWER[200])], 1),
    ("compare", "bad usage", "", lambda f: ["--false-alarm", "2", str(SAME[0]), str(SAME[1])], 4),
    ("compare", "missing file", "", lambda f: [str(SAME[0]), str(f / "missing.json")], 4),
    ("compare", "baseline of too few repeats", "", lambda f: ["--repeats", "6", str(SAME[0]), str(SAME[1])], 4),
    ("compare", "baseline of another workload", "", lambda f: [_other_workload(f), str(SAME[1])], 4),
    ("compare", "no runs", "", lambda f: [str(SAME[0]), _no_runs(f)], 5),
    ("calibrate", "passed", "", lambda f: [*map(str, SAME)], 0),
    ("calibrate", "the rule failed same-build pairs", "", lambda f: [*map(str, SAME)], 1),
    ("calibrate", "bad usage", "", lambda f: [], 4),
    ("calibrate", "missing file", "", lambda f: [str(SAME[0]), str(f / "missing.json")], 4),
    ("calibrate", "one file", "", lambda f: [str(SAME[0])], 4),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "what", "test_file", "args", "status"), EXIT_TABLE, ids=[f"{row[0]}: {row[1]}" for row in EXIT_TABLE]
)
def test_one_exit_status_table_for_every_command(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, command: str, what: str, test_file: str,
    args: Any, status: int,
) -> None:  # fmt: skip
    """0 passed, 1 a verdict or the gate failed, 4 bad usage or an input (file, baseline) that cannot be used,
    5 no tests or no runs: pytest's codes, for pytest and each command alike."""
    if what == "the rule failed same-build pairs":  # the rule itself is checked in test_gate; here, its status
        monkeypatch.setattr("pytest_apc.gate.noise.fails", lambda *a: True)
    if command == "pytest":
        if test_file:
            pytester.makepyfile(test_file)
        assert pytester.runpytest(*args(pytester.path)).ret == status
        return
    try:
        got = main([command, *args(pytester.path)])
    except SystemExit as exit_:
        got = exit_.code
    assert got == status


def test_the_readme_says_how_to_measure_a_baseline_as_the_refusal_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A default run (one cold repeat) is refused as a baseline: the refusal and the README name the same
    option and number, the default of --apc-set baseline_repeats; judging single repeats takes a default run."""
    from pytest_apc.config import SPEC_BY_NAME

    needed = SPEC_BY_NAME["baseline_repeats"].default
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"`pytest-apc -m apc --gpu-node --apc-model /models/Llama-3.1-70B --apc-repeats {needed}`" in readme
    assert f"naming `--apc-repeats {needed}`" in readme
    one = _doc(SAME[0])
    for run in one["runs"]:  # a default run: its first repeat only
        run["repeats"], run["repeat_counters"] = 1, run["repeat_counters"][:1]
    old, new = _write(tmp_path, "default-run.json", one), _write(tmp_path, "new.json", one)
    status, lines, _ = _cli(capsys, "compare", "--repeats", str(needed), str(old), str(new))
    assert status == 4
    assert any(line.endswith(f"(measure the baseline with --apc-repeats {needed})") for line in lines)
    assert "`--apc-set baseline_repeats=1`" in readme
    assert _cli(capsys, "compare", "--repeats", "1", str(old), str(new))[0] == 0
