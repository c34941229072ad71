"""The plan, decided from the settings alone (no pytest involved): how a test marked apc_cases is
parametrized, which given settings no selected test uses, which settings the workload refuses, and whether
the selected runs fit the model's context (workload.fit)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_apc import config as apc_config
from pytest_apc.config import SPECS
from pytest_apc.workload import fit, plan
from pytest_apc.workload.cases import FAMILIES, FAMILY_LENGTHS, FAMILY_MARKERS, RunKey, ServerMode, workload_for
from pytest_apc.workload.plan import FAMILY_ONLY, NO_CPU_OFFLOAD, RunParam, parametrization, unused_settings
from tests.conftest import TESTS_APC
from tests.conftest import default_settings as settings


def ids(params: list[RunParam]) -> list[str]:
    assert all(p.skip is None and p.test_id == p.run_id for p in params), params
    return [p.run_id for p in params]


def test_an_unknown_model_shape_is_refused(pytester: pytest.Pytester) -> None:
    settings_ = apc_config.resolve(pytester.parseconfig(), environ={"PYTEST_APC_MODEL_SHAPE": "llama-9b"})
    with pytest.raises(
        apc_config.SettingError,
        match=r"^Invalid apc_model_shape 'llama-9b' from environment variable PYTEST_APC_MODEL_SHAPE: must be one "
        r"of llama-3.1-8b, llama-3.1-70b, tiny-32k$",
    ):
        plan.check_settings(settings_)
    plan.check_settings(replace(settings_, model_shape="llama-3.1-70b"))


def test_the_plugin_stops_on_a_setting_the_workload_refuses(pytester: pytest.Pytester) -> None:
    """config.resolve knows nothing of the workload: the plugin checks these right after it, as usage errors."""
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
        RunParam("E-c1", "not-swept", "cases EF are not in --apc-set sweep_cases=CD")
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
    reason = "no route to measure: --apc-set router_policies is empty and --apc-set data_parallel_size is 0"
    assert parametrization("R", {"fleet": True}, settings(router_policies=())) == [
        RunParam("R-c8-none", "no-routes", reason)
    ]


def test_the_offload_cases_run_on_a_gpu_node_at_their_own_levels() -> None:
    assert ids(parametrization("NO", {}, settings(offload_concurrency=(1, 4)))) == ["N-c1", "N-c4", "O-c1", "O-c4"]
    assert ids(parametrization("NO", {"sequential": True}, settings())) == ["N-c1", "O-c1"]
    assert parametrization("NO", {"sequential": True}, settings(offload_concurrency=(2, 8))) == [
        RunParam("N-c2", "no-c1", "concurrency 1 is not in --apc-set offload_concurrency=2,8")
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
    given = replace(settings(), **{name: value}, sources={name: "option --apc-set"})
    planned = [plan.TestUse((RunKey("B", 8),))] if name != "input_len" else [plan.TestUse((RunKey("D", 8),))]
    head = f"--apc-set {name}={value} (option --apc-set)"
    assert unused_settings(given, planned, [], [], "the selection", FAMILY_MARKERS) == [
        f"{head}: {message} (no collected test would)"
    ]


PURE = [RunKey("C", 8), RunKey("D", 8)]
MATRIX = [RunKey(case, 8) for case in "ABCDEF"]


def test_only_the_selected_runs_must_fit_the_context() -> None:
    """At full scale C/D need 34304 tokens and E/F 65280: a context of 40960 holds -m pure, not the matrix,
    and the message gives the largest scale at which the matrix fits."""
    full = settings()
    context = fit.Context(40960, "option --apc-max-model-len")
    assert fit.check(full, PURE, context) is None
    assert fit.check(full, MATRIX, context) == (
        "the selected runs do not fit the context of 40960 tokens (option --apc-max-model-len): cases E/F (run E-c8) "
        "need 65280 tokens (prompt 64768 + output 256 + 256 for the chat template). Fix: run with "
        "--apc-length-scale 0.625 (every length scaled; the expected hits follow) or leave them out (-m 'not rag')"
    )
    assert fit.check(replace(full, length_scale=0.625), MATRIX, context) is None
    assert fit.check(replace(full, length_scale=0.626), MATRIX, context) is not None  # 0.625 is the largest
    assert fit.check(full, MATRIX, None) is None  # a context not known before a server starts: checked there
    assert fit.check(full, [], context) is None


def test_every_case_too_long_is_named_and_the_sweep_how_to_leave_it_out() -> None:
    keys = [*MATRIX, RunKey("F", 1)]  # a sweep level beside the default concurrency
    message = fit.check(settings(), keys, fit.Context(32768, "max_position_embeddings 32768 in /m/config.json"))
    assert message == (
        "the selected runs do not fit the context of 32768 tokens (max_position_embeddings 32768 in /m/config.json): "
        "cases E/F (run E-c8) need 65280 tokens (prompt 64768 + output 256 + 256 for the chat template); "
        "cases C/D (run C-c8) need 34304 tokens (prompt 33792 + output 256 + 256 for the chat template); "
        "cases A/B (run A-c8) need 33280 tokens (prompt 32768 + output 256 + 256 for the chat template). "
        "Fix: run with --apc-length-scale 0.5 (every length scaled; the expected hits follow) or leave them out "
        "(-m 'not overhead and not pure and not rag') (the sweep: --apc-set sweep_cases without them)"
    )


def test_a_server_run_elsewhere_is_told_the_scale_at_which_its_runs_fit() -> None:
    """Its context is known once it is reached (/v1/models): the same scale, for the runs on it."""
    assert fit.shorten(settings(), [RunKey("F", 8)], 32768) == (
        "run with --apc-length-scale 0.5 (every length scaled; the expected hits follow)"
    )
    assert fit.shorten(settings(), [RunKey("F", 8)], 256) == (
        "shorten the workload (--apc-length-scale, --apc-set prefix_len, --apc-set input_len, --apc-set output_len)"
    )


def test_the_context_is_read_from_the_models_config(tmp_path: Path) -> None:
    def context(config: dict[str, Any]) -> fit.Context | None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        return fit.model_context(settings(model=str(tmp_path)))

    where = tmp_path / "config.json"
    assert context({"max_position_embeddings": 32768}) == fit.Context(
        32768, f"max_position_embeddings 32768 in {where}"
    )
    # The smallest of the length keys; a linear RoPE scaling multiplies it, llama3's already holds it.
    assert context({"max_position_embeddings": 8192, "seq_length": 4096}) == fit.Context(
        4096, f"seq_length 4096 in {where}"
    )
    assert context({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}) == (
        fit.Context(16384, f"max_position_embeddings 4096 x rope_scaling factor 4 in {where}")
    )
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert context(llama3) == fit.Context(131072, f"max_position_embeddings 131072 in {where}")
    assert context({"text_config": {"max_position_embeddings": 8192}}) == fit.Context(
        8192, f"max_position_embeddings 8192 in {where}"
    )
    assert context({"hidden_size": 64}) is None
    (tmp_path / "config.json").write_text("{not json")
    assert fit.model_context(settings(model=str(tmp_path))) is None  # the server says what is wrong with it
    assert fit.model_context(settings(model="org/a-hub-name")) is None
    given = settings(model=str(tmp_path), max_model_len=20000, sources={"max_model_len": "option --apc-max-model-len"})
    assert fit.model_context(given) == fit.Context(20000, "option --apc-max-model-len")
    assert fit.model_context(settings(model_shape="llama-3.1-8b")) == fit.Context(
        131072, "max_position_embeddings 131072 in the llama-3.1-8b shape"
    )
    assert fit.model_context(settings("cpu")) == fit.Context(
        65536, "max_position_embeddings 65536 in the generated tiny model"
    )


def test_a_launched_server_gets_room_for_the_longest_selected_request(tmp_path: Path) -> None:
    full = settings()
    assert fit.launch_len(full, PURE) == 33792 + 256 + 256
    assert fit.launch_len(full, MATRIX) == fit.launch_len(full) == 64768 + 256 + 256
    assert fit.launch_len(replace(full, max_model_len=40000), PURE) == 40000
    # Rounded up to a step of 256, but never past the model's context: C/D need 34042 + 256 = 34298.
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 34300}))
    short = replace(full, output_len=250, model=str(tmp_path))
    assert fit.check(short, PURE, fit.model_context(short)) is None
    assert fit.launch_len(short, PURE) == 34300
    assert fit.launch_len(replace(short, model=""), PURE) == 34304


def test_every_launched_server_of_a_session_gets_room_for_the_longest_planned_request(tmp_path: Path) -> None:
    """Each mode's server, whatever its own runs: a hash-algorithm server (D only) compares with the default
    one (B, D, F) only at the same --max-model-len."""
    from pytest_apc.serving.deployment import deployment_for
    from pytest_apc.serving.server import LaunchedServer
    from pytest_apc.workload.cases import workload_for
    from pytest_apc.workload.plan import PlannedRun

    def max_model_len(mode: ServerMode, keys: list[RunKey], planned: list[RunKey]) -> str:
        runs = [PlannedRun(key, workload_for(key.family, settings())) for key in keys]
        server = deployment_for(mode, settings(), "/m", tmp_path, lambda message: None, runs, planned)
        assert isinstance(server, LaunchedServer)
        command = server._command_for_port(8000)
        return command[command.index("--max-model-len") + 1]

    assert max_model_len(ServerMode(False), [RunKey("C", 8)], PURE) == "34304"
    assert max_model_len(ServerMode(True, "xxhash"), [RunKey("D", 8, "xxhash")], [*MATRIX]) == "65280"


@pytest.fixture
def apc_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """The shipped suite (tests_apc) in pytester's folder: collected and planned, never measured here."""
    pytester.makepyfile(**{path.stem: path.read_text() for path in TESTS_APC.glob("test_*.py")})
    return pytester


