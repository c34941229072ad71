"""The package as users install it: a wheel built from this checkout, installed (not editable) into a new
virtual environment, runs the shipped suite from an empty folder against a real vLLM CPU server.

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
import zipfile
from pathlib import Path

import pytest

from tests.conftest import apc_processes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources: an earlier build folder in the checkout cannot leak in."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("pytest_apc", "tests_apc"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(source), "-w", out, cwd=out)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("pytest_apc-*.whl")
    return path


def test_the_wheel_holds_every_subpackage_its_data_and_the_suite(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in sorted(REPO.glob("pytest_apc/**/*.py")) + sorted(REPO.glob("tests_apc/*.py")):
        assert str(module.relative_to(REPO)) in names
    assert {"pytest_apc/results/results.schema.json", "pytest_apc/py.typed"} <= names
    assert not any(name.startswith("tests/") for name in names)  # the plugin's own tests stay out


def test_an_installed_wheel_runs_the_suite_from_an_empty_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    python = venv / "bin" / "python"
    installed = _run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    own = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).stdout.strip()
    )
    # vLLM and torch from the project's environment, after everything the new one has.
    (own / "zz-project-vllm.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = _run(python, "-c", "import pytest_apc.plugin, pytest_apc.report, vllm; print(pytest_apc.__file__)",
                 cwd=tmp_path)  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(own)  # the wheel's copy, not this checkout's

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    inner = subprocess.Popen(
        [str(python), "-m", "pytest", "--pyargs", "tests_apc", "-m", "pure and not sweep", "--cpu-node",
         "-p", "no:cacheprovider", "--apc-results-dir=apc-results"],
        cwd=empty, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output, _ = inner.communicate(timeout=900)
    assert inner.returncode == 0, output[-5000:]
    assert "3 passed" in output
    (results,) = empty.glob("apc-results/*/results.json")
    data = json.loads(results.read_text())
    assert [r["id"] for r in data["runs"]] == ["C-c8", "D-c8"]
    assert all(v["passed"] for v in data["verdicts"])
    assert not apc_processes(inner.pid)
