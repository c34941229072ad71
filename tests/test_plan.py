"""How a test marked apc_cases is parametrized, decided from the settings alone (no pytest involved)."""

from __future__ import annotations

import pytest

from pytest_apc.workload.plan import NO_CPU_OFFLOAD, RunParam, parametrization
from tests.conftest import default_settings as settings


def ids(params: list[RunParam]) -> list[str]:
    assert all(p.skip is None and p.test_id == p.run_id for p in params), params
    return [p.run_id for p in params]


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
        ("G", {}, "unknown case G; cases are A, B, C, D, E, F, R, N, O, e.g. @pytest.mark.apc_cases('CD')"),
        ("", {}, "unknown case (none); cases are A, B, C, D, E, F, R, N, O"),
        ("D", {"sweeps": True}, "unknown option sweeps; the options are sweep, hash_algos, sequential, fleet"),
    ],
)
def test_an_unknown_case_or_option_is_refused(cases: str, options: dict[str, bool], message: str) -> None:
    """Every case the matrix has is named (R, N and O too), and a misspelt option is not ignored."""
    with pytest.raises(ValueError) as raised:
        parametrization(cases, options, settings())
    assert str(raised.value).startswith(message)
