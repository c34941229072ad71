"""The package as users install it, built and installed once per test session: an sdist built from this
checkout, a wheel built from the sdist, and a new virtual environment with the wheel installed (not
editable). The end-to-end tests run the installed console script from empty folders.

vLLM's CPU build and torch are not installed again (gigabytes): the new environment sees the project's
.venv packages through a path file placed after its own site-packages, so pytest-apc and its dependencies
come from the wheel and the new environment, and only vLLM and torch from the project's."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(
    *args: str | Path, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")} | (
        env or {}
    )
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# What .gitignore names: a venv, an earlier build or egg-info folder, results or caches cannot leak into the builds.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache", "apc-results",
    "*.egg-info", "build", "dist", ".gpu",
)  # fmt: skip


def _built(command: list[str | Path], cwd: Path, out: Path, pattern: str, env: dict[str, str] | None = None) -> Path:
    """Run a build command; the one file it wrote into ``out``."""
    built = run(*command, cwd=cwd, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob(pattern)
    return path


@pytest.fixture(scope="session")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, built by setuptools' build backend (what ``python -m build --sdist`` calls) from a copy of
    the checkout."""
    source, out = tmp_path_factory.mktemp("source") / "pytest-apc", tmp_path_factory.mktemp("sdist")
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    backend = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    # The copy has no .git: the build reads the checkout's commit (setup.py records it) from the original's.
    git = {"GIT_DIR": str(REPO / ".git")}
    return _built([sys.executable, "-c", backend, out], source, out, "pytest_apc-*.tar.gz", git)


@pytest.fixture(scope="session")
def wheel(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the sdist, as ``python -m build`` builds it: the sdist must hold what it needs."""
    out = tmp_path_factory.mktemp("wheel")
    return _built(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", sdist, "-w", out], out, out, "pytest_apc-*.whl"
    )


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed (not editable); its bin folder."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    assert run(sys.executable, "-m", "venv", venv, cwd=root).returncode == 0
    python = venv / "bin" / "python"
    installed = run(python, "-m", "pip", "install", "-q", wheel, cwd=root)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    own = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root).stdout.strip())
    # vLLM and torch from the project's environment, after everything the new one has.
    (own / "zz-project-vllm.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = run(python, "-c", "import pytest_apc.plugin, pytest_apc.report, vllm; print(pytest_apc.__file__)",
                 cwd=root)  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(own)  # the wheel's copy, not this checkout's
    return venv / "bin"
