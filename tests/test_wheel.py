"""The package as users install it (built and installed once per session, tests/installed.py): the sdist
holds what the plugin's own tests read (they run from it), the wheel holds the license and the console
script, and every command of README.md and docs/quickstart.md runs from an empty folder with the wheel
installed (the main job on real vLLM in tests/test_e2e_cpu.py, the others against the fake server)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FAKE_VLLM, vllm_servers
from tests.installed import REPO, run

pytestmark = pytest.mark.e2e


# Tests of the plugin run from the unpacked sdist: those that read the docs, the scripts, the CI entry point,
# tests/data and the fake server, beside the console script's own.
SDIST_TESTS = [
    "tests/test_cli.py", "tests/test_install.py", "tests/test_docs.py", "tests/test_layers.py",
    "tests/test_eviction.py", "tests/test_fleet_report.py",
    "tests/test_faults.py::test_crash_on_start_fails_fast_with_log_tail_and_command",
]  # fmt: skip


def _files(root: Path, *parts: str) -> set[str]:
    """Every file under ``root/part`` (or that file), relative to ``root``, without bytecode caches."""
    found: set[str] = set()
    for part in parts:
        path = root / part
        paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        found |= {str(p.relative_to(root)) for p in paths if "__pycache__" not in p.parts and p.suffix != ".pyc"}
    return found


def test_the_wheel_holds_every_subpackage_its_data_the_suite_and_the_license(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    for module in sorted(REPO.glob("pytest_apc/**/*.py")) + sorted(REPO.glob("tests_apc/*.py")):
        assert str(module.relative_to(REPO)) in names
    assert {"pytest_apc/results/results.schema.json", "pytest_apc/py.typed"} <= names
    assert not any(name.startswith("tests/") for name in names)  # the plugin's own tests stay out
    info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
    assert archive.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in archive.read(f"{info}/METADATA").decode()
    assert "pytest-apc = pytest_apc.__main__:console" in archive.read(f"{info}/entry_points.txt").decode()


def test_results_of_the_installed_wheel_name_the_commit_it_was_built_from(installed: Path, tmp_path: Path) -> None:
    """The sdist records the checkout's commit, the wheel built from it keeps it, and the installed package
    reports it from a folder that is no repository (a user's results name the build, not their project)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert head
    commit = run(installed / "python", "-c", "from pytest_apc.measure import provenance as p; print(p.git_commit())",
                 cwd=tmp_path)  # fmt: skip
    assert commit.stdout.strip() == head, commit.stdout + commit.stderr


def test_the_sdist_holds_what_the_plugins_own_tests_read(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    needed = _files(REPO, "tests", "docs", "scripts", "pytest_apc", "tests_apc", "conftest.py", ".ci/run", "LICENSE",
                    "CHANGELOG.md", "README.md", "pyproject.toml", "MANIFEST.in")  # fmt: skip
    assert {"tests/conftest.py", "tests/fake_vllm.py", "tests/data/fleet-store.json"} <= needed
    assert needed - names == set()


def test_the_sdists_tests_run_from_it(sdist: Path, installed: Path, tmp_path: Path) -> None:
    """Unpacked, with the installed wheel's environment: no file the tests read is missing from it."""
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    ran = run(installed / "python", "-m", "pytest", *SDIST_TESTS, "-q", "-p", "no:cacheprovider", cwd=unpacked)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-5000:]
    assert " passed" in ran.stdout


def test_the_installed_console_script_prints_the_version_and_runs_the_commands(installed: Path, tmp_path: Path) -> None:
    from pytest_apc import __version__

    version = run(installed / "pytest-apc", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"pytest-apc {__version__}\n")
    example = REPO / "docs" / "results" / "cpu" / "results.json"
    script = run(installed / "pytest-apc", "report", example, cwd=tmp_path)
    module = run(installed / "python", "-m", "pytest_apc", "report", example, cwd=tmp_path)
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    assert script.stdout == module.stdout
    assert "pair" in script.stdout
    license_text = "import importlib.metadata as m; print(m.distribution('pytest-apc').read_text('licenses/LICENSE'))"
    shipped = run(installed / "python", "-c", license_text, cwd=tmp_path)
    assert shipped.stdout == (REPO / "LICENSE").read_text() + "\n"


# Commands of the docs that need a checkout of this repository (its scripts, its source) or root rights: the
# docs say so beside them. Every other command runs from an empty folder with the installed wheel alone.
NEEDS_A_CHECKOUT = ("bash", "pip", "sudo")
MAIN_JOB = "pytest-apc -m apc --cpu-node"  # run on real vLLM by tests/test_e2e_cpu.py, from the wheel too
MODEL_PATHS = re.compile(r"(/models/|/path/to/)[\w.-]+")
# The fake server in place of vLLM, at lengths and counts that keep each command to seconds.
FAKE = {
    "num_prompts": "4", "startup_timeout": "20", "stop_timeout": "3",
    "sweep_concurrency": "8", "answers_probes": "1",
}  # fmt: skip


def _fake_settings(block_size: int) -> str:
    """PYTEST_APC_SET for the fake server, its blocks as vLLM's own for the profile (16 tokens on a GPU, 128
    on the CPU build)."""
    settings = FAKE | {"server_command": f"{{python}} {FAKE_VLLM} --block-size {block_size}"}
    return shlex.join(f"{name}={value}" for name, value in settings.items())


def documented_commands(page: Path) -> list[list[str]]:
    """The shell commands of ``page``'s code blocks (fenced, or indented by four spaces after a blank line),
    continuation lines joined and comments dropped, then those of its inline code that start with the console
    script, in order, each once; an ``export NAME=VALUE`` line stays a command of its own."""
    text = page.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    blocks += ["\n".join(line[4:] for line in b.splitlines()) for b in re.findall(r"\n\n((?:    .*\n)+)", text)]
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    # Inline commands with their arguments (not a bare ``pytest-apc report`` naming the command in prose).
    lines += [c for c in re.findall(r"`(pytest-apc [^`]+)`", text) if len(c.split()) > 2 and "ARGS" not in c]
    commands: list[list[str]] = []
    for line in lines:
        if line.split(maxsplit=1)[:1] not in (["pytest-apc"], ["pytest"], ["export"], *([w] for w in NEEDS_A_CHECKOUT)):
            continue  # output, a table, prose
        words = shlex.split(line, comments=True)
        if words not in commands:
            commands.append(words)
    return commands


def _fake_args(words: list[str], model: str) -> list[str]:
    """``words`` with every model path of the docs replaced by the generated tiny model's."""
    return [MODEL_PATHS.sub(model, w) for w in words]


def test_every_readme_and_quickstart_command_runs_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    """Each command of README.md and docs/quickstart.md, as a user types it into an empty folder with only the
    wheel installed: the suite is collected and every run it plans is measured (on the fake server, whose
    timings prove nothing, so a verdict may fail; real vLLM runs the main job in tests/test_e2e_cpu.py), its
    results land in that folder, and ``report`` re-reads them. The commands that need a checkout are named."""
    from pytest_apc.workload.models import ensure_tiny_model

    model = str(ensure_tiny_model())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env |= {"PATH": f"{installed}{os.pathsep}{env['PATH']}", "PYTEST_APC_LENGTH_SCALE": "0.01"}  # an option of its own
    commands = [c for page in (REPO / "README.md", REPO / "docs" / "quickstart.md") for c in documented_commands(page)]
    ran, checkout_only = [], []
    for number, words in enumerate(commands):
        line = shlex.join(words)
        if words[0] in NEEDS_A_CHECKOUT or (words[0] == "pytest" and "--pyargs" not in words) or line == MAIN_JOB:
            checkout_only.append(line)
            continue
        if words[0] == "export":
            name, value = words[1].split("=", 1)
            env[name] = _fake_args([value], model)[0]
            continue
        folder = tmp_path / f"command-{number}"
        folder.mkdir()
        if words[1:2] == ["report"]:
            earlier = sorted(tmp_path.glob("command-*/apc-results/*/results.json"))[-1]
            words = [w if "<timestamp>" not in w else str(earlier) for w in words]
        fake = env | {"PYTEST_APC_SET": _fake_settings(128 if "--cpu-node" in words else 16)}
        done = subprocess.run(_fake_args(words, model), cwd=folder, env=fake, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
        output = done.stdout + done.stderr
        ran.append(line)
        if words[1:2] in (["--version"], ["report"]):
            assert done.returncode == 0, (line, output[-3000:])
            continue
        last = output.strip().splitlines()[-1]
        # 0 or 1: collected and run (a verdict may fail on the fake); never a usage error or nothing collected.
        assert done.returncode in (0, 1), (line, output[-5000:])
        assert " error" not in last, (line, output[-5000:])
        assert " passed" in last or " failed" in last, (line, last)
        (results,) = folder.glob("apc-results/*/results.json")
        data = json.loads(results.read_text())
        assert data["runs"], line
        assert not data["errors"], (line, data["errors"])
        for run_record in data["runs"]:
            assert run_record["completed"] > 0, (line, run_record["id"])
            assert run_record["failed"] == 0, (line, run_record["id"])
    assert MAIN_JOB in checkout_only  # on real vLLM instead, as the main job
    assert {line.split()[0] for line in checkout_only} <= {"bash", "pip", "sudo", "pytest", "pytest-apc"}
    assert len(ran) >= 15, ran
    assert not vllm_servers()
