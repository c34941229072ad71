"""The report side of fleets: the fleet rows of results.json, the fleet table in the terminal summary and
summary.md, fleet.png, and ``python -m pytest_apc report`` / ``compare`` on files with fleet runs.

The records are those of a real CPU run (``tests/data/fleet-store.json``: the run's store.json, per-request
detail beyond TTFTs and latencies dropped, paths made relative): two tiny-model replicas behind vllm-router,
one prefix group, 30 prompts at concurrency 8, routed round_robin and consistent_hash. The verdicts are
recomputed from them by the verdict functions the fleet tests call."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pytest_apc import verdicts
from pytest_apc.__main__ import main
from pytest_apc.gate import compare as gate
from pytest_apc.measure.records import Measured, RunRecord
from pytest_apc.report import markdown, plots, terminal
from pytest_apc.report.controller import report_blocks
from pytest_apc.results import SCHEMA_PATH, formatting, rows
from pytest_apc.results import document as results
from pytest_apc.results.view import ReportView
from pytest_apc.verdicts.stats import median_interval
from pytest_apc.workload.cases import RunKey
from tests.test_verdict import delta, off_delta, record, settings

DATA = Path(__file__).resolve().parent / "data"
ROUND_ROBIN, CONSISTENT_HASH = RunKey("R", 8, route="round_robin"), RunKey("R", 8, route="consistent_hash")
REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "docs" / "results" / "h200" / "results.json"


def _measured() -> Measured:
    return Measured.from_state(json.loads((DATA / "fleet-store.json").read_text()))


def _judged(runs: list[RunRecord], s: Any) -> list[dict[str, Any]]:
    """What the fleet tests record for each run: both verdicts, as the controller gathers them."""
    found = []
    for run in runs:
        for v, test in ((verdicts.fleet_accounting(run), "test_fleet_accounting"),
                        (verdicts.prefix_locality(run, s), "test_prefix_locality")):  # fmt: skip
            found.append({**v.to_json(), "test": f"tests_apc/test_fleet.py::{test}[{run.key.id}]",
                          "outcome": "passed" if v.passed else "failed"})  # fmt: skip
    return found


def _data(s: Any, measured: Measured, verdicts: list[dict[str, Any]] | None = None, failed=()) -> rows.ReportData:
    judged = _judged([r for r in measured.records.values() if r.key.route], s) if verdicts is None else verdicts
    return rows.ReportData.build(measured.records, rows.Outcomes(judged, set(failed)), s)


def _document(s: Any, measured: Measured, data: rows.ReportData) -> dict[str, Any]:
    """The final results.json as the controller writes it (its report blocks, no environment or files)."""
    doc = results.document(s, measured, str(measured.model), "2026-12-01T02:37:58+00:00", 113.3)
    timing = doc.pop("timing")
    return {**doc, **report_blocks(data, gate.Gate()), "timing": timing}


@pytest.fixture
def fleet(pytester: pytest.Pytester) -> SimpleNamespace:
    s = settings(pytester)
    measured = _measured()
    data = _data(s, measured)
    return SimpleNamespace(s=s, measured=measured, data=data, rows={n["route"]: n for n in data.fleet_numbers()})


def test_the_rows_of_the_real_fleet_run(fleet: SimpleNamespace) -> None:
    assert [n["id"] for n in fleet.data.fleet_numbers()] == ["R-c8-consistent_hash", "R-c8-round_robin"]
    rr, ch = fleet.rows["round_robin"], fleet.rows["consistent_hash"]
    assert {k: rr[k] for k in ("replicas", "prefix_groups", "requests_per_replica", "cold_prefills",
                               "ideal_cold_prefills", "hits", "ideal_hits", "extra_prefill_tokens")} == {
        "replicas": 2, "prefix_groups": 1, "requests_per_replica": [15, 15], "cold_prefills": 2,
        "ideal_cold_prefills": 1, "hits": 57_344, "ideal_hits": 59_392, "extra_prefill_tokens": 2048,
    }  # fmt: skip
    assert rr["routing_cost"] == pytest.approx(2048 / 59_392)
    assert (ch["requests_per_replica"], ch["cold_prefills"], ch["hits"]) == ([30, 0], 1, 59_392)
    assert (ch["extra_prefill_tokens"], ch["routing_cost"]) == (0, 0.0)
    for route, row in fleet.rows.items():
        run = fleet.measured.records[RunKey("R", 8, route=route)]
        assert row["passed"] is True
        assert row["error"] is None
        assert row["median_ttft_ms"] == pytest.approx(float(np.median(run.samples_ms("ttfts"))))
        assert row["median_ttft_low_ms"] <= row["median_ttft_ms"] <= row["median_ttft_high_ms"]
        assert row["p99_ttft_ms"] == run.to_json()["p99_ttft_ms"]
        assert row["output_throughput"] == pytest.approx(480 / run.duration_s)
        assert row["request_throughput"] == pytest.approx(30 / run.duration_s)


def test_fleet_runs_make_no_pair_or_algorithm_rows(pytester: pytest.Pytester) -> None:
    """Case R has no OFF partner: beside a C/D pair, the pair table keeps the pair and the fleet its own rows."""
    s = settings(pytester)
    measured = _measured()
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    measured.records.update({off.key: off, on.key: on})
    data = _data(s, measured)
    assert [row.name for row in data.pairs] == ["C/D"]
    assert data.algos == []
    assert [n["id"] for n in data.fleet_numbers()] == ["R-c8-consistent_hash", "R-c8-round_robin"]
    fleet_only = _data(s, _measured())
    assert (fleet_only.pairs, fleet_only.algos) == ([], [])


def test_passed_comes_from_the_verdicts_of_that_run(pytester: pytest.Pytester) -> None:
    s = settings(pytester)
    measured = _measured()
    judged = _judged(list(measured.records.values()), s)
    failing = [{**v, "passed": False} if v["name"] == "prefix_locality" and v["runs"] == [ROUND_ROBIN.id] else v
               for v in judged]  # fmt: skip
    passed = {n["route"]: n["passed"] for n in _data(s, measured, failing).fleet_numbers()}
    assert passed == {"round_robin": False, "consistent_hash": True}
    # The rule of every row: the verdicts about its runs, whatever they are called; none about other runs.
    renamed = [{**v, "name": "cached_tokens_match"} for v in failing]
    assert {n["route"]: n["passed"] for n in _data(s, measured, renamed).fleet_numbers()} == passed
    elsewhere = [{**v, "runs": ["D-c8"]} for v in judged]
    assert {n["passed"] for n in _data(s, measured, elsewhere).fleet_numbers()} == {None}
    # A test of the run that failed before recording a verdict fails its row.
    rows_ = _data(s, measured, [], failed={CONSISTENT_HASH.id}).fleet_numbers()
    assert {n["route"]: n["passed"] for n in rows_} == {"round_robin": None, "consistent_hash": False}


def test_a_run_whose_locality_cannot_be_told_has_an_error_instead_of_numbers(fleet: SimpleNamespace) -> None:
    measured = _measured()
    run = measured.records[ROUND_ROBIN]
    run.repeats[0] = dataclasses.replace(run.repeats[0], parts={})  # counters from one source, not per replica
    data = _data(fleet.s, measured, verdicts=[])
    row = next(n for n in data.fleet_numbers() if n["route"] == "round_robin")
    assert row["error"].startswith("cannot account for the fleet run R-c8-round_robin: its counters came from one")
    for key in ("requests_per_replica", "cold_prefills", "ideal_cold_prefills", "hits", "ideal_hits",
                "extra_prefill_tokens", "routing_cost"):  # fmt: skip
        assert row[key] is None, key
    assert row["replicas"] == 2  # the fleet's members
    assert row["median_ttft_ms"] > 0
    lines = [
        text
        for text, _ in terminal.fleet_lines(
            ReportView.from_document(_document(fleet.s, measured, data), "results.json")
        )
    ]
    table = lines[1].splitlines()
    # Not measured reads n/a in every column (the verdict's too: nothing judged the row).
    assert table[-1].split() == ["round_robin", "2", "n/a", "n/a", "n/a", "n/a", *table[-1].split()[6:9], "n/a"]
    assert lines[2].startswith("FLEET R-c8-round_robin: cannot account for the fleet run R-c8-round_robin")


def test_median_interval_is_seeded_and_holds_the_median() -> None:
    values = np.array([10.0, 12.0, 11.0, 30.0, 9.0, 13.0, 12.5])
    first = median_interval(values, samples=500, confidence=0.9)
    assert first == median_interval(values, samples=500, confidence=0.9)
    assert first.estimate == 12.0
    assert first.low <= 12.0 <= first.high
    assert first.confidence == 0.9
    with pytest.raises(ValueError, match="no samples"):
        median_interval(np.array([]))


def test_the_terminal_summary_shows_the_fleet_table(fleet: SimpleNamespace) -> None:
    view = ReportView.from_document(_document(fleet.s, fleet.measured, fleet.data), "results.json")
    lines = [text for text, _ in terminal.summary_lines(view)]
    assert lines[0] == "model tiny-llama-v1-e18e6ae6be32 (cpu profile)"  # no OFF>ON legend without a pair
    assert " KV tokens each of 2 replicas, hash sha256, " in lines[1]
    assert lines[2].startswith("fleet (case R, c8, 1 prefix group): cold prefills vs ideal (one per group)")
    table = lines[3].splitlines()
    assert table[0].split()[:5] == ["route", "replicas", "requests", "cold/ideal", "hits/ideal"]
    rr = next(line.split() for line in table if line.startswith("round_robin "))
    assert rr[:6] == ["round_robin", "2", "15+15", "2/1", "57,344/59,392", "3.4%"]
    assert rr[-1] == "PASS"
    ch = next(line.split() for line in table if line.startswith("consistent_hash "))
    assert ch[:6] == ["consistent_hash", "2", "30+0", "1/1", "59,392/59,392", "0.0%"]
    row = fleet.rows["consistent_hash"]
    assert ch[6:8] == [
        formatting.num(row["median_ttft_ms"]),
        f"[{formatting.num(row['median_ttft_low_ms'])}..{formatting.num(row['median_ttft_high_ms'])}]",
    ]
    assert all(len(line) <= 120 for line in [lines[2], *table])


def test_summary_md_shows_the_fleet_table(fleet: SimpleNamespace) -> None:
    text = markdown.markdown(ReportView.from_document(_document(fleet.s, fleet.measured, fleet.data), "results.json"))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| route "))
    rr = next(line for line in lines if line.startswith("| round_robin "))
    cells = dict(zip(*([c.strip() for c in line.split("|")[1:-1]] for line in (header, rr)), strict=True))
    assert {k: cells[k] for k in ("requests per replica", "cold prefills", "ideal", "hits", "ideal hits",
                                  "extra prefill tokens", "routing cost", "verdict")} == {
        "requests per replica": "15+15", "cold prefills": "2", "ideal": "1", "hits": "57,344",
        "ideal hits": "59,392", "extra prefill tokens": "2,048", "routing cost": "3.4%", "verdict": "PASS",
    }  # fmt: skip
    assert "- R: prefix groups routed across replicas" in lines
    assert "Verdicts (a test may record several): 4 passed, 0 failed." in lines  # no pytest count in this document


def test_a_fleet_document_validates(fleet: SimpleNamespace) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(json.dumps(_document(fleet.s, fleet.measured, fleet.data), default=str))
    assert doc["schema_version"] == results.SCHEMA_VERSION == 9
    assert 3 in results.SCHEMA_VERSIONS
    assert 4 in results.SCHEMA_VERSIONS
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(doc, schema)
    assert [row["id"] for row in doc["fleet"]] == ["R-c8-consistent_hash", "R-c8-round_robin"]
    assert (doc["pairs"], doc["hash_algos"]) == ([], [])
    assert len(doc["servers"][0]["members"]) == 2
    assert {run["route"] for run in doc["runs"]} == {"round_robin", "consistent_hash"}
    broken = copy.deepcopy(doc)
    del broken["fleet"][0]["cold_prefills"]
    with pytest.raises(jsonschema.ValidationError, match="cold_prefills"):
        jsonschema.validate(broken, schema)
    errored = copy.deepcopy(doc)
    errored["fleet"][0].update(cold_prefills=None, routing_cost=None, error="cannot account for the fleet run")
    jsonschema.validate(errored, schema)


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, default=str))
    return path


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = main(list(args))
    return status, capsys.readouterr().out.splitlines()


def test_report_prints_the_fleet_table_of_a_results_file(
    fleet: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "results.json", _document(fleet.s, fleet.measured, fleet.data))
    status, lines = _cli(capsys, "report", str(path))
    assert status == 0
    assert lines[0].startswith("apc validation: schema_version 9, started 2026-12-01")
    view = ReportView.from_document(_document(fleet.s, fleet.measured, fleet.data), str(path))
    live = [text for text, _ in terminal.summary_lines(view)]
    assert lines[1:] == "\n".join(live).splitlines()  # as the run printed it
    assert any(line.split()[:3] == ["round_robin", "2", "15+15"] for line in lines)
    status, md = _cli(capsys, "report", "--markdown", str(path))
    assert status == 0
    assert any(line.startswith("| consistent_hash ") and "| 30+0 " in line for line in md)


def test_compare_says_fleet_runs_are_not_gated_only_without_pairs(
    fleet: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "fleet.json", _document(fleet.s, fleet.measured, fleet.data))
    status, lines = _cli(capsys, "compare", str(path), str(path))
    assert status == 4  # a baseline it cannot use: bad input, not a regression
    assert (
        f"FAIL baseline: baseline {path} has no measured runs to compare with: its fleet runs "
        "(R-c8-consistent_hash, R-c8-round_robin) are not gated (the gate compares single-server runs only)"
    ) in lines
    status, lines = _cli(capsys, "compare", str(H200), str(path))
    assert status == 5  # nothing measured to judge: no runs
    assert f"FAIL baseline: nothing was measured to compare with baseline {H200}: the fleet runs " in "\n".join(lines)

    # Single-server runs and fleet runs in one file: the former are gated, the fleet runs pass unmentioned.
    gated = REPO / "docs" / "results" / "h200-gate" / "same-build" / "cd-1" / "results.json"
    single, fleet_doc = json.loads(gated.read_text()), json.loads(path.read_text())
    both = {**single, "runs": single["runs"] + fleet_doc["runs"], "fleet": fleet_doc["fleet"]}
    status, lines = _cli(capsys, "compare", str(gated), str(_write(tmp_path, "both.json", both)))
    assert status == 0
    assert lines[-1] == "baseline gate: passed"
    assert not any("not gated" in line for line in lines)


def test_fleet_png_shows_ttft_and_cold_prefills_per_route(fleet: SimpleNamespace, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = plots.plots(fleet.data, tmp_path)
    assert written == [str(tmp_path / "fleet.png")]  # no pair rows: no ttft.png or cached_tokens.png
    assert (tmp_path / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
