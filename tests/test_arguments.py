"""pytest reads ``--apc-x VALUE``'s path as a test path before the plugin is loaded: the console script joins
such values to their options, and a plain pytest run whose rootdir came from one stops with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_apc.__main__ import suite_command
from pytest_apc.arguments import joined, taken_for_test_paths


def test_joined_writes_every_apc_value_with_an_equals_sign_and_leaves_the_rest() -> None:
    args = ["-m", "apc", "--gpu-node", "--apc-model", "/models/x", "--apc-repeats=3", "-k", "D", "--apc-server-arg",
            "--enforce-eager", "--", "--apc-model", "/y"]  # fmt: skip
    assert joined(args) == [
        "-m", "apc", "--gpu-node", "--apc-model=/models/x", "--apc-repeats=3", "-k", "D", "--apc-server-arg",
        "--enforce-eager", "--", "--apc-model", "/y",
    ]  # fmt: skip


def test_the_console_script_hands_pytest_joined_values() -> None:
    command = suite_command(["-m", "apc", "--gpu-node", "--apc-model", "/models/x"])
    assert command[-6:] == ["--pyargs", "tests_apc", "-m", "apc", "--gpu-node", "--apc-model=/models/x"]


def test_values_taken_for_test_paths_are_the_existing_paths(tmp_path: Path) -> None:
    (tmp_path / "here" / "model").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    args = ["--apc-model", "../model", "--apc-tokenizer", "missing", "--apc-baseline=../model", "--apc-x", "model"]
    assert taken_for_test_paths(args, tmp_path / "here") == ["--apc-model ../model"]


def test_a_rootdir_taken_from_an_option_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\napc_repeats = 2\n")
    model = pytester.path.parent / f"{pytester.path.name}-model"
    model.mkdir()
    ran = pytester.runpytest_subprocess("--cpu-node", "--apc-model", str(model), "--co")
    assert ran.ret == pytest.ExitCode.USAGE_ERROR
    line = f"write --apc-model={model}"
    assert any(line in text for text in ran.errlines), ran.errlines
    # Joined, pytest keeps the project's rootdir (and reads its ini).
    ran = pytester.runpytest_subprocess("--cpu-node", f"--apc-model={model}", "--co")
    assert ran.ret == pytest.ExitCode.NO_TESTS_COLLECTED, ran.outlines + ran.errlines


def test_the_plugin_loads_without_xdist(pytester: pytest.Pytester) -> None:
    """pytest-xdist is optional: its hooks are the plugin's optional hooks, so pytest without xdist loads it
    (with pytest_configure_node a required hook, it stops with an internal error)."""
    pytester.makepyfile("def test_nothing():\n    pass\n")
    ran = pytester.runpytest_subprocess("-p", "no:xdist")
    assert ran.ret == pytest.ExitCode.OK, ran.outlines + ran.errlines