def test_the_context_is_checked_against_the_selected_tests_at_collection(apc_suite: pytest.Pytester) -> None:
    """At full scale, --apc-max-model-len 40960 holds -m pure. -m apc at the scale the user set (1): E/F
    (65280; the CPU profile sweeps C/D only) are skipped, each with the scale at which it fits, and the rest is
    planned; -m rag alone, of which nothing fits, is refused in one line with the scale that fits, and runs at
    that scale."""
    full = ("--collect-only", "--cpu-node", "--apc-max-model-len=40960", "--apc-length-scale=1")
    assert apc_suite.runpytest(*full, "-q", "-m", "pure").ret == pytest.ExitCode.OK
    result = apc_suite.runpytest(*full, "-m", "apc")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*FITTED TO THE CONTEXT: runs E-c8, F-c8 skipped: longer than a "
         "40,960-token context (option --apc-max-model-len) at --apc-length-scale 1; to measure them: run with "
         "--apc-length-scale 0.625 (every length scaled; the expected hits follow)"]
    )  # fmt: skip
    result = apc_suite.runpytest(*full, "-q", "-m", "rag")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: the selected runs do not fit the context of 40960 tokens (option --apc-max-model-len): cases E/F "
         "(run E-c8) need 65280 tokens (prompt 64768 + output 256 + 256 for the chat template). Fix: "
         "run with --apc-length-scale 0.625 (every length scaled; the expected hits follow) or leave them out "
         "(-m 'not rag')"]
    )  # fmt: skip
    assert apc_suite.runpytest(*full[:-1], "--apc-length-scale=0.625", "-m", "apc").ret == pytest.ExitCode.OK


