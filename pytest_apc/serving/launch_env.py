"""A launched server's environment: what the plugin sets for it, and which of those variables a launcher
must pass on."""

from __future__ import annotations

import os
from collections.abc import Mapping


def own_variables(env: Mapping[str, str]) -> list[str]:
    """The names of the variables a server's environment sets apart from this process's own: what a launcher
    that starts the server in another environment (a container) must pass on."""
    return sorted(name for name, value in env.items() if os.environ.get(name) != value)


BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"  # vLLM's batch-invariant mode: tokens that do not depend on the batch


def batch_invariant(env: Mapping[str, str]) -> bool:
    """Whether a server started with ``env`` runs in vLLM's batch-invariant mode (vLLM reads the variable
    as an integer)."""
    try:
        return int(env.get(BATCH_INVARIANT) or "0") != 0
    except ValueError:
        return False


def server_env(profile: str, api_key: str = "", invariant: bool = False) -> dict[str, str]:
    """Environment of a launched server: dev mode for the reset endpoint, offline, CPU KV space, the API
    key (in the environment, where ``ps`` does not show it, rather than as ``--api-key``), and vLLM's
    batch-invariant mode where asked for (``--apc-set batch_invariant=on``)."""
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # registers /reset_prefix_cache
    if invariant:
        env[BATCH_INVARIANT] = "1"
    if api_key:
        env["VLLM_API_KEY"] = api_key
    if profile == "cpu":
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return env
