"""The plugin seen from pytest: options, markers, skipping without a profile, usage errors."""

from __future__ import annotations

import pytest

from pytest_apc import config as apc_config

SUITE = """
import pytest

pytestmark = pytest.mark.apc

@pytest.mark.apc_cases("CD")
def test_measured(apc_run):
    assert apc_run.repeats

def test_plain():
    pass
"""


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    assert "--gpu-node" in text
    assert "--cpu-node" in text
    for spec in apc_config.SPECS:
        assert spec.option in text, spec.option
        assert spec.ini in text, spec.ini


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.apc:*",
            "@pytest.mark.overhead:*",
            "@pytest.mark.pure:*",
            "@pytest.mark.rag:*",
            "@pytest.mark.sweep:*",
            "@pytest.mark.apc_cases*",
        ]
    )


def test_without_profile_apc_tests_skip_naming_both_flags(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*--gpu-node*--cpu-node*"])


def test_a_pipeline_can_require_a_profile(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release gate that lost --gpu-node must go red: with apc_without_profile=fail it is a usage error
    when APC tests are selected, and nothing changes for a run that selects none."""
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    monkeypatch.setenv("PYTEST_APC_WITHOUT_PROFILE", "fail")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*2 APC tests are selected but no profile was given, and apc_without_profile=fail (environment "
         "variable PYTEST_APC_WITHOUT_PROFILE)*--gpu-node*"]
    )  # fmt: skip
    assert pytester.runpytest("-k", "plain").ret == pytest.ExitCode.OK


def test_ids_read_like_the_matrix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--collect-only", "-q", "--apc-concurrency=4")
    result.stdout.fnmatch_lines(["*test_measured[[]C-c4[]]", "*test_measured[[]D-c4[]]"])


def test_apc_marker_is_added_to_tests_using_apc_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    result = pytester.runpytest("-m", "apc", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*2/3 tests collected (1 deselected)*"])


def test_invalid_setting_is_a_one_line_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--apc-num-prompts=-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*Invalid apc_num_prompts '-3' from option --apc-num-prompts*"])


def test_header_names_profile(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--cpu-node")
    result.stdout.fnmatch_lines(["apc: profile=cpu model=generated tiny model prompts=30 concurrency=8*"])


def test_header_names_the_model_shape(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--gpu-node", "--apc-model-shape=llama-3.1-8b")
    result.stdout.fnmatch_lines(["apc: profile=gpu model=generated llama-3.1-8b-shaped model (random weights) *"])


def test_collect_only_writes_no_results(pytester: pytest.Pytester) -> None:
    """Listing the tests measures nothing, so it leaves no results folder and prints no results path."""
    pytester.makepyfile("def test_x(apc_run): pass")
    result = pytester.runpytest("--cpu-node", "--collect-only", f"--apc-results-dir={pytester.path}/res")
    assert result.ret == pytest.ExitCode.OK
    baseline = pytester.path / "baseline.json"
    baseline.write_text('{"pairs": []}')
    gated = pytester.runpytest("--cpu-node", "--collect-only", f"--apc-baseline={baseline}")
    assert gated.ret == pytest.ExitCode.OK  # nothing measured, nothing gated
    assert not (pytester.path / "res").exists()
    assert "results:" not in result.stdout.str()
