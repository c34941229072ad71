"""``python -m pytest_apc``: a results file re-read (``report``) and two compared (``compare``), on the committed
H200 results (schema_version 1) and a schema_version 2 file made from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_apc.__main__ import main
from pytest_apc.report import gate

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


def _row_line(lines: list[str], pair: str, concurrency: int) -> str:
    words = len(pair.split())
    found = [line for line in lines if line.split()[: words + 1] == [*pair.split(), str(concurrency)]]
    assert len(found) == 1, (pair, concurrency, lines)
    return found[0]


def _version_2(tmp_path: Path) -> Path:
    """The H200 file as schema_version 2 writes it: a hash-algorithm row of its own, and the gate's rows."""
    doc = _doc(H200)
    doc["schema_version"] = 2
    doc["settings"]["connect_host"] = "127.0.0.1"
    doc["hash_algos"] = [{
        "case": "D", "concurrency": 8, "hash_algo": "xxhash", "default_hash_algo": "sha256",
        "cached_tokens": 950736, "default_cached_tokens": 950736, "median_ttft_default_ms": 342.0,
        "median_ttft_ms": 351.0, "ttft_ratio": 1.026, "ttft_ratio_low": 0.91, "ttft_ratio_high": 1.12,
        "duration_default_s": 13.8, "duration_s": 14.0, "verdict": "PASS",
    }]  # fmt: skip
    doc["gate"] = gate.compare_documents(_doc(H200), doc, "/ci/baseline.json", gate.tolerances_of(doc)).to_json()
    return _write(tmp_path, "v2.json", doc)


