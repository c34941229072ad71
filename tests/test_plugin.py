"""The plugin seen from pytest: options, markers, skipping without a profile, usage errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_apc import config as apc_config
from pytest_apc.workload.models import TINY_MODEL_VERSION, shape_model_name, tiny_model_name

CPU_RUN = Path(__file__).resolve().parent.parent / "docs" / "results" / "cpu-gate" / "run-1" / "results.json"


def cpu_baseline(folder: Path, name: str = "baseline.json", **settings: Any) -> Path:
    """A baseline of C-c8 and D-c8 (5 cold repeats each) that a ``--cpu-node`` run with the default settings,
    changed by ``settings``, can be gated on: a committed CPU run with this checkout's tiny model."""
    doc = json.loads(CPU_RUN.read_text())
    doc["model"] = f"/cache/pytest-apc/models/{tiny_model_name()}"
    doc["settings"].update(settings)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


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
    """--help lists every option and its ini key, and --apc-set; ``pytest-apc settings`` every other setting."""
    from pytest_apc.report.reference import settings_text

    result = pytester.runpytest("--help")
    text = result.stdout.str()
    assert "--gpu-node" in text
    assert "--cpu-node" in text
    assert "--apc-set" in text
    assert "apc_set" in text
    listed = settings_text()
    for spec in apc_config.SPECS:
        if spec.advanced:
            assert f"--apc-set {spec.name}=" in listed, spec.name
            continue
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


def test_the_apc_cases_help_names_every_option_and_case(pytester: pytest.Pytester) -> None:
    """``pytest --markers`` documents the marker: each of its options (fleet= too) and every case."""
    from pytest_apc.workload.plan import APC_CASES_OPTIONS

    lines = pytester.runpytest("--markers").stdout.lines
    help_line = next(line for line in lines if line.startswith("@pytest.mark.apc_cases("))
    for name in APC_CASES_OPTIONS:
        assert f"{name}=False" in help_line, name
    assert "A, B, C, D, E, F, R, N, O" in help_line


def test_without_profile_apc_tests_skip_naming_both_flags(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*--gpu-node*--cpu-node*"])
    result.stdout.fnmatch_lines(["apc: 2 APC tests skipped: no profile (--gpu-node / --cpu-node)"])


def test_an_unrelated_run_hears_nothing_of_the_plugin(pytester: pytest.Pytester) -> None:
    """The plugin loads in every pytest run of its environment (an entry point): a run that selects no APC
    test and sets nothing of pytest-apc sees no line of it, in the header, the summary or the warnings."""
    pytester.makepyfile(test_unrelated="import warnings\n\ndef test_x():\n    warnings.warn('w')\n\n"
                        "def test_y():\n    assert False\n")  # fmt: skip
    for args in ([], ["-ra", "-v"]):
        result = pytester.runpytest(*args)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        printed = [line for line in [*result.outlines, *result.errlines] if not line.startswith("plugins: ")]
        assert not [line for line in printed if "apc" in line.lower()], printed
    # Setting anything of pytest-apc without a profile still says why its tests would skip.
    given = pytester.runpytest("--apc-set=num_prompts=5")
    given.stdout.fnmatch_lines(["apc: no profile (--gpu-node / --cpu-node): APC tests will be skipped"])


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


def test_a_profile_in_a_folder_without_the_suite_names_the_command_that_runs_it(pytester: pytest.Pytester) -> None:
    """``pytest -m apc --cpu-node`` from a folder without tests_apc (a wheel installed, no checkout) once
    collected nothing, printed an empty table, wrote an empty results file and exited 5 without a hint."""
    hint = ("apc: no test of the APC suite was collected here: nothing measured, no results written; run the "
            "installed suite with: pytest-apc {args}  (= pytest --pyargs tests_apc {args})")  # fmt: skip
    result = pytester.runpytest("-m", "apc", "--cpu-node")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    # pytester adds its --basetemp to the arguments, which the line repeats as given
    result.stdout.fnmatch_lines([hint.format(args="-m apc --cpu-node --basetemp=*")])
    assert "apc validation" not in result.stdout.str()
    assert not (pytester.path / "apc-results").exists()
    # Other tests run as ever, with the same line; a path given names the generic command.
    pytester.makepyfile(test_other="def test_x():\n    pass\n")
    result = pytester.runpytest("test_other.py", "--gpu-node", "--apc-model-shape=llama-3.1-8b")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([hint.format(args="-m apc --gpu-node")])
    # Under xdist the workers collect: the controller says the same, and writes nothing either.
    result = pytester.runpytest_subprocess("-n", "2", "--cpu-node")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([hint.format(args="--basetemp=* -n 2 --cpu-node")])
    assert not (pytester.path / "apc-results").exists()


def test_a_profile_whose_apc_tests_are_all_deselected_writes_no_results(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    result = pytester.runpytest("-m", "not apc", "--cpu-node")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["apc: no APC test selected (2 deselected): nothing measured, no results written"])
    assert not (pytester.path / "apc-results").exists()


def test_ids_read_like_the_matrix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--collect-only", "-q", "--apc-set=concurrency=4")
    result.stdout.fnmatch_lines(["*test_measured[[]C-c4[]]", "*test_measured[[]D-c4[]]"])


def test_apc_marker_is_added_to_tests_using_apc_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE.replace("pytestmark = pytest.mark.apc", ""))
    result = pytester.runpytest("-m", "apc", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*2/3 tests collected (1 deselected)*"])


def test_invalid_setting_is_a_one_line_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    result = pytester.runpytest("--apc-set=num_prompts=-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*Invalid apc_num_prompts '-3' from option --apc-set*"])


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
    gated = pytester.runpytest("--cpu-node", "--collect-only", f"--apc-baseline={cpu_baseline(pytester.path)}")
    assert gated.ret == pytest.ExitCode.OK  # nothing measured, nothing gated
    assert not (pytester.path / "res").exists()
    assert "results:" not in result.stdout.str()


