"""The baseline gate: what it refuses, when it fails, and the rows it shows.

Runs are built by hand (as in test_report.py) and baselines are results dicts written to files; the
gate over real vLLM runs is checked in test_e2e_cpu.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_apc.records import Measured
from pytest_apc.report import SCHEMA_PATH, gate, rows, terminal
from tests.test_verdict import delta, off_delta, record, settings

MODEL = "/home/ci/.cache/pytest-apc/models/tiny-llama-v1-0123456789ab"
H200_RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "h200" / "results.json"


def _session(pytester: pytest.Pytester, *args: str, block_size: int = 128, levels=(1, 8)) -> SimpleNamespace:
    """A session that measured C/D at ``levels`` on servers of ``block_size``."""
    s = settings(pytester, *args)
    runs = []
    for c in levels:
        off = record(s, "C", c, off_delta(s, "C"), 120.0, block_size=block_size)
        hits = off.prediction.expected_hits
        runs += [off, record(s, "D", c, delta(int(off.bench["total_input_tokens"]), hits), 40.0, block_size=block_size)]
    servers = {run.server.mode: run.server for run in runs}
    return SimpleNamespace(settings=s, measured=Measured(records={r.key: r for r in runs}, servers=servers),
                           json_model=lambda: MODEL)  # fmt: skip


def _data(apc: SimpleNamespace) -> rows.ReportData:
    return rows.ReportData.build(apc.measured.records, rows.Outcomes(), apc.settings)


def _results(apc: SimpleNamespace, data: rows.ReportData) -> dict[str, Any]:
    """What this session's results.json holds, as far as the gate reads it."""
    return {
        "schema_version": 1,
        "profile": apc.settings.profile,
        "model": "/other/node/models/tiny-llama-v1-0123456789ab",  # another node's cache folder, same model
        "settings": json.loads(json.dumps(apc.settings.as_dict())),
        "servers": [dict(info.__dict__) for info in apc.measured.servers.values()],
        "pairs": json.loads(json.dumps(data.pair_numbers())),
    }


def _gate(apc: SimpleNamespace, data: rows.ReportData, baseline: dict[str, Any], tmp_path: Path) -> gate.Gate:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))
    return gate.compare_baseline(apc, data, path)  # type: ignore[arg-type]


def test_a_comparable_baseline_passes_and_every_row_is_shown(pytester, tmp_path) -> None:
    apc = _session(pytester)
    data = _data(apc)
    result = _gate(apc, data, _results(apc, data), tmp_path)
    assert result.failures == []
    assert result.not_comparable == []
    assert [(r["pair"], r["concurrency"], r["result"]) for r in result.rows] == [("C/D", 1, "ok"), ("C/D", 8, "ok")]
    assert [m["metric"] for m in result.rows[0]["metrics"]] == ["ttft_on", "speedup", "cached_tokens"]
    assert all(m["result"] == "ok" and m["was"] == m["now"] for m in result.rows[0]["metrics"])
    assert apc.measured.warnings == []
    table = terminal.gate_table(result.rows).splitlines()
    assert table[0].split()[:2] == ["pair", "c"]
    assert [line.split()[-1] for line in table[2:]] == ["ok", "ok"]


