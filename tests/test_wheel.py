"""The package as users install it: an sdist built from this checkout holds what the plugin's own tests read
(they run from it), a wheel built from the sdist holds the license and the console script, and installed (not
editable) into a new virtual environment it runs the shipped suite through ``pytest-apc`` from an empty folder
against a real vLLM CPU server.

vLLM's CPU build and torch are not installed again (gigabytes): the new environment sees the project's
.venv packages through a path file placed after its own site-packages, so pytest-apc and its dependencies
come from the wheel and the new environment, and only vLLM and torch from the project's."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import apc_processes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# What .gitignore names: a venv, an earlier build or egg-info folder, results or caches cannot leak into the builds.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache", "apc-results",
    "*.egg-info", "build", "dist", ".gpu",
)  # fmt: skip
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


def _built(command: list[str | Path], cwd: Path, out: Path, pattern: str) -> Path:
    """Run a build command; the one file it wrote into ``out``."""
    built = _run(*command, cwd=cwd)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob(pattern)
    return path


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, built by setuptools' build backend (what ``python -m build --sdist`` calls) from a copy of
    the checkout."""
    source, out = tmp_path_factory.mktemp("source") / "pytest-apc", tmp_path_factory.mktemp("sdist")
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    backend = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    return _built([sys.executable, "-c", backend, out], source, out, "pytest_apc-*.tar.gz")


@pytest.fixture(scope="module")
def wheel(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the sdist, as ``python -m build`` builds it: the sdist must hold what it needs."""
    out = tmp_path_factory.mktemp("wheel")
    return _built(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", sdist, "-w", out], out, out, "pytest_apc-*.whl"
    )


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed (not editable); its bin folder."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    assert _run(sys.executable, "-m", "venv", venv, cwd=root).returncode == 0
    python = venv / "bin" / "python"
    installed = _run(python, "-m", "pip", "install", "-q", wheel, cwd=root)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    own = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root).stdout.strip())
    # vLLM and torch from the project's environment, after everything the new one has.
    (own / "zz-project-vllm.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = _run(python, "-c", "import pytest_apc.plugin, pytest_apc.report, vllm; print(pytest_apc.__file__)",
                 cwd=root)  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(own)  # the wheel's copy, not this checkout's
    return venv / "bin"


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
    ran = _run(installed / "python", "-m", "pytest", *SDIST_TESTS, "-q", "-p", "no:cacheprovider", cwd=unpacked)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-5000:]
    assert " passed" in ran.stdout


def test_the_installed_console_script_prints_the_version_and_runs_the_commands(installed: Path, tmp_path: Path) -> None:
    from pytest_apc import __version__

    version = _run(installed / "pytest-apc", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout) == (0, f"pytest-apc {__version__}\n")
    example = REPO / "docs" / "results" / "cpu" / "results.json"
    script = _run(installed / "pytest-apc", "report", example, cwd=tmp_path)
    module = _run(installed / "python", "-m", "pytest_apc", "report", example, cwd=tmp_path)
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    assert script.stdout == module.stdout
    assert "pair" in script.stdout
    license_text = "import importlib.metadata as m; print(m.distribution('pytest-apc').read_text('licenses/LICENSE'))"
    shipped = _run(installed / "python", "-c", license_text, cwd=tmp_path)
    assert shipped.stdout == (REPO / "LICENSE").read_text() + "\n"


def test_an_installed_wheel_runs_the_suite_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    """``pytest-apc ARGS``, the console script, runs the installed suite (pytest --pyargs tests_apc ARGS)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    inner = subprocess.Popen(
        [str(installed / "pytest-apc"), "-m", "pure and not sweep", "--cpu-node", "-p", "no:cacheprovider",
         "--apc-results-dir=apc-results"],
        cwd=empty, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output, _ = inner.communicate(timeout=900)
    assert inner.returncode == 0, output[-5000:]
    assert "4 passed" in output
    (results,) = empty.glob("apc-results/*/results.json")
    data = json.loads(results.read_text())
    assert [r["id"] for r in data["runs"]] == ["C-c8", "D-c8"]
    assert all(v["passed"] for v in data["verdicts"])
    assert data["environment"]["pytest_apc"] == __import__("pytest_apc").__version__
    assert not apc_processes(inner.pid)