def test_a_selection_too_long_for_the_context_is_scaled_when_no_scale_is_set(apc_suite: pytest.Pytester) -> None:
    """The CPU profile's own scale (1/16) against a 2,048-token context: -m pure fits at 1/2 of it, -m apc (E/F)
    at 1/4; said at collection, every test kept."""
    run = ("--collect-only", "--cpu-node", "--apc-max-model-len=2048")
    result = apc_suite.runpytest(*run, "-m", "pure and not sweep")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*FITTED TO THE CONTEXT: lengths scaled by 1/2 to fit a 2,048-token context (option --apc-max-model-len): "
         "length scale 0.03125 in place of 0.0625 (set --apc-length-scale to choose one)"]
    )  # fmt: skip
    result = apc_suite.runpytest(*run, "-m", "apc")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*FITTED TO THE CONTEXT: lengths scaled by 1/4 to fit a 2,048-token context *", "*32/53 tests*"]
    )


def test_a_models_config_gives_the_context_at_collection(apc_suite: pytest.Pytester) -> None:
    """A model folder whose config.json holds 32768 positions: C/D at full scale need 34304."""
    model = apc_suite.mkdir("model")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    run = ("--collect-only", "-q", "--cpu-node", f"--apc-model={model}", "-m", "pure")
    result = apc_suite.runpytest(*run, "--apc-length-scale=1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: the selected runs do not fit the context of 32768 tokens (max_position_embeddings 32768 in "
         f"{model / 'config.json'}): cases C/D (run C-c8) need 34304 tokens * Fix: run with --apc-length-scale 0.954 *"]
    )  # fmt: skip
    assert apc_suite.runpytest(*run, "--apc-length-scale=0.954").ret == pytest.ExitCode.OK