@pytest.mark.parametrize("path", [H200, H200_HASH], ids=["h200", "hash-sweep"])
def test_report_prints_every_row_of_a_schema_version_1_file(path: Path) -> None:
    result = _run("report", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    doc = _doc(path)
    assert doc["schema_version"] == 1
    assert lines[0].startswith("apc validation: schema_version 1, started ")
    assert lines[1] == "model llama-3.1-8b-shape-v1-e18e6ae6be32 (gpu profile); TTFT OFF>ON; gain = median TTFT OFF/ON"
    assert len([line for line in lines if " blocks = " in line]) == len(doc["servers"])
    for row in doc["pairs"]:
        line = _row_line(lines, row["pair"], row["concurrency"])
        assert f" {row['cached_tokens']:,}/{row['expected_cached_tokens']:,} " in line
        assert f" {row['ttft_speedup']:.2f}x/" in line
        assert line.endswith(f" {row['verdict']}")
    assert lines[-1] == f"results: {path}"


def test_report_shows_the_c_d_c8_row_as_measured(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _cli(capsys, "report", str(H200))
    assert status == 0
    assert _row_line(lines, "C/D", 8).split() == [
        "C/D", "8", "yes", "950,736/950,736", "94%", "4,351>342", "12.71x/15.9x", "20.3k>73.1k", "154>554",
        "13,051>3,326", "PASS",
    ]  # fmt: skip
    status, verbose, _ = _cli(capsys, "report", "-v", str(H200))
    assert "gain CI" in verbose[4]
    assert "[4.90,17.94]" in _row_line(verbose, "C/D", 8)


def test_report_of_a_schema_version_1_hash_sweep_keeps_its_algorithm_rows_among_the_pairs(
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
    assert (cells["hash"], cells["cached tokens"], cells["expected"], cells["hit ratio"], cells["verdict"]) == (
        "-", "950,736", "950,736", "93.7%", "PASS"
    )  # fmt: skip
    assert "- D: pure APC effect" in lines
    assert lines[-1] == f"Verdicts: {len(_doc(H200)['verdicts'])} passed, 0 failed."

    status, lines, _ = _cli(capsys, "report", "--markdown", str(H200_HASH))
    header = next(line for line in lines if line.startswith("| pair "))
    assert [cell.strip() for cell in header.split("|")[1:4]] == ["pair", "conc", "hash"]  # as v1 wrote it


def test_report_of_a_schema_version_2_file_shows_the_algorithms_and_the_gate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, lines, _ = _cli(capsys, "report", str(_version_2(tmp_path)))
    assert status == 0
    assert lines[0].startswith("apc validation: schema_version 2")
    start = lines.index("hash algorithms vs the default (sha256): cached tokens must be equal")
    assert lines[start + 3].split() == ["D", "xxhash", "8", "950,736/950,736", "342>351", "1.03x", "[0.91,1.12]",
                                        "13.8>14.0", "PASS"]  # fmt: skip
    start = lines.index("baseline /ci/baseline.json: 6 rows compared, 0 regressed (baseline -> now (limit))")
    assert all(line.endswith(" ok") for line in lines[start + 3 : start + 9])

    status, md, _ = _cli(capsys, "report", "--markdown", str(tmp_path / "v2.json"))
    assert any(line.startswith("| D ") and "| xxhash " in line and line.endswith("| PASS      |") for line in md)


def test_compare_a_file_with_itself_passes_every_row(tmp_path: Path) -> None:
    result = _run("compare", str(H200), str(H200))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    doc = _doc(H200)
    assert f"baseline {H200}: {len(doc['pairs'])} rows compared, 0 regressed (baseline -> now (limit))" in lines
    for row in doc["pairs"]:
        assert _row_line(lines, row["pair"], row["concurrency"]).endswith(" ok")
    assert lines[-1] == "baseline gate: passed"
    assert "tolerances ttft_on=10%, speedup=10%, cached_tokens=0%" in lines[0]


def test_compare_a_worse_run_fails_naming_the_row(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    worse = _doc(H200)
    c4 = next(row for row in worse["pairs"] if (row["pair"], row["concurrency"]) == ("C/D", 4))
    c4["median_ttft_on_ms"] *= 2
    path = _write(tmp_path, "worse.json", worse)
    status, lines, _ = _cli(capsys, "compare", str(H200), str(path))
    assert status == 1
    assert _row_line(lines, "C/D", 4).endswith(" REGRESSED")
    assert _row_line(lines, "C/D", 8).endswith(" ok")
    failures = [line for line in lines if line.startswith("FAIL baseline: ")]
    assert len(failures) == 1
    assert failures[0].startswith("FAIL baseline: C/D c4: median TTFT ON (ms) 291 -> 582 regressed by 291")
    assert lines[-1] == "baseline gate: FAILED"

    # The same rules as --apc-baseline-tolerance: a wide enough tolerance lets it pass.
    status, lines, _ = _cli(capsys, "compare", "--tolerance", "ttft_on=150%", str(H200), str(path))
    assert status == 0
    assert "tolerances ttft_on=150%, speedup=10%, cached_tokens=0% (--tolerance)" in lines[0]


def test_compare_uses_the_tolerances_the_results_file_ran_with(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    loose = _doc(H200)
    loose["settings"]["baseline_tolerance"]["ttft_on"] = ["abs", 1000.0]
    next(row for row in loose["pairs"] if row["concurrency"] == 4)["median_ttft_on_ms"] *= 2
    status, lines, _ = _cli(capsys, "compare", str(H200), str(_write(tmp_path, "loose.json", loose)))
    assert status == 0
    assert "tolerances ttft_on=1000, speedup=10%, cached_tokens=0%" in lines[0]


def test_compare_refuses_a_baseline_of_another_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = _doc(H200)
    other["settings"]["num_prompts"] = 10
    status, lines, _ = _cli(capsys, "compare", str(_write(tmp_path, "b.json", other)), str(H200))
    assert status == 1
    assert (
        f"FAIL baseline: not comparable with baseline {tmp_path / 'b.json'}: num_prompts 30 here vs 10 there" in lines
    )
    assert not any("rows compared" in line for line in lines)


def test_compare_across_schema_versions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, lines, _ = _cli(capsys, "compare", str(H200), str(_version_2(tmp_path)))
    assert status == 0
    assert any(line.endswith(": 6 rows compared, 0 regressed (baseline -> now (limit))") for line in lines)


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = _run("compare", str(H200), str(missing))
    assert result.returncode == 2
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
        ('{"schema_version": 5}', "has schema_version 5; this pytest-apc reads 1, 2, 3, 4"),
        ("{", "cannot read results file"),
    ],
)
def test_a_file_that_is_not_a_results_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    status, lines, err = _cli(capsys, "report", str(path))
    assert (status, lines) == (2, [])
    assert len(err.splitlines()) == 1
    assert message in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in ([], ["compare", str(H200)], ["compare", "--tolerance", "latency=5%", str(H200), str(H200)]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
    assert "METRIC=N or METRIC=N% with METRIC in ttft_on, speedup, cached_tokens" in capsys.readouterr().err


def test_help_documents_the_commands_and_exit_statuses() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for text in ("report", "compare", "exit status:", "1  compare: the gate failed"):
        assert text in result.stdout


def test_the_other_modules_still_run_as_scripts() -> None:
    result = subprocess.run([sys.executable, "-m", "pytest_apc.reference"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert result.returncode == 0
    assert result.stdout == (REPO / "docs" / "configuration.md").read_text()