@pytest.mark.parametrize(
    ("change", "args", "expected"),
    [
        ({"profile": "gpu"}, (), "profile cpu here vs gpu there"),
        ({"model": "/m/tiny-llama-v2-fedcba987654"}, (),
         "model tiny-llama-v1-0123456789ab here vs tiny-llama-v2-fedcba987654 there "
         "(generated tiny-llama model v1 vs v2)"),
        ({"model": "/models/Llama-3.1-70B"}, (), "model tiny-llama-v1-0123456789ab here vs Llama-3.1-70B there"),
        ({"settings": {"model_shape": "llama-3.1-8b"}}, (), "model_shape - here vs llama-3.1-8b there"),
        ({"settings": {"length_scale": 1.0}}, (), "length_scale 0.0625 here vs 1.0 there"),
        ({"settings": {"num_prompts": 10}}, (), "num_prompts 30 here vs 10 there"),
        ({"settings": {"output_len": 128}}, (), "output_len 256 here vs 128 there"),
        ({}, ("--apc-prefix-len=16384",), "prefix_len 16384 here vs 32768 there"),
        ({"settings": {"suffix_len": 512}}, (), "suffix_len 1024 here vs 512 there"),
        ({"settings": {"rag_prefix_len": 16000}}, (), "rag_prefix_len 32000 here vs 16000 there"),
        ({"settings": {"input_len": 8192}}, (), "input_len 32768 here vs 8192 there"),
        ({"settings": {"seed": 7}}, (), "seed 0 here vs 7 there"),
        ({"block_size": 16}, (), "block_size 128 here vs 16 there"),
    ],
)  # fmt: skip
def test_a_baseline_measured_otherwise_is_refused(pytester, tmp_path, change, args, expected) -> None:
    apc = _session(pytester, *args)
    data = _data(apc)
    baseline = _results(apc, data)
    for key, value in change.items():
        if key == "settings":
            baseline["settings"].update(value)
        elif key == "block_size":
            for server in baseline["servers"]:
                server["block_size"] = value
        else:
            baseline[key] = value
    if args:  # this run differs: the baseline keeps the default
        baseline["settings"].update(json.loads(json.dumps(settings(pytester).as_dict())))
    result = _gate(apc, data, baseline, tmp_path)
    assert result.failures == [f"not comparable with baseline {tmp_path / 'baseline.json'}: {expected}"]
    assert result.rows == []  # nothing compared
    assert len(result.not_comparable) == 1


def test_every_difference_is_named_in_one_message(pytester, tmp_path) -> None:
    apc = _session(pytester, block_size=16)
    data = _data(apc)
    baseline = _results(apc, data)
    baseline["settings"]["num_prompts"] = 10
    for server in baseline["servers"]:
        server["block_size"] = 128
    result = _gate(apc, data, baseline, tmp_path)
    assert result.failures == [
        f"not comparable with baseline {tmp_path / 'baseline.json'}: num_prompts 30 here vs 10 there; "
        "block_size 16 vs 128"
    ]
    assert result.not_comparable == [
        {"what": "num_prompts", "here": 30, "there": 10},
        {"what": "block_size", "here": 16, "there": 128},
    ]


def test_no_overlapping_row_fails(pytester, tmp_path) -> None:
    apc = _session(pytester, levels=(8,))
    data = _data(apc)
    baseline = _results(apc, data)
    for pair in baseline["pairs"]:
        pair["concurrency"] = 4
    result = _gate(apc, data, baseline, tmp_path)
    assert result.failures == [
        f"no row of this run is in baseline {tmp_path / 'baseline.json'}: this run has C/D c8; the baseline has C/D c4"
    ]
    assert result.rows == []


def test_a_row_missing_from_the_baseline_is_a_warning_while_others_overlap(pytester, tmp_path) -> None:
    apc = _session(pytester)
    data = _data(apc)
    baseline = _results(apc, data)
    baseline["pairs"] = [p for p in baseline["pairs"] if p["concurrency"] == 8]
    result = _gate(apc, data, baseline, tmp_path)
    assert result.failures == []
    assert [r["concurrency"] for r in result.rows] == [8]
    assert apc.measured.warnings == [f"baseline {tmp_path / 'baseline.json'} has no row C/D c1: not compared"]


