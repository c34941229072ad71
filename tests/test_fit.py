"""Workloads that fit the model (workload.fit): a selection too long for the context is scaled by one
power-of-two factor when the user set no length scale, or its runs that do not fit are skipped when they
did; the prediction stays exact; the table and results.json say which; a server run elsewhere says its
context in /v1/models."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_apc.config import CPU_LENGTH_SCALE, EXTERNAL_FLEET, Settings
from pytest_apc.measure.records import Measured
from pytest_apc.measure.session import ApcSession
from pytest_apc.report.markdown import markdown
from pytest_apc.report.terminal import summary_lines
from pytest_apc.results import document, reader
from pytest_apc.results.view import ReportView
from pytest_apc.serving.client import http_session
from pytest_apc.serving.deployment import external_context, served_max_model_len
from pytest_apc.workload import fit
from pytest_apc.workload.cases import FAMILY_LENGTHS, RunKey, ServerMode, predict, workload_for
from pytest_apc.workload.models import SHAPES
from tests.conftest import default_settings

REPO = Path(__file__).resolve().parent.parent
MATRIX = [RunKey(case, 8) for case in "ABCDEF"]
PURE = [RunKey("C", 8), RunKey("D", 8)]
GIVEN = {"length_scale": "option --apc-length-scale"}


def tiny_32k(**changes: Any) -> tuple[Settings, fit.Context]:
    """The tiny-32k shape on --cpu-node (lengths 1/16 of the full workload's) and its context."""
    settings = default_settings("cpu", model_shape="tiny-32k", **changes)
    context = fit.model_context(settings)
    assert context == fit.Context(2288, "max_position_embeddings 2288 in the tiny-32k shape")
    return settings, context


def test_the_tiny_32k_shape_is_a_32k_model_at_the_cpu_profiles_lengths() -> None:
    """Its context is 32768 at 1/16, with the chat template's room, which is not scaled, added whole: every
    selection is fitted by the factor it gets on a 32K model at full length."""
    scaled = 32768 * CPU_LENGTH_SCALE + fit.TEMPLATE_HEADROOM * (1 - CPU_LENGTH_SCALE)
    assert SHAPES["tiny-32k"]["max_position_embeddings"] == scaled == 2288
    assert SHAPES["tiny-32k"]["rope_scaling"] is None  # no llama3 scaling: 2288 is the context vLLM derives
    full = fit.Context(32768, "a 32K model")
    for keys in (PURE, MATRIX, [RunKey("A", 8)], [RunKey("E", 1)]):
        on_gpu = fit.fit_runs(default_settings("gpu"), keys, full)
        on_cpu = fit.fit_runs(tiny_32k()[0], keys, tiny_32k()[1])
        assert on_gpu is not None
        assert on_cpu is not None
        assert on_cpu.factor == on_gpu.factor == 0.5


def test_a_selection_too_long_is_scaled_by_the_largest_power_of_two_that_fits() -> None:
    settings, context = tiny_32k()
    # C/D at 1/16 need 2048 + 64 + 16 + 256 = 2384 tokens; at 1/32, 1320.
    pure = fit.fit_runs(settings, PURE, context)
    assert pure == fit.Fitted(2288, context.source, fit.SCALED, 0.0625, 0.03125)
    assert pure.factor == 0.5
    assert pure.summary == (
        "lengths scaled by 1/2 to fit a 2,288-token context (max_position_embeddings 2288 in the tiny-32k shape): "
        "length scale 0.03125 in place of 0.0625 (set --apc-length-scale to choose one)"
    )
    # E/F at 1/32 need 1000 + 1024 + 8 + 256 = 2288; against 2,048 tokens the whole selection goes to 1/4, one
    # factor for every case.
    short = fit.Context(2048, "x")
    matrix = fit.fit_runs(settings, MATRIX, short)
    assert matrix is not None
    assert matrix.length_scale == 0.015625
    scaled = matrix.apply(settings)
    assert all(fit.need(workload_for(key.family, scaled)) <= 2048 for key in MATRIX)
    assert fit.check(scaled, MATRIX, short) is None
    assert fit.launch_len(scaled, MATRIX) <= 2048
    # What fits is left as it is; what no scale fits (the template alone needs more) is refused in one line.
    assert fit.fit_runs(default_settings("cpu"), MATRIX, fit.model_context(default_settings("cpu"))) is None
    with pytest.raises(fit.DoesNotFit, match=r"^the selected runs do not fit the context of 200 tokens \(x\): "):
        fit.fit_runs(settings, PURE, fit.Context(200, "x"))


def test_with_the_scale_set_by_the_user_the_runs_that_do_not_fit_are_skipped() -> None:
    settings, context = tiny_32k(length_scale=0.03125, sources=GIVEN)
    assert fit.fit_runs(settings, MATRIX, context) is None  # E/F need exactly 2288
    short = fit.Context(2048, "the shape")
    fitted = fit.fit_runs(settings, MATRIX, short)
    assert fitted is not None
    assert fitted.rule == fit.SKIPPED
    assert fitted.apply(settings) == settings  # their scale kept
    assert list(fitted.skipped) == ["E-c8", "F-c8"]
    assert fitted.skipped["E-c8"] == (
        "run E-c8 needs 2,288 tokens (prompt 2024 + output 8 + 256 for the chat template), more than the "
        "2,048-token context (the shape) at --apc-length-scale 0.03125 (option --apc-length-scale); to measure "
        "it: run with --apc-length-scale 0.027 (every length scaled; the expected hits follow)"
    )
    assert fitted.summary == (
        "runs E-c8, F-c8 skipped: longer than a 2,048-token context (the shape) at --apc-length-scale 0.03125; "
        "to measure them: run with --apc-length-scale 0.027 (every length scaled; the expected hits follow)"
    )
    # Nothing left to measure: refused, as before, with the sweep's own fix among the others.
    swept = replace(settings, sweep_cases="EF")
    with pytest.raises(fit.DoesNotFit, match=r"\(the sweep: --apc-set sweep_cases without them\)$"):
        fit.fit_runs(swept, [RunKey("E", 1), RunKey("F", 8)], short)


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("family", ["overhead", "pure", "rag", "fleet"])
def test_a_scaled_workload_predicts_its_hits_exactly(tmp_path: Path, family: str, block_size: int) -> None:
    """The workload the session measures after a fit is the scaled settings' (workload_for), and its expected
    hits are the closed form over those scaled lengths: (N - G) x floor((H + P) / B) x B + (G - 1) x floor(H/B) x B."""
    settings, context = tiny_32k()
    fitted = fit.fit_runs(settings, MATRIX, context)
    assert fitted is not None
    session = ApcSession(settings=settings, run_dir=tmp_path, json_path=tmp_path / "results.json")
    session.plan.add(MATRIX)
    session.apply_fit(fitted)
    measured = workload_for(family, session.settings)  # what session._measure_mode sends
    prefix_setting, suffix_setting = FAMILY_LENGTHS[family]
    scale = settings.length_scale * fitted.factor
    prefix = round(getattr(settings, prefix_setting) * scale) if prefix_setting else 0
    assert (measured.prefix_len, measured.suffix_len) == (prefix, round(getattr(settings, suffix_setting) * scale))
    header = 26  # the generated tokenizer's chat header
    n, groups = measured.num_prompts, measured.prefix_groups
    total = n * (header + measured.prompt_len)
    expected = (n - groups) * ((header + prefix) // block_size) * block_size
    expected += (groups - 1) * (header // block_size) * block_size
    assert predict(measured, header, block_size, total).expected_hits == expected


def test_a_fit_reaches_every_process_and_the_results_file(tmp_path: Path) -> None:
    """Decided at collection by the process that collects, kept in the store: the controller of an xdist run
    adopts it with the runs (its settings measure at the fitted scale), and results.json keeps it as ``fit``."""
    settings, context = tiny_32k()
    fitted = fit.fit_runs(settings, PURE, context)
    assert fitted is not None
    worker = ApcSession(settings=settings, run_dir=tmp_path, json_path=tmp_path / "results.json", is_worker=True)
    worker.plan.add(PURE)
    worker.apply_fit(fitted)
    controller = ApcSession(settings=settings, run_dir=tmp_path, json_path=tmp_path / "results.json")
    controller.load_store()
    assert controller.measured.fit == fitted
    assert controller.settings.length_scale == 0.03125
    doc = document.with_blocks(document.of_session(controller), {"verdicts": []})
    assert doc["fit"] == {
        "context": 2288, "source": context.source, "rule": "scaled", "requested_length_scale": 0.0625,
        "length_scale": 0.03125, "skipped": {}, "fix": "", "summary": fitted.summary,
    }  # fmt: skip
    assert doc["settings"]["length_scale"] == 0.03125  # what the gate compares
    assert reader.problem(json.loads(json.dumps(doc))) is None
    assert fit.Fitted.from_dict(doc["fit"]) == fitted
    assert Measured.from_state(json.loads(json.dumps(controller.measured.to_state()))).fit == fitted


def test_the_table_says_how_the_runs_were_fitted_and_old_files_read_as_before() -> None:
    settings, context = tiny_32k()
    fitted = fit.fit_runs(settings, PURE, context)
    assert fitted is not None
    measured = Measured(fit=fitted)
    doc = document.document(fitted.apply(settings), measured, "m", "2026-01-01T00:00:00+00:00", 1.0)
    view = ReportView.from_document(document.with_blocks(doc, {"verdicts": []}), "results.json")
    assert view.fit == fitted.summary
    lines = [text for text, _ in summary_lines(view)]
    assert lines[1] == fitted.summary
    assert lines[1].startswith("lengths scaled by 1/2 to fit a 2,288-token context ")
    assert f"**{fitted.summary}**" in markdown(view)
    for path in sorted((REPO / "docs" / "results").glob("*/results.json")):  # written before the field
        old = reader.read(path)
        assert ReportView.from_document(old.data, str(path)).fit == ""


def _fake(tmp_path: Path, max_model_len: int):
    from tests.test_faults import _start_fake

    return _start_fake(tmp_path, "--enable-prefix-caching", "--max-model-len", str(max_model_len))


def test_a_server_run_elsewhere_says_its_context_in_v1_models(tmp_path: Path) -> None:
    on, url = _fake(tmp_path, 1500)
    try:
        settings = default_settings("cpu", url_on=url)
        assert external_context(settings, [ServerMode(True)]) == fit.Context(
            1500, f"max_model_len 1500 in /v1/models of {url}"
        )
        assert external_context(settings, [ServerMode(False)]) is None  # the OFF server is launched
        fleet = default_settings("gpu", fleet_url="http://gateway", metrics_url=(url,), replica_api_key="k")
        assert external_context(fleet, [ServerMode(True, fleet=EXTERNAL_FLEET)]) == fit.Context(
            1500, f"max_model_len 1500 in /v1/models of {url}"
        )  # its replicas', asked with their own key
        named = replace(settings, served_model_name="other", sources={"served_model_name": "option"})
        assert served_max_model_len(http_session("", ""), url, named) is None  # it serves apc-model
    finally:
        on.kill()
    from tests.test_fleet_faults import _free_url

    assert served_max_model_len(http_session("", ""), _free_url(), settings) is None  # its readiness says why


def test_runs_on_a_server_run_elsewhere_are_scaled_to_its_context(tmp_path: Path, run_inner) -> None:
    """Case D on the CPU profile's scale (1/16: 2048 + 64 + 16 + 256 = 2384 tokens) against an external server
    of 1500: scaled by 1/2 before the first measurement, measured, and its cached tokens predicted from the
    lengths it sent."""
    from tests.test_faults import fake_args, only_d

    suite = only_d(tmp_path)
    on, url = _fake(suite, 1500)
    try:
        started = time.monotonic()
        args = [arg for arg in fake_args() if not arg.startswith("--apc-length-scale")]
        inner = run_inner(*args, f"--apc-url-on={url}")
        assert time.monotonic() - started < 120
        assert inner.ret == 0, inner.output
        line = (
            f"lengths scaled by 1/2 to fit a 1,500-token context (max_model_len 1500 in /v1/models of {url}): "
            "length scale 0.03125 in place of 0.0625 (set --apc-length-scale to choose one)"
        )
        assert f"FITTED TO THE CONTEXT: {line}" in inner.output
        assert f"\n{line}\n" in inner.output  # above the table
        (results,) = suite.glob("apc-results/*/results.json")
        doc = json.loads(results.read_text())
        assert doc["fit"]["summary"] == line
        assert doc["settings"]["length_scale"] == 0.03125
        (run,) = doc["runs"]
        assert (run["prefix_len"], run["suffix_len"], run["output_len"]) == (1024, 32, 8)
        header, block = run["header_tokens"], run["block_size"]
        assert run["prediction"]["expected_hits"] == (4 - 1) * ((header + 1024) // block) * block
    finally:
        on.kill()


def test_under_xdist_the_controller_reports_the_fit_its_workers_decided(tmp_path: Path, run_inner) -> None:
    """The workers collect and fit (--apc-max-model-len 2048 against D's 2384 tokens: 1/2); the controller, which
    collects nothing, reads the fit from the store: its table and results.json say it."""
    from tests.test_faults import fake_args, only_d

    suite = only_d(tmp_path)
    args = [arg for arg in fake_args() if not arg.startswith("--apc-length-scale")]
    inner = run_inner(*args, "--apc-max-model-len=2048", "-n", "2")
    assert inner.ret == 0, inner.output
    line = (
        "lengths scaled by 1/2 to fit a 2,048-token context (option --apc-max-model-len): length scale 0.03125 in "
        "place of 0.0625 (set --apc-length-scale to choose one)"
    )
    assert f"\n{line}\n" in inner.output.split("apc validation", 1)[1]
    (results,) = suite.glob("apc-results/*/results.json")
    doc = json.loads(results.read_text())
    assert (doc["fit"]["summary"], doc["settings"]["length_scale"]) == (line, 0.03125)
    assert [(run["id"], run["prefix_len"]) for run in doc["runs"]] == [("D-c8", 1024)]


def test_a_baseline_whose_lengths_were_fitted_is_held_to_the_scale_it_was_asked_for(pytester, tmp_path) -> None:
    """Before collection this run's fit is not known: a baseline fitted from 1/16 to 1/32 compares as 1/16 then,
    and the gate compares the scales measured (settings.length_scale) at the end."""
    from pytest_apc.gate.baseline import Baseline, Refused
    from pytest_apc.workload.models import tiny_model_name
    from tests.test_gate import SAME, _doc

    old = _doc(pytester, SAME)
    old["model"] = tiny_model_name()
    old["settings"]["length_scale"] = 0.03125
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(old))
    settings = replace(default_settings("cpu"), baseline=str(path), baseline_repeats=1, sources={"baseline": "x"})
    with pytest.raises(Refused, match=r"length_scale 0.0625 here vs 0.03125 there"):
        Baseline.at_configure(settings)
    fitted = fit.Fitted(2048, "x", fit.SCALED, 0.0625, 0.03125)
    path.write_text(json.dumps({**old, "fit": fitted.as_dict()}))
    assert Baseline.at_configure(settings).path == str(path)


def test_runs_on_a_server_run_elsewhere_that_do_not_fit_the_scale_given_skip(tmp_path: Path, run_inner) -> None:
    """--apc-length-scale 0.0625 given, an external APC-on server of 3000 tokens: D (2384) is measured, F
    (4320) skips naming the scale at which it fits, and the table says so."""
    from tests.test_faults import fake_args

    (tmp_path / "test_df.py").write_text(
        "import pytest\n\n@pytest.mark.apc_cases('FD')\ndef test_one(apc_run):\n    assert apc_run.repeats\n"
    )
    on, url = _fake(tmp_path, 3000)
    try:
        args = [arg for arg in fake_args() if not arg.startswith("--apc-length-scale")]
        inner = run_inner(*args, f"--apc-url-on={url}", "--apc-length-scale=0.0625", "-rs")
        assert inner.ret == 0, inner.output
        assert "1 passed, 1 skipped" in inner.output
        assert (
            "run F-c8 needs 4,320 tokens (prompt 4048 + output 16 + 256 for the chat template), more than the "
            f"3,000-token context (max_model_len 3000 in /v1/models of {url}) at --apc-length-scale 0.0625 (option "
            "--apc-length-scale); to measure it: run with --apc-length-scale 0.042"
        ) in inner.output
        table = inner.output.split("apc validation", 1)[1]
        line = f"runs F-c8 skipped: longer than a 3,000-token context (max_model_len 3000 in /v1/models of {url})"
        assert f"\n{line}" in table
        (results,) = tmp_path.glob("apc-results/*/results.json")
        doc = json.loads(results.read_text())
        assert [run["id"] for run in doc["runs"]] == ["D-c8"]
        assert list(doc["fit"]["skipped"]) == ["F-c8"]
    finally:
        on.kill()
