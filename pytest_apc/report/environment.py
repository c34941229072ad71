"""Where this ran: versions, devices, commit (the ``environment`` block of results.json)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from typing import Any

import pytest

import pytest_apc
from pytest_apc.session import ApcSession


def environment(apc: ApcSession) -> dict[str, Any]:
    """Where this ran: versions, devices, commit."""

    def run(*cmd: str) -> str | None:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        return out or None

    versions = sorted({info.version for info in apc.measured.servers.values() if info.version})
    router = None
    if any(info.members for info in apc.measured.servers.values()):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            router = importlib.metadata.version("vllm-router")
    gpus = run("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    return {
        "pytest_apc": pytest_apc.__version__,
        "vllm": versions[0] if len(versions) == 1 else versions or None,
        "python": platform.python_version(),
        "pytest": pytest.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus.splitlines() if gpus else [],
        "vllm_router": router,  # the router a launched fleet ran behind
        # The results folder's repository, else the one pytest ran in.
        "git_commit": run("git", "-C", str(apc.run_dir.parent), "rev-parse", "HEAD") or run("git", "rev-parse", "HEAD"),
        "argv": sys.argv,
    }
