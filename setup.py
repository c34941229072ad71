"""Build hooks (everything else is in pyproject.toml): the sdist and the wheel record the commit they were
built from in ``pytest_apc/_commit.txt``, so that results written by an installed wheel name their commit
(``measure/provenance.py``). A wheel built from an sdist takes the sdist's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
COMMIT_FILE = Path("pytest_apc") / "_commit.txt"


def _commit() -> str | None:
    """The commit an sdist this is built from recorded (the hooks below never write into a checkout, so the
    file is there only in an unpacked sdist, which may lie inside some other repository), else the
    checkout's, else None."""
    recorded = HERE / COMMIT_FILE
    if recorded.is_file() and (commit := recorded.read_text().strip()):
        return commit
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def _record(root: str) -> None:
    commit = _commit()
    if commit:
        (Path(root) / COMMIT_FILE).write_text(commit + "\n")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        _record(self.build_lib)


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _record(base_dir)


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