@pytest.fixture
def apc_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """The shipped suite (tests_apc) in pytester's folder: collected and planned, never measured here."""
    from tests.conftest import TESTS_APC

    pytester.makepyfile(**{path.stem: path.read_text() for path in TESTS_APC.glob("test_*.py")})
    return pytester


def _session_warnings(reprec: Any) -> list[str]:
    from pytest_apc.plugin import SESSION_KEY

    return reprec.getcall("pytest_collection_finish").session.config.stash[SESSION_KEY].measured.warnings


def test_an_option_whose_tests_are_deselected_says_so(apc_suite: pytest.Pytester) -> None:
    result = apc_suite.runpytest("--collect-only", "-q", "-m", "pure", "--cpu-node", "--apc-hash-algos=sha256_cbor")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["*ApcUnusedOptionWarning: --apc-hash-algos sha256_cbor (option --apc-hash-algos): no selected test compares "
         "hash algorithms (they are marked hash_algo; -m 'pure' deselected them)"]
    )  # fmt: skip
    assert result.stdout.str().count("ApcUnusedOptionWarning: ") == 1


def test_unused_settings_are_session_warnings_whatever_set_them(
    apc_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sweep settings from the environment with the sweep deselected, and levels no planned pair reaches:
    each named with where it came from."""
    monkeypatch.setenv("PYTEST_APC_SET", "sweep_cases=CD")
    reprec = apc_suite.inline_run(
        "--collect-only", "-m", "not sweep", "-k", "test_cached_tokens", "--cpu-node",
        "--apc-set=sweep_concurrency=1,4", "--apc-set=low_concurrency=2", "--apc-set=pure_gain_concurrency=4",
    )  # fmt: skip
    assert _session_warnings(reprec) == [
        "--apc-set sweep_concurrency=1,4 (option --apc-set): no selected test runs the concurrency sweep "
        "(they are marked sweep; -m 'not sweep' -k 'test_cached_tokens' deselected them)",
        "--apc-set sweep_cases=CD (environment variable PYTEST_APC_SET): no selected test runs the concurrency "
        "sweep (they are marked sweep; -m 'not sweep' -k 'test_cached_tokens' deselected them)",
        "--apc-set low_concurrency=2 (option --apc-set): no selected test judges the E/F pair at "
        "concurrency 2 or below (E/F planned at concurrency 8; they are marked sweep; -m 'not sweep' "
        "-k 'test_cached_tokens' deselected them)",
        "--apc-set pure_gain_concurrency=4 (option --apc-set): no selected test judges the C/D pair at "
        "concurrency 4 or below (C/D planned at concurrency 8; they are marked sweep; -m 'not sweep' "
        "-k 'test_cached_tokens' deselected them)",
    ]


def test_the_gates_settings_are_unused_without_a_baseline_or_a_run_to_gate(apc_suite: pytest.Pytester) -> None:
    """Fleet runs are not gated: with only them selected the baseline is unused; the gate's own settings
    without a baseline are unused whatever is selected."""
    b = cpu_baseline(apc_suite.path, "b.json")
    reprec = apc_suite.inline_run(
        "--collect-only", "-m", "fleet", "--cpu-node", f"--apc-baseline={b}", "--apc-set=baseline_false_alarm=0.05"
    )
    assert _session_warnings(reprec) == [
        f"--apc-baseline {b} (option --apc-baseline): no selected test measures a single-server run, so the gate "
        "has no run to compare (32 tests would; -m 'fleet' deselected them)",
        "--apc-set baseline_false_alarm=0.05 (option --apc-set): no selected test measures a "
        "single-server run, so the gate has no run to compare (32 tests would; -m 'fleet' deselected them)",
    ]
    reprec = apc_suite.inline_run("--collect-only", "-m", "pure", "--cpu-node", "--apc-set=baseline_repeats=5")
    assert _session_warnings(reprec) == [
        "--apc-set baseline_repeats=5 (option --apc-set): no --apc-baseline is given, so the gate does not run"
    ]


def test_an_unused_replica_key_is_named_and_never_printed(
    apc_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_APC_SET", "replica_api_key=s3cret-replica-key")
    reprec = apc_suite.inline_run("--collect-only", "-m", "pure", "--cpu-node")
    assert _session_warnings(reprec) == [
        "--apc-set replica_api_key=*** (environment variable PYTEST_APC_SET): no selected test measures a "
        "fleet (case R, -m fleet) (they are marked fleet; -m 'pure' deselected them)"
    ]


def test_the_default_run_and_options_that_are_used_warn_of_nothing(apc_suite: pytest.Pytester) -> None:
    strict = ("-W", "error::pytest_apc.plugin.ApcUnusedOptionWarning")
    assert apc_suite.runpytest("--collect-only", "-q", "-m", "apc", "--cpu-node", *strict).ret == pytest.ExitCode.OK
    b = cpu_baseline(apc_suite.path, prefix_len=4096, suffix_len=64, input_len=4096, rag_prefix_len=4000)
    used = ["--apc-hash-algos=sha256_cbor", f"--apc-baseline={b}", "--apc-set=baseline_false_alarm=0.05",
            "--apc-set=low_concurrency=2", "--apc-set=pure_gain_concurrency=all", "--apc-set=sweep_cases=CDF",
            "--apc-set=sweep_concurrency=1,8", "--apc-set=prefix_len=4096", "--apc-set=suffix_len=64",
            "--apc-set=input_len=4096", "--apc-set=rag_prefix_len=4000", "--apc-url-on=http://on:8000",
            "--apc-url-off=http://off:8000"]  # fmt: skip
    result = apc_suite.runpytest("--collect-only", "-q", "-m", "apc", "--cpu-node", *used, *strict)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()


def test_an_unused_option_can_fail_a_pipeline(apc_suite: pytest.Pytester) -> None:
    """-W error::...ApcUnusedOptionWarning turns the warning into a usage error (exit code 4)."""
    result = apc_suite.runpytest("--collect-only", "-m", "pure", "--cpu-node", "--apc-url-on=http://on:8000",
                                 "--apc-url-off=http://off:8000", "-m", "hash_algo", "--apc-hash-algos=xxhash",
                                 "-W", "error::pytest_apc.plugin.ApcUnusedOptionWarning")  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--apc-url-off http://off:8000 (option --apc-url-off): no selected test measures on the APC-off server "
         "(*-m 'hash_algo' deselected them)"]
    )  # fmt: skip


def test_missing_vllm_bench_module_is_one_usage_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without vllm.benchmarks.serve the run stops at start-up with one line naming the installed vLLM."""
    import importlib.util

    pytester.makepyfile(SUITE)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    result = pytester.runpytest("--cpu-node")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*needs vLLM's benchmark module vllm.benchmarks.serve*installed: *tested with*"])
    assert pytester.runpytest("--cpu-node", "--apc-set=server_command=/opt/vllm-serve").ret != (
        pytest.ExitCode.USAGE_ERROR
    )


# Tests of the user's beside the shipped suite, marked with markers of the user's own.
USER_GATES = """
import pytest

@pytest.mark.my_release_gate
@pytest.mark.apc_cases("R", fleet=True)
def test_gate_fleet(apc_run):
    pass

@pytest.mark.my_pure_gate
@pytest.mark.apc_cases("D")
def test_gate_pure(apc_run):
    pass
"""
ELSEWHERE = ("--gpu-node", "--apc-model-shape=llama-3.1-8b", "--apc-url-on=http://127.0.0.1:9",
             "--apc-url-off=http://127.0.0.1:9")  # fmt: skip


@pytest.fixture
def node_held_by_another_run(apc_suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The shipped suite and USER_GATES, while another run holds this node's GPU lock."""
    from pytest_apc.serving import process as procs

    apc_suite.makepyfile(test_gates=USER_GATES)
    lock_dir = apc_suite.path / "lockdir"
    lock_dir.mkdir()
    monkeypatch.setenv("TMPDIR", str(lock_dir))  # the inner run's lock file lives in its temp folder
    holder = procs.acquire_node_lock(lock_dir / procs.NODE_LOCK.name)
    try:
        yield
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("args", "locked"),
    [
        # Both URLs: the six cases launch nothing, but without -m the fleet tests would launch replicas.
        ((), True),
        (("-m", "apc"), False),
        (("-m", "pure or overhead"), False),
        (("-m", "not fleet"), True),  # the offload cases launch their servers, URLs or not
        (("-m", "not fleet and not offload"), False),
        (("-m", "offload"), True),
        (("-m", "my_release_gate"), True),  # a marker of the user's on a fleet test
        (("-m", "my_pure_gate"), False),  # ... and on a pure one
        (("-m", "apc", "--apc-hash-algos=xxhash"), True),  # hash-algorithm servers never come from a URL
        (("-m", "pure", "--apc-hash-algos=xxhash"), False),  # ... but no hash-algorithm test is selected
        (("-m", "fleet"), True),
        (("-m", "fleet", "--apc-fleet-url=http://127.0.0.1:9", *(["--apc-metrics-url=http://127.0.0.1:9"] * 2)), False),
    ],
)
def test_the_gpu_node_lock_is_taken_whenever_the_run_may_launch_a_server(
    apc_suite: pytest.Pytester, node_held_by_another_run: None, args: tuple[str, ...], locked: bool
) -> None:
    """Another run holds this node's GPUs: a run whose selected tests may start a server on them is
    refused at once, naming the holder and a run it would start; one that only talks to servers elsewhere
    goes ahead."""
    result = apc_suite.runpytest_subprocess(*ELSEWHERE, "--collect-only", *args)
    refused = "another pytest-apc run holds this node's GPUs (pid " in result.stderr.str()
    assert refused == locked, result.stderr.str()[-2000:]
    assert (result.ret == pytest.ExitCode.USAGE_ERROR) == locked
    if locked:
        result.stderr.fnmatch_lines(["*This run needs them: run * starts the * server on this node*"])


def test_under_xdist_the_node_lock_refuses_before_any_test_runs(
    apc_suite: pytest.Pytester, node_held_by_another_run: None
) -> None:
    """The workers collect, the controller holds the lock: it is taken (here: refused) before a test is
    scheduled. The commands are ones that would fail at once, should a server start after all."""
    result = apc_suite.runpytest_subprocess(
        *ELSEWHERE, "-n", "2", "-m", "fleet", "--apc-set=server_command=false", "--apc-set=router_command=false"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
    result.stderr.fnmatch_lines(["*another pytest-apc run holds this node's GPUs (pid *This run needs them: run *-c8*"])
    assert "passed" not in result.stdout.str()
    assert "failed" not in result.stdout.str()
    assert not (apc_suite.path / "apc-results").exists()  # no results of a run that did not happen


def test_an_unmarked_fleet_test_is_a_fleet_test_not_an_apc_one(pytester: pytest.Pytester) -> None:
    """A test of the user's on case R without a marker is marked fleet: -m apc (which launches no replicas
    and, with both --apc-url-*, takes no GPU lock) must not select it."""
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.apc_cases("R", fleet=True)
        def test_my_fleet(apc_run):
            pass

        @pytest.mark.apc_cases("D")
        def test_my_pure(apc_run):
            pass
        """
    )
    fleet = pytester.runpytest("--cpu-node", "-m", "fleet", "--collect-only", "-q")
    fleet.stdout.fnmatch_lines(["*test_my_fleet[R-c8-round_robin]*", "*2/3 tests collected (1 deselected)*"])
    apc = pytester.runpytest("--cpu-node", "-m", "apc", "--collect-only", "-q")
    apc.stdout.fnmatch_lines(["*test_my_pure[D-c8]*", "*1/3 tests collected (2 deselected)*"])
    assert "test_my_fleet" not in apc.stdout.str()


# The baseline is checked before anything runs: configure time for the file and the settings, right after
# collection for the selected runs (both under --collect-only too), and the rest once a server is up
# (test_faults.py).


@pytest.mark.parametrize("collect_only", [False, True], ids=["run", "collect-only"])
def test_a_baseline_that_cannot_be_read_stops_pytest_before_anything_runs(
    apc_suite: pytest.Pytester, collect_only: bool
) -> None:
    import time

    started = time.monotonic()
    co = ["--co"] if collect_only else []
    result = apc_suite.runpytest("-m", "apc", "--cpu-node", "--apc-baseline=/nonexistent.json",
                                 f"--apc-results-dir={apc_suite.path}/res", *co)  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        "ERROR: cannot read baseline /nonexistent.json: [Errno 2] No such file or directory: '/nonexistent.json'"
    )
    assert time.monotonic() - started < 30
    assert not (apc_suite.path / "res").exists()  # nothing measured, no results folder


def test_a_damaged_or_incomparable_baseline_is_a_usage_error_naming_it(apc_suite: pytest.Pytester) -> None:
    damaged = json.loads(cpu_baseline(apc_suite.path).read_text())
    damaged["runs"][0]["repeat_counters"] = "5"
    path = apc_suite.path / "damaged.json"
    path.write_text(json.dumps(damaged))
    h200 = CPU_RUN.parent.parent.parent / "h200" / "results.json"
    null_noise = cpu_baseline(apc_suite.path, "null-noise.json")
    calibrated = json.loads(null_noise.read_text())
    calibrated["calibration"] = {"statistic": "mean_ttft_ms", "files": ["a"], "between": None, "between_df": 0,
                                 "rows": {}}  # fmt: skip
    null_noise.write_text(json.dumps(calibrated))
    old_model = cpu_baseline(apc_suite.path, "old-model.json")
    doc = json.loads(old_model.read_text())
    old_model.write_text(json.dumps({**doc, "model": "/m/tiny-llama-v1-0123456789ab"}))
    for baseline, message in [
        (path, f"baseline {path} is not a valid results file of schema_version 9: runs[0].repeat_counters is a "
               'string ("5"), not an array'),
        (h200, f"not comparable with baseline {h200}: profile cpu here vs gpu there; model {tiny_model_name()} vs "
               "llama-3.1-8b-shape-v1-e18e6ae6be32; model_shape - vs llama-3.1-8b; length_scale 0.0625 vs 1.0"),
        (old_model, f"not comparable with baseline {old_model}: model {tiny_model_name()} here vs "
                    f"tiny-llama-v1-0123456789ab there (generated tiny-llama model v{TINY_MODEL_VERSION} vs v1)"),
        (null_noise, f"baseline {null_noise} holds a calibration the gate cannot use: it measured no run (calibrate "
                     f"it again: python -m pytest_apc calibrate RESULTS... --write {null_noise})"),
        (cpu_baseline(apc_suite.path, "scaled.json", length_scale=0.125),
         f"not comparable with baseline {apc_suite.path / 'scaled.json'}: length_scale 0.0625 here vs 0.125 there"),
    ]:  # fmt: skip
        result = apc_suite.runpytest("--co", "-m", "pure", "--cpu-node", f"--apc-baseline={baseline}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert result.stderr.lines[0] == f"ERROR: {message}"
    # A shape model's name is known before it is generated: the H200 run's is of an older version.
    result = apc_suite.runpytest("--co", "-m", "pure", "--gpu-node", "--apc-model-shape=llama-3.1-8b",
                                 f"--apc-baseline={h200}")  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        f"ERROR: not comparable with baseline {h200}: model {shape_model_name('llama-3.1-8b')} here vs "
        "llama-3.1-8b-shape-v1-e18e6ae6be32 there (generated llama-3.1-8b-shape model v2 vs v1)"
    )


@pytest.mark.parametrize("collect_only", [False, True], ids=["run", "collect-only"])
def test_a_baseline_without_enough_repeats_of_the_selected_runs_stops_pytest_after_collection(
    apc_suite: pytest.Pytester, collect_only: bool
) -> None:
    b = cpu_baseline(apc_suite.path)
    co = ["--co"] if collect_only else []
    result = apc_suite.runpytest("-m", "pure", "--cpu-node", f"--apc-baseline={b}", "--apc-set=baseline_repeats=6", *co)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        f"ERROR: baseline {b} has 5 cold repeats of C-c8, D-c8; the gate needs 6 or more (measure the baseline with "
        "--apc-repeats 6)"
    )
    result = apc_suite.runpytest("-m", "pure", "--cpu-node", f"--apc-baseline={b}", "--apc-set=concurrency=4", *co)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0] == (
        f"ERROR: no run of this run is in baseline {b}: this run has C-c4, D-c4; the baseline has C-c8, D-c8"
    )
    assert apc_suite.runpytest("-m", "pure", "--cpu-node", f"--apc-baseline={b}", "--co").ret == pytest.ExitCode.OK


def test_under_xdist_a_baseline_without_enough_repeats_fails_every_run_before_a_server_starts(
    apc_suite: pytest.Pytester,
) -> None:
    """An xdist worker cannot stop the session at collection: each selected run fails with the refusal,
    and no server is started."""
    b = cpu_baseline(apc_suite.path)
    result = apc_suite.runpytest_subprocess("-n", "2", "-m", "pure", "--cpu-node", f"--apc-baseline={b}",
                                            "--apc-set=baseline_repeats=6", "--apc-results-dir=res")  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # as without xdist: the baseline, not the build, failed
    refusal = f"baseline {b} has 5 cold repeats of C-c8, D-c8; the gate needs 6 or more"
    result.stdout.fnmatch_lines([f"NOT MEASURED C-c8: run C-c8 was not measured: {refusal}*",
                                 f"NOT MEASURED D-c8: run D-c8 was not measured: {refusal}*"])  # fmt: skip
    assert result.parseoutcomes()["errors"] == 4
    (written,) = apc_suite.path.glob("res/*/results.json")
    assert json.loads(written.read_text())["server_launches"] == {}


def test_verdicts_given_together_are_all_judged_and_each_failure_is_shown(pytester: pytest.Pytester) -> None:
    """``apc_assert(a, b)``: a pair that saved no prefill shows whether its TTFT gained too."""
    pytester.makepyfile(
        test_together=(
            "from pytest_apc.verdicts.verdict import Verdict\n\n"
            "def test_pair(apc_assert):\n"
            "    first = Verdict('prefill_saved', ['C-c1', 'D-c1'], False, 'computed every prompt token')\n"
            "    apc_assert(first, Verdict('ttft_gain', ['C-c1', 'D-c1'], False, 'gain 1.00x'),\n"
            "               Verdict('not_slower', ['C-c1', 'D-c1'], True, 'within the tolerance'))\n"
        )
    )
    result = pytester.runpytest("--cpu-node", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = result.stdout.str()
    assert "computed every prompt token" in text
    assert "gain 1.00x" in text
    assert "within the tolerance" not in text
