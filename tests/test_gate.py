"""The baseline gate: what it refuses, when it fails, the limit it applies and the rows it shows.

Results documents are built by the document module from records made by hand (a baseline is written to a
file and read back, checked, as --apc-baseline reads it); the gate over real vLLM runs is checked
in test_e2e_cpu.py, and its false alarms and detection on the committed H200 and CPU runs in test_docs.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_apc.gate import compare as gate
from pytest_apc.gate import noise
from pytest_apc.measure.records import Measured, Repeat, RunRecord
from pytest_apc.report import terminal
from pytest_apc.results import SCHEMA_PATH, document, reader
from pytest_apc.results.view import ReportView
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.workload.cases import RunKey, workload_for
from tests.test_verdict import settings

MODEL = "/home/ci/.cache/pytest-apc/models/tiny-llama-v1-0123456789ab"
H200_RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "h200" / "results.json"
HITS = 59392
ALPHA = 0.01 / 2  # two runs judged: the gate's 1% split over them


def _server(mode: str, *extra: str) -> ServerInfo:
    command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, *extra]
    return ServerInfo(mode, command, "http://127.0.0.1:8000", "/tmp/server.log", block_size=128,
                      cache_config={"cache_dtype": "auto"})  # fmt: skip


def _run(s: Any, run_id: str, values: list[float], hits: int | None = HITS) -> RunRecord:
    """A run of these per-repeat mean TTFTs (ms), each repeat 2 s long."""
    case, concurrency = run_id.split("-c")
    key = RunKey(case, int(concurrency))
    bench = {"completed": 30, "failed": 0, "total_input_tokens": 64266, "duration": 2.0}
    delta = Delta(None, hits if key.apc else 0, None, None, None, None, None, {})
    repeats = [Repeat({**bench, "mean_ttft_ms": v, "median_ttft_ms": v}, delta, None, None, "r.json", "cmd")
               for v in values]  # fmt: skip
    server = _server("apc-on" if key.apc else "apc-off")
    return RunRecord(key, workload_for(key.family, s), server, repeats, 26, 2.0 * len(values))


def _doc(pytester: pytest.Pytester, runs: dict[str, list[float]], *args: str, **environment: Any) -> dict[str, Any]:
    """A results document as the session writes it: cpu profile, C/D runs with these per-repeat mean TTFTs."""
    s = settings(pytester, *args)
    records = [_run(s, run_id, values) for run_id, values in runs.items()]
    measured = Measured(records={r.key: r for r in records}, servers={m: _server(m) for m in ("apc-off", "apc-on")})
    doc = json.loads(json.dumps(document.document(s, measured, MODEL, "2026-12-01T00:00:00+00:00", 10.0)))
    env = {"pytest_apc": "0.4.0", "vllm": "0.32.0", "torch": "2.13.0+cpu", "python": "3.12.3", "platform": "Linux",
           "gpus": [], "git_commit": None, "gpu_model": None, "gpu_count": 0, **environment}  # fmt: skip
    return document.with_blocks(doc, {"verdicts": [], "environment": env})


SAME = {"C-c8": [100.0, 104.0, 98.0], "D-c8": [40.0, 41.0, 39.5]}


def _gate(old: dict[str, Any], new: dict[str, Any], tmp_path: Path, repeats: int = 3) -> gate.Gate:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(old))
    return gate.compare_documents(reader.read(path, "baseline"), new, str(path), 0.01, repeats)


def test_a_comparable_baseline_passes_and_every_run_is_shown(pytester, tmp_path) -> None:
    doc = _doc(pytester, SAME)
    result = _gate(doc, _doc(pytester, {"C-c8": [101.0, 99.0, 103.0], "D-c8": [40.5, 39.0, 41.0]}), tmp_path)
    assert result.failures == []
    assert result.not_comparable == []
    assert result.warnings == []
    assert [(r["run"], r["repeats"], r["result"]) for r in result.rows] == [
        ("C-c8", [3, 3], "ok"),
        ("D-c8", [3, 3], "ok"),
    ]
    assert [m["metric"] for m in result.rows[0]["metrics"]] == ["ttft"]  # an OFF run has no cached tokens
    ttft, hits = result.rows[1]["metrics"]
    assert (hits["metric"], hits["was"], hits["now"], hits["result"]) == ("cached_tokens", HITS, HITS, "ok")
    default = noise.PROFILE_NOISE["cpu"]
    assert ttft["was"] == pytest.approx(noise.k_center([40.0, 41.0, 39.5]))
    assert ttft["limit"] == pytest.approx(ttft["was"] * default.limit(3, 3, ALPHA))
    assert (ttft["within"], ttft["between"], ttft["noise"]) == (default.within, default.between, default.source)
    assert result.rule["alpha_per_run"] == ALPHA
    assert result.rule["runs_judged"] == 2
    assert result.rule["benchmark_s"] == 12.0
    assert result.rule["extra_s"] == 8.0
    table = terminal.gate_table(result.rows).splitlines()
    assert table[0].split()[:4] == ["run", "K", "mean", "TTFT"]
    assert [line.split()[0] for line in table[2:]] == ["C-c8", "D-c8"]
    assert [line.split()[-1] for line in table[2:]] == ["ok", "ok"]


@pytest.mark.parametrize("factor", [0.999, 1.001])
def test_a_ttft_rise_fails_exactly_beyond_the_limit_its_noise_allows(pytester, tmp_path, factor) -> None:
    old = _doc(pytester, SAME)
    limit = noise.PROFILE_NOISE["cpu"].limit(3, 3, ALPHA)
    new = _doc(pytester, {"C-c8": SAME["C-c8"], "D-c8": [v * limit * factor for v in SAME["D-c8"]]})
    result = _gate(old, new, tmp_path)
    regressed = factor > 1
    assert [r["result"] for r in result.rows] == ["ok", "REGRESSED" if regressed else "ok"]
    assert bool(result.failures) == regressed
    if regressed:
        (message,) = result.failures
        assert message.startswith("D-c8: mean TTFT (median of the cold repeats) 40.0 -> ")
        assert f"is above the limit {terminal.num(noise.k_center(SAME['D-c8']) * limit)} ms" in message
        assert "at 3/3 repeats; false alarm 0.50%) against " in message


def test_the_false_alarm_budget_is_split_over_the_runs_judged(pytester, tmp_path) -> None:
    """One run judged alone gets the whole 1%; with a second run each gets 0.5%, so a wider limit."""
    old = _doc(pytester, SAME)
    alone = _gate(old, _doc(pytester, {"D-c8": SAME["D-c8"]}), tmp_path)
    both = _gate(old, _doc(pytester, SAME), tmp_path)
    assert alone.rule["alpha_per_run"] == 0.01
    assert both.rule["alpha_per_run"] == 0.005
    assert alone.rows[0]["metrics"][0]["allowed"] < both.rows[1]["metrics"][0]["allowed"]


def test_fewer_cached_tokens_fail_and_more_do_not(pytester, tmp_path) -> None:
    old = _doc(pytester, SAME)
    fewer = _doc(pytester, SAME)
    fewer["runs"][1]["repeat_counters"][2]["delta"] = {"prefix_cache_hits": HITS - 128}  # one repeat lost a block
    result = _gate(old, fewer, tmp_path)
    assert result.failures == [
        f"D-c8: cached tokens {HITS:,} -> {HITS - 128:,} (fewest of any repeat) fell by 128 against "
        f"{tmp_path / 'baseline.json'}"
    ]
    assert "59,392 -> 59,264 !" in terminal.gate_table(result.rows)
    more = _doc(pytester, SAME)
    for counter in more["runs"][1]["repeat_counters"]:
        counter["delta"] = {"prefix_cache_hits": HITS + 128}
    assert _gate(old, more, tmp_path).failures == []


def test_a_baseline_with_fewer_repeats_than_the_rule_needs_is_refused(pytester, tmp_path) -> None:
    old = _doc(pytester, {"C-c8": [100.0], "D-c8": [40.0, 41.0]})
    result = _gate(old, _doc(pytester, SAME), tmp_path)
    baseline = tmp_path / "baseline.json"
    assert result.failures == [
        f"baseline {baseline} has 1 cold repeat of C-c8; the gate needs 3 or more (measure the baseline with "
        "--apc-repeats 3)",
        f"baseline {baseline} has 2 cold repeats of D-c8; the gate needs 3 or more (measure the baseline with "
        "--apc-repeats 3)",
    ]
    assert [m["metric"] for row in result.rows for m in row["metrics"]] == ["cached_tokens"]  # still exact
    assert _gate(old, _doc(pytester, SAME), tmp_path, repeats=1).failures == []  # a rule that needs only 1
    short = _gate(_doc(pytester, SAME), _doc(pytester, {"C-c8": SAME["C-c8"], "D-c8": [40.0]}), tmp_path)
    assert short.failures == [
        f"this run has 1 cold repeat of D-c8; the gate needs 3 or more against baseline {baseline}"
    ]


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
        ({}, ("--apc-set=prefix_len=16384",), "prefix_len 16384 here vs 32768 there"),
        ({"settings": {"seed": 7}}, (), "seed 0 here vs 7 there"),
        ({"block_size": 16}, (), "block_size 128 here vs 16 there"),
        ({"environment": {"gpu_count": 8}}, (), "gpu_count 0 here vs 8 there"),
        ({"server_arg": ("--tensor-parallel-size", "2")}, (), "tensor_parallel_size (apc-on) 1 here vs 2 there"),
        ({"server_arg": ("-dp", "2")}, (), "data_parallel_size (apc-on) 1 here vs 2 there"),
        ({"server_arg": ("--dtype=float16",)}, (), "dtype (apc-on) auto here vs float16 there"),
        ({"kv_cache_dtype": "fp8"}, (), "kv_cache_dtype (apc-on) auto here vs fp8 there"),
    ],
)  # fmt: skip
def test_a_baseline_measured_otherwise_is_refused(pytester, tmp_path, change, args, expected) -> None:
    new = _doc(pytester, SAME, *args)
    old = _doc(pytester, SAME)
    for key, value in change.items():
        if key in ("settings", "environment"):
            old[key].update(value)
        elif key == "block_size":
            for server in old["servers"]:
                server["block_size"] = value
        elif key == "server_arg":
            old["servers"][1]["command"] += list(value)
        elif key == "kv_cache_dtype":
            old["servers"][1]["cache_config"]["cache_dtype"] = value
        else:
            old[key] = value
    result = _gate(old, new, tmp_path)
    assert result.failures == [f"not comparable with baseline {tmp_path / 'baseline.json'}: {expected}"]
    assert result.rows == []  # nothing compared
    assert len(result.not_comparable) == 1


def test_another_gpu_model_and_layout_are_named_in_one_message(pytester, tmp_path) -> None:
    new = _doc(pytester, SAME, gpu_model="NVIDIA H200", gpu_count=8)
    old = _doc(pytester, SAME, gpu_model="NVIDIA H100 80GB HBM3", gpu_count=4)
    old["settings"]["num_prompts"] = 10
    old["servers"][1]["command"] += ["--tensor-parallel-size", "4"]
    new["servers"][1]["command"] += ["--tensor-parallel-size", "8"]
    result = _gate(old, new, tmp_path)
    assert result.failures == [
        f"not comparable with baseline {tmp_path / 'baseline.json'}: num_prompts 30 here vs 10 there; "
        "gpu_model NVIDIA H200 vs NVIDIA H100 80GB HBM3; gpu_count 8 vs 4; tensor_parallel_size (apc-on) 8 vs 4"
    ]


def test_another_vllm_version_is_compared_and_named(pytester, tmp_path) -> None:
    new = _doc(pytester, SAME, vllm="0.33.0")
    result = _gate(_doc(pytester, SAME), new, tmp_path)
    assert result.failures == []
    note = gate.BENCHMARK_CHANGES[0][1]
    assert result.changes == [{"what": "vllm", "here": "0.33.0", "there": "0.32.0", "note": note}]
    lines = [text for text, _ in terminal.gate_lines(result.to_json())]
    assert f"compared across vllm 0.33.0 here vs 0.32.0 there ({note})" in lines


def test_a_vllm_change_names_the_benchmark_definitions_that_changed_between_the_two() -> None:
    """Between two vLLM versions on either side of a release whose benchmark measures differently, the change
    carries what differs; within one side of it, nothing."""
    assert gate.benchmark_changes("0.32.0", "0.33.1") == [gate.BENCHMARK_CHANGES[0][1]]
    assert gate.benchmark_changes("0.34.0", "0.26.0") == [gate.BENCHMARK_CHANGES[0][1]]
    assert gate.benchmark_changes("0.26.0", "0.32.0") == []
    assert gate.benchmark_changes("0.33.0", "0.33.2+cpu") == []
    assert gate.benchmark_changes("0.33.0", "dev") == []
    other = {"environment": {"vllm": "0.32.0", "torch": "2.13.0"}}
    assert gate.version_changes({"environment": {"vllm": "0.32.1", "torch": "2.14.0"}}, other) == [
        {"what": "vllm", "here": "0.32.1", "there": "0.32.0"},
        {"what": "torch", "here": "2.14.0", "there": "2.13.0"},
    ]


def test_no_overlapping_run_fails_and_a_missing_one_is_a_warning(pytester, tmp_path) -> None:
    old = _doc(pytester, {"C-c4": SAME["C-c8"], "D-c4": SAME["D-c8"]})
    result = _gate(old, _doc(pytester, SAME), tmp_path)
    baseline = tmp_path / "baseline.json"
    assert result.failures == [
        f"no run of this run is in baseline {baseline}: this run has C-c8, D-c8; the baseline has C-c4, D-c4"
    ]
    partly = _gate(_doc(pytester, {"D-c8": SAME["D-c8"]}), _doc(pytester, SAME), tmp_path)
    assert partly.failures == []
    assert [r["run"] for r in partly.rows] == ["D-c8"]
    assert partly.warnings == [f"baseline {baseline} has no run C-c8: not compared"]


def test_fleet_runs_are_not_gated(pytester, tmp_path) -> None:
    fleet = _doc(pytester, {})
    fleet["runs"] = [{**_run(settings(pytester), "R-c8", SAME["D-c8"]).to_json(), "id": "R-c8-round_robin",
                      "route": "round_robin"}]  # fmt: skip
    result = _gate(_doc(pytester, SAME), fleet, tmp_path)
    assert result.failures == [
        f"nothing was measured to compare with baseline {tmp_path / 'baseline.json'}: the fleet runs "
        "(R-c8-round_robin) are not gated (the gate compares single-server runs only)"
    ]


def test_a_calibration_in_the_baseline_sets_each_runs_limit(pytester, tmp_path) -> None:
    old = _doc(pytester, SAME)
    calibration = noise.Calibration(
        rows={"D-c8": noise.Spread(3, 9, 40.0, 0.01, 6, 0.0001, 2)}, between=0.01, between_df=2, files=["a", "b", "c"]
    )
    old["calibration"] = calibration.to_json()
    rise = {"C-c8": SAME["C-c8"], "D-c8": [v * 1.08 for v in SAME["D-c8"]]}  # +8%: inside the cpu default
    result = _gate(old, _doc(pytester, rise), tmp_path)
    d8 = result.rows[1]["metrics"][0]
    assert (d8["within"], d8["between"]) == (0.01, 0.01)
    assert d8["noise"] == (
        f"the calibration in {tmp_path / 'baseline.json'} (3 results files; 2 degrees of freedom between runs, "
        "6 or more within a run)"
    )
    assert d8["allowed"] == pytest.approx(math.exp(noise.z(ALPHA) * math.sqrt(2 * 0.01**2 + 0.01**2 * 2 * 0.448671)))
    assert d8["result"] == "REGRESSED"  # the calibrated node is quiet: 8% is a regression there
    c8 = result.rows[0]["metrics"][0]  # C was not calibrated: its within-run spread is the default's
    assert (c8["within"], c8["between"]) == (noise.PROFILE_NOISE["cpu"].within, 0.01)
    assert "(between-run spread only), the rest from the cpu profile's default" in c8["noise"]
    assert _gate(_doc(pytester, SAME), _doc(pytester, rise), tmp_path).failures == []  # uncalibrated: passes


def test_repeats_spreading_far_more_than_assumed_are_a_warning(pytester, tmp_path) -> None:
    old = _doc(pytester, {"C-c8": SAME["C-c8"], "D-c8": [40.0, 80.0, 20.0]})
    result = _gate(old, _doc(pytester, {"C-c8": SAME["C-c8"], "D-c8": [40.0, 20.0, 80.0]}), tmp_path)
    assert result.failures == []
    (warning,) = result.warnings
    assert warning.startswith("D-c8: its repeats spread ")
    assert "the gate's false-alarm rate is not what it says on this node; calibrate it" in warning


def test_the_gate_block_is_schema_valid(pytester, tmp_path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    result = _gate(_doc(pytester, SAME), _doc(pytester, SAME, vllm="0.33.0"), tmp_path)
    gate_schema = json.loads(SCHEMA_PATH.read_text())["properties"]["gate"]
    jsonschema.validate(json.loads(json.dumps(result.to_json())), gate_schema)
    jsonschema.validate({"baseline": None, "failures": []}, gate_schema)  # files of earlier versions


def test_a_results_file_of_schema_version_1_is_read_as_a_baseline(pytester, tmp_path) -> None:
    """The H200 results in docs/ (schema_version 1, GPU profile): read, and refused for every difference."""
    result = gate.compare_documents(reader.read(H200_RESULTS), _doc(pytester, SAME), str(H200_RESULTS), 0.01, 3)
    (message,) = result.failures
    assert message.startswith(f"not comparable with baseline {H200_RESULTS}: profile cpu here vs gpu there; ")
    for part in ("model tiny-llama-v1-0123456789ab vs llama-3.1-8b-shape-v1-e18e6ae6be32",
                 "model_shape - vs llama-3.1-8b", "length_scale 0.0625 vs 1.0", "block_size 128 vs 16",
                 "gpu_count 0 vs 1"):  # fmt: skip
        assert part in message


def test_the_terminal_summary_prints_the_rule_the_runs_and_the_failures(pytester, tmp_path) -> None:
    old = _doc(pytester, SAME)
    new = _doc(pytester, {"C-c8": SAME["C-c8"], "D-c8": [v * 3 for v in SAME["D-c8"]]})
    result = _gate(old, new, tmp_path)
    lines: list[str] = []
    tr = SimpleNamespace(config=pytester.parseconfig(), write_sep=lambda *a, **k: None,
                         write_line=lambda line, **k: lines.extend(line.splitlines()))  # fmt: skip
    view = ReportView.from_document({**new, "gate": result.to_json()}, str(tmp_path / "results.json"))
    terminal.terminal_summary(tr, view)
    start = lines.index(
        f"baseline {tmp_path / 'baseline.json'}: 2 runs compared, 1 regressed (baseline -> now (limit))"
    )
    assert lines[start + 1] == (
        "rule: mean TTFT (median of the cold repeats) may rise as far as its noise allows; a build that did not "
        "change fails this gate with probability <= 1% (0.50% for each of 2 runs)"
    )
    assert lines[start + 2] == (
        "cost: the 2 judged runs took 0.2 min of benchmarks here, 0.1 min more than one repeat each would"
    )
    assert lines[start + 3] == f"noise: {noise.PROFILE_NOISE['cpu'].source}"
    assert lines[start + 4].split()[:2] == ["run", "K"]
    assert lines[start + 6].startswith("C-c8 ")
    assert lines[start + 6].endswith(" ok")
    assert lines[start + 7].startswith("D-c8 ")
    assert lines[start + 7].endswith(" REGRESSED")
    assert "+200.0%" in lines[start + 7]
    assert lines[start + 8].startswith("FAIL baseline: D-c8: mean TTFT (median of the cold repeats) ")


def test_offload_and_multiturn_runs_are_named_not_gated() -> None:
    """A file of offload and multi-turn runs alone (a real session's) is refused naming them, not as an
    incomplete run, both as the baseline and as the run gated against a baseline of the six cases."""
    path = Path(__file__).parents[1] / "docs" / "results" / "h100-vllm-0.33-offload" / "results.json"
    doc = json.loads(path.read_text())
    ids = "M-c1-offload-tier, M-c1-small-cache, O-c1, O-c8"
    refused = gate.compare_documents(doc, doc, "b.json", 0.01, 3)
    assert refused.failures == [
        f"baseline b.json has no measured runs to compare with: its offload and multi-turn runs ({ids}) "
        "are not gated (the gate compares cases A to F only)"
    ]
    single = json.loads((path.parents[1] / "h200-gate" / "same-build" / "cd-1" / "results.json").read_text())
    nothing = gate.compare_documents(single, doc, "b.json", 0.01, 3)
    assert nothing.failures == [
        f"nothing was measured to compare with baseline b.json: the offload and multi-turn runs ({ids}) "
        "are not gated (the gate compares cases A to F only)"
    ]