def test_one_regression_fails_and_the_passing_rows_are_listed(pytester, tmp_path) -> None:
    apc = _session(pytester)
    data = _data(apc)
    baseline = _results(apc, data)
    c8 = next(p for p in baseline["pairs"] if p["concurrency"] == 8)
    c8["cached_tokens"] *= 2
    now = c8["cached_tokens"] // 2
    result = _gate(apc, data, baseline, tmp_path)
    assert len(result.failures) == 1
    assert result.failures[0].startswith(f"C/D c8: cached tokens {c8['cached_tokens']:,} -> {now:,} regressed by ")
    assert [(r["concurrency"], r["result"]) for r in result.rows] == [(1, "ok"), (8, "REGRESSED")]
    cached = result.rows[1]["metrics"][2]
    assert (cached["metric"], cached["result"], cached["allowed"], cached["limit"]) == (
        "cached_tokens", "REGRESSED", 0.0, c8["cached_tokens"]
    )  # fmt: skip
    assert [m["result"] for m in result.rows[1]["metrics"][:2]] == ["ok", "ok"]
    assert (result.compared, result.regressed) == (2, 1)
    table = terminal.gate_table(result.rows)
    assert f"{c8['cached_tokens']:,} -> {now:,} (>= {c8['cached_tokens']:,}) !" in table
    assert table.splitlines()[-1].endswith("REGRESSED")


def test_the_gate_block_is_schema_valid(pytester, tmp_path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    apc = _session(pytester)
    data = _data(apc)
    baseline = _results(apc, data)
    baseline["pairs"][0]["median_ttft_on_ms"] = None  # a metric the baseline lacks is shown, not compared
    result = _gate(apc, data, baseline, tmp_path)
    assert result.rows[0]["metrics"][0]["result"] == "not compared"
    gate_schema = json.loads(SCHEMA_PATH.read_text())["properties"]["gate"]
    jsonschema.validate(json.loads(json.dumps(result.to_json())), gate_schema)
    jsonschema.validate({"baseline": None, "failures": []}, gate_schema)  # files of earlier versions


def test_a_results_file_of_schema_version_1_is_read_as_a_baseline(pytester, tmp_path) -> None:
    """The H200 results in docs/ (schema_version 1, GPU profile): read, and refused for every difference."""
    apc = _session(pytester)
    data = _data(apc)
    result = gate.compare_baseline(apc, data, H200_RESULTS)  # type: ignore[arg-type]
    assert len(result.failures) == 1
    message = result.failures[0]
    assert message.startswith(f"not comparable with baseline {H200_RESULTS}: profile cpu here vs gpu there; ")
    for part in ("model tiny-llama-v1-0123456789ab vs llama-3.1-8b-shape-v1-e18e6ae6be32",
                 "model_shape - vs llama-3.1-8b", "length_scale 0.0625 vs 1.0", "block_size 128 vs 16"):  # fmt: skip
        assert part in message


def test_the_terminal_summary_prints_the_compared_rows_and_the_failures(pytester, tmp_path) -> None:
    apc = _session(pytester)
    data = _data(apc)
    baseline = _results(apc, data)
    baseline["pairs"][1]["cached_tokens"] *= 2
    result = _gate(apc, data, baseline, tmp_path)
    lines: list[str] = []
    tr = SimpleNamespace(config=pytester.parseconfig(), write_sep=lambda *a, **k: None,
                         write_line=lambda line, **k: lines.extend(line.splitlines()))  # fmt: skip
    apc.measured.launches, apc.json_path = {}, tmp_path / "results.json"
    terminal.terminal_summary(tr, apc, data, result)  # type: ignore[arg-type]
    start = lines.index(
        f"baseline {tmp_path / 'baseline.json'}: 2 rows compared, 1 regressed (baseline -> now (limit))"
    )
    assert lines[start + 1].split() == ["pair", "c", "TTFT", "ON", "ms", "gain", "OFF/ON", "cached", "tokens", "vs",
                                        "baseline"]  # fmt: skip
    assert lines[start + 3].startswith("C/D ")
    assert lines[start + 3].endswith(" ok")
    assert lines[start + 4].endswith(" REGRESSED")
    assert lines[start + 5].startswith("FAIL baseline: C/D c8: cached tokens ")
