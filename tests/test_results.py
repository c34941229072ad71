"""The results document: one builder and writer (``results.document``), one reader (``results.reader``),
and a run that reads back as the record it was written from, so that the gate judges what the file says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_apc.__main__ import main
from pytest_apc.gate import noise
from pytest_apc.measure.records import Repeat, RunRecord, server_from_json
from pytest_apc.results import document, reader
from tests.test_verdict import delta, off_delta, record, settings

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted((REPO / "docs" / "results").glob("**/results.json"))
GATE = REPO / "docs" / "results" / "h200-gate"
SAME_BUILD = [GATE / "same-build" / name / "results.json" for name in ("cd-1", "cd-2")]


def _repeated(run: RunRecord, ttfts_ms: list[float]) -> RunRecord:
    """``run`` with one more cold repeat whose requests took ``ttfts_ms``."""
    bench = {**run.bench, "ttfts": [t / 1000 for t in ttfts_ms], "duration": run.bench["duration"] * 1.1}
    run.repeats.append(Repeat(bench, run.delta, None, "reset", "r2.json", "cmd"))
    return run


def test_a_run_reads_back_as_the_record_it_was_written_from(pytester: pytest.Pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = _repeated(record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), 59392), 40.0), [38.0] * 30)
    for i, repeat in enumerate(on.repeats):  # what vLLM's benchmark saves besides the TTFTs
        repeat.bench |= {"latencies": [0.5 + i / 10 + j / 100 for j in range(30)], "median_tpot_ms": 9.0 + i}
    stored = json.loads(json.dumps(on.to_json()))
    back = RunRecord.from_json(stored, server_from_json(json.loads(json.dumps(on.server.__dict__))))
    assert (back.key, back.workload, back.server, back.prediction) == (on.key, on.workload, on.server, on.prediction)
    assert (back.header_tokens, back.wall_s) == (on.header_tokens, on.wall_s)
    assert [r.delta for r in back.repeats] == [r.delta for r in on.repeats]
    for statistic in ("mean", "median"):
        assert [r.ttft_ms(statistic) for r in back.repeats] == [r.ttft_ms(statistic) for r in on.repeats]
    assert noise.repeat_values(back) == [r.ttft_ms("mean") for r in on.repeats]
    assert noise.repeat_values(back, "duration_s") == [r.bench["duration"] for r in on.repeats]
    assert back.to_json()["repeat_counters"] == stored["repeat_counters"]
    # Latencies the file keeps without their samples read back as written (a resumed session's pair rows).
    pooled = ("median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_e2el_ms", "p99_e2el_ms")
    assert all(stored[name] is not None for name in pooled)
    assert {name: back.to_json()[name] for name in pooled} == pytest.approx(
        {name: stored[name] for name in pooled}, abs=1e-3
    )  # the file keeps each TTFT to the microsecond


def test_a_run_of_a_file_without_per_repeat_ttfts_reads_its_share_of_the_pooled_ones() -> None:
    """schema_version 1 kept the per-request TTFTs pooled over the repeats: migrated, each repeat's mean is
    that of its share; the median of a repeat is not known."""
    (h200,) = [p for p in COMMITTED if p.parent.name == "h200"]
    doc = reader.read(h200)
    run = next(r for r in doc.runs if r.key.id == "D-c8")
    stored = next(r for r in doc.data["runs"] if r["id"] == "D-c8")
    assert doc.data["schema_version"] == 9  # migrated by scripts/migrate_results.py
    assert noise.repeat_values(run) == [pytest.approx(sum(stored["ttfts_ms"]) / len(stored["ttfts_ms"]))]
    assert noise.repeat_values(run, "median_ttft_ms") is None


def test_timing_stays_the_last_block_whatever_is_added() -> None:
    doc = {"schema_version": 6, "runs": [], "timing": {"suite_elapsed_s": 1.0}}
    added = document.with_blocks(doc, {"verdicts": [], "files": {"json": "x"}})
    assert list(added) == ["schema_version", "runs", "verdicts", "files", "timing"]
    assert list(document.with_blocks(added, {"runs": [1]})) == list(added)  # replaced in place


def test_calibrate_writes_its_baseline_through_the_one_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    written: list[Path] = []
    real = document.write
    monkeypatch.setattr(document, "write", lambda path, data: written.append(path) or real(path, data))
    baseline = tmp_path / "baseline.json"
    baseline.write_text(SAME_BUILD[0].read_text())
    assert main(["calibrate", *map(str, SAME_BUILD), "--write", str(baseline)]) == 0
    assert written == [baseline]
    saved = json.loads(baseline.read_text())
    assert list(saved)[-2:] == ["calibration", "timing"]
    capsys.readouterr()


def _committed(name: str) -> dict:
    return json.loads((REPO / "docs" / "results" / name / "results.json").read_text())


@pytest.mark.parametrize(
    ("name", "version", "damage", "field"),
    [
        ("fleet-cpu", 6, lambda d: d["servers"][0].pop("served_model_name"), "servers[0].served_model_name"),
        ("cpu", 5, lambda d: d["runs"][0].pop("external_tokens"), "runs[0].external_tokens"),
        ("h200-gate/same-build/cd-1", 4, lambda d: d["runs"][0]["repeat_counters"][0].pop("mean_ttft_ms"),
         "runs[0].repeat_counters[0].mean_ttft_ms"),
    ],
)  # fmt: skip
def test_what_a_schema_version_added_is_required_from_that_version_on(name, version, damage, field) -> None:
    doc = _committed(name)
    assert doc["schema_version"] == 9  # migrated by scripts/migrate_results.py
    damage(doc)
    assert reader.problem({**doc, "schema_version": version}) == f"{field} is missing (its schema_version has it)"
    assert reader.problem({**doc, "schema_version": version - 1}) is None  # an older file may lack it


def test_a_problem_names_the_field_and_what_it_is(tmp_path: Path) -> None:
    doc = _committed("cpu")
    doc["runs"][0]["concurrency"] = 0
    assert reader.problem(doc) == "runs[0].concurrency is 0, below the minimum 1"
    doc = _committed("cpu")
    doc["verdicts"][0]["name"] = "fast_enough"
    assert reader.problem(doc).startswith('verdicts[0].name is "fast_enough", not one of "apc_really_off", ')
    doc = _committed("cpu")
    doc["errors"] = {"Z-c8": "it broke"}
    assert reader.problem(doc) == "errors: not a run id: 'Z-c8' (expected e.g. 'D-c8')"
    path = tmp_path / "r.json"
    path.write_text('{"schema_version": 5, "runs": [{"wall_s": NaN}]}')
    with pytest.raises(reader.BadResults, match=r"^cannot read results file .*r\.json: NaN is not a JSON number$"):
        reader.read(path)
    path.write_text("[" * 100_000)  # deeper than Python's parser goes
    with pytest.raises(reader.BadResults, match=r"^cannot read results file .*r\.json: maximum recursion depth"):
        reader.read(path)
