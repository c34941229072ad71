"""Where this ran: versions, devices, parallel layout, commit (the ``environment`` block of results.json).

The baseline gate reads it: another GPU model or count, tensor- or data-parallel size, dtype or KV-cache
dtype makes two runs incomparable; another vLLM or torch version is what a release gate compares. A
session that resumes an earlier one (``--apc-resume``) is held to the same, and to the same commit.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import pytest_apc
from pytest_apc.config import flag_value
from pytest_apc.serving.gpus import cuda_visible_devices
from pytest_apc.serving.interface import EXTERNAL, ServerInfo

# Server flags that set the layout and precision, with vLLM's short forms, and what they default to.
LAYOUT_FLAGS = {
    "tensor_parallel_size": (("--tensor-parallel-size", "-tp"), "1"),
    "data_parallel_size": (("--data-parallel-size", "-dp"), "1"),
    "dtype": (("--dtype",), "auto"),
    "kv_cache_dtype": (("--kv-cache-dtype",), "auto"),
}


def _run(*cmd: str) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def server_layout(server: Mapping[str, Any]) -> dict[str, str | None]:
    """Tensor- and data-parallel size, dtype and KV-cache dtype of one server (a ``servers[]`` entry of a
    results file): from its command line when pytest-apc launched it (vLLM's default when the flag is
    absent); the KV-cache dtype from ``vllm:cache_config_info`` when the server published it; None where
    nothing tells (an external server)."""
    command = [str(part) for part in server.get("command") or []]
    external = command[:1] == [EXTERNAL]
    layout: dict[str, str | None] = {}
    for key, (names, default) in LAYOUT_FLAGS.items():
        layout[key] = None if external or not command else (flag_value(command, names) or default)
    cache_dtype = (server.get("cache_config") or {}).get("cache_dtype")
    if cache_dtype:
        layout["kv_cache_dtype"] = str(cache_dtype)
    return layout


def layouts(servers: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Every server's layout, by mode (``apc-on``, ``apc-off``, ...)."""
    return {str(server.get("mode")): server_layout(server) for server in servers}


@functools.cache  # one nvidia-smi call per process: results.json carries the environment from its first write
def gpu_names() -> tuple[list[str], list[str]]:
    """(the model name of every GPU of the node, those of the GPUs this process may use), from one
    nvidia-smi call; ([], []) without GPUs."""
    listed = _run("nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader")
    rows = [[field.strip() for field in line.split(",", 2)] for line in (listed or "").splitlines()]
    wanted = cuda_visible_devices()
    visible = rows if wanted is None else [row for row in rows if row[0] in wanted or row[1] in wanted]
    return [row[2] for row in rows], [row[2] for row in visible]


def _version(distribution: str) -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(distribution)
    return None


@functools.cache
def git_commit() -> str | None:
    """The commit pytest-apc was built from (an installed sdist or wheel records it), else that of the
    checkout it runs from; None for neither. Never the commit of the folder pytest runs in: that is the
    user's project, not this build."""
    recorded = Path(pytest_apc.__file__).with_name("_commit.txt")
    if recorded.is_file() and (commit := recorded.read_text().strip()):
        return commit
    return _run("git", "-C", str(recorded.parent), "rev-parse", "HEAD")


def environment(servers: Mapping[str, ServerInfo]) -> dict[str, Any]:
    """Where this ran: versions, devices, each server's layout, commit."""
    versions = sorted({info.version for info in servers.values() if info.version})
    router = _version("vllm-router") if any(info.members for info in servers.values()) else None
    gpus, visible = gpu_names()
    return {
        "pytest_apc": pytest_apc.__version__,
        "vllm": versions[0] if len(versions) == 1 else versions or None,
        "torch": _version("torch"),
        "python": platform.python_version(),
        "pytest": pytest.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        # The GPUs the servers could use: their model and count decide whether two runs compare.
        "gpu_model": ", ".join(sorted(set(visible))) or None,
        "gpu_count": len(visible),
        "layout": layouts(info.__dict__ for info in servers.values()),
        "vllm_router": router,  # the router a launched fleet ran behind
        "git_commit": git_commit(),
        "argv": sys.argv,
    }
