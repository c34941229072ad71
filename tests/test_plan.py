"""The plan, decided from the settings alone (no pytest involved): how a test marked apc_cases is
parametrized, which given settings no selected test uses, and which settings the workload refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pytest_apc import config as apc_config
from pytest_apc.config import SPEC_BY_NAME, SPECS
from pytest_apc.workload import plan
from pytest_apc.workload.cases import FAMILIES, FAMILY_LENGTHS, FAMILY_MARKERS, RunKey, workload_for
from pytest_apc.workload.plan import FAMILY_ONLY, NO_CPU_OFFLOAD, RunParam, parametrization, unused_settings
from tests.conftest import default_settings as settings


def ids(params: list[RunParam]) -> list[str]:
    assert all(p.skip is None and p.test_id == p.run_id for p in params), params
    return [p.run_id for p in params]


def test_max_model_len_too_small_for_workload(pytester: pytest.Pytester) -> None:
    settings_ = apc_config.resolve(pytester.parseconfig("--cpu-node", "--apc-max-model-len=1000"), environ={})
    with pytest.raises(
        apc_config.SettingError,
        match=r"^Invalid apc_max_model_len 1000 from option --apc-max-model-len: the longest workload needs 4064 ",
    ):
        plan.check_settings(settings_)
    plan.check_settings(replace(settings_, max_model_len=4064))  # the longest request fits: no error


def test_an_unknown_model_shape_is_refused(pytester: pytest.Pytester) -> None:
    settings_ = apc_config.resolve(pytester.parseconfig(), environ={"PYTEST_APC_MODEL_SHAPE": "llama-9b"})
    with pytest.raises(
        apc_config.SettingError,
        match=r"^Invalid apc_model_shape 'llama-9b' from environment variable PYTEST_APC_MODEL_SHAPE: must be one "
        r"of llama-3.1-8b, llama-3.1-70b$",
    ):
        plan.check_settings(settings_)
    plan.check_settings(replace(settings_, model_shape="llama-3.1-70b"))


def test_the_plugin_stops_on_a_setting_the_workload_refuses(pytester: pytest.Pytester) -> None:
    """config.resolve knows nothing of the workload: the plugin checks these right after it, as usage errors."""
    result = pytester.runpytest("--cpu-node", "--apc-max-model-len=1000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: Invalid apc_max_model_len 1000 from option --apc-max-model-len: *"])
    result = pytester.runpytest("--gpu-node", "--apc-model-shape=llama-9b")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: Invalid apc_model_shape 'llama-9b' from option --apc-model-shape: *"])


def test_cases_at_the_default_concurrency() -> None:
    assert ids(parametrization("CD", {}, settings())) == ["C-c8", "D-c8"]
    assert ids(parametrization("D", {}, settings(concurrency=4))) == ["D-c4"]


def test_a_sweep_covers_only_the_swept_cases() -> None:
    swept = settings(sweep_concurrency=(1, 8), sweep_cases="CD")
    assert ids(parametrization("DF", {"sweep": True}, swept)) == ["D-c1", "D-c8"]
    assert parametrization("EF", {"sweep": True}, swept) == [
        RunParam("E-c1", "not-swept", "cases EF are not in --apc-sweep-cases CD")
    ]


def test_hash_algorithms_are_compared_only_when_given() -> None:
    given = settings(hash_algos=("xxhash", "sha256"))
    assert ids(parametrization("D", {"hash_algos": True}, given)) == ["D-c8-xxhash", "D-c8-sha256"]
    assert parametrization("D", {"hash_algos": True}, settings()) == [
        RunParam("D-c8", "no-hash-algos", "no --apc-hash-algos given: nothing to compare with the default")
    ]


def test_the_fleet_case_runs_once_per_route() -> None:
    assert ids(parametrization("R", {"fleet": True}, settings())) == ["R-c8-round_robin", "R-c8-consistent_hash"]
    assert ids(parametrization("R", {"fleet": True}, settings(router_policies=(), data_parallel_size=2))) == ["R-c8-dp"]
    reason = "no route to measure: --apc-router-policies is empty and --apc-data-parallel-size is 0"
    assert parametrization("R", {"fleet": True}, settings(router_policies=())) == [
        RunParam("R-c8-none", "no-routes", reason)
    ]


def test_the_offload_cases_run_on_a_gpu_node_at_their_own_levels() -> None:
    assert ids(parametrization("NO", {}, settings(offload_concurrency=(1, 4)))) == ["N-c1", "N-c4", "O-c1", "O-c4"]
    assert ids(parametrization("NO", {"sequential": True}, settings())) == ["N-c1", "O-c1"]
    assert parametrization("NO", {"sequential": True}, settings(offload_concurrency=(2, 8))) == [
        RunParam("N-c2", "no-c1", "concurrency 1 is not in --apc-offload-concurrency 2,8")
    ]
    assert parametrization("O", {}, settings("cpu")) == [RunParam("O-c8", "cpu-node", NO_CPU_OFFLOAD)]


@pytest.mark.parametrize(
    ("cases", "options", "message"),
    [
        ("G", {}, "unknown case G; cases are A, B, C, D, E, F, R, N, O, L, M, e.g. @pytest.mark.apc_cases('CD')"),
        ("", {}, "unknown case (none); cases are A, B, C, D, E, F, R, N, O, L, M"),
        ("D", {"sweeps": True}, "unknown option sweeps; the options are sweep, hash_algos, sequential, fleet"),
    ],
)
def test_an_unknown_case_or_option_is_refused(cases: str, options: dict[str, bool], message: str) -> None:
    """Every case the matrix has is named (R, N and O too), and a misspelt option is not ignored."""
    with pytest.raises(ValueError) as raised:
        parametrization(cases, options, settings())
    assert str(raised.value).startswith(message)


def test_a_length_setting_changes_the_workloads_of_the_families_said_to_read_it() -> None:
    """FAMILY_LENGTHS is what workload_for reads, so the unused-length warnings derived from it are right."""
    base = settings()
    for name in ("prefix_len", "suffix_len", "rag_prefix_len", "input_len"):
        changed = replace(base, **{name: getattr(base, name) // 2})
        moved = {family for family in FAMILIES if workload_for(family, changed) != workload_for(family, base)}
        assert moved == {family for family, lengths in FAMILY_LENGTHS.items() if name in lengths}, name


def test_every_family_only_setting_says_so_in_its_help() -> None:
    """A setting declared with family= is one whose help starts with that family's tests, and back."""
    assert set(FAMILY_LENGTHS) == set(FAMILIES)
    for spec in SPECS:
        assert spec.family in ("", *FAMILY_ONLY), spec.name
        for family in FAMILY_ONLY:
            assert spec.help.startswith(f"{family.capitalize()} tests") == (spec.family == family), spec.name


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("prefix_len", 4096, "no selected test runs C/D, R, N or O, the cases with this length"),
        ("suffix_len", 64, "no selected test runs C/D, R, N or O, the cases with this length"),
        ("rag_prefix_len", 4000, "no selected test runs E/F, the only cases with this length"),
        ("input_len", 4096, "no selected test runs A/B or E/F, the cases with this length"),
        ("offload_groups", 3, "no selected test measures the offload tier (cases N/O, -m offload)"),
        ("replicas", 3, "no selected test measures a fleet (case R, -m fleet)"),
    ],
)
def test_a_family_setting_no_selected_case_reads_is_named(name: str, value: int, message: str) -> None:
    """Word for word: which cases would read it, derived from the one declaration of who reads what."""
    given = replace(settings(), **{name: value}, sources={name: f"option {SPEC_BY_NAME[name].option}"})
    planned = [plan.TestUse((RunKey("B", 8),))] if name != "input_len" else [plan.TestUse((RunKey("D", 8),))]
    head = f"{SPEC_BY_NAME[name].option} {value} (option {SPEC_BY_NAME[name].option})"
    assert unused_settings(given, planned, [], [], "the selection", FAMILY_MARKERS) == [
        f"{head}: {message} (no collected test would)"
    ]
