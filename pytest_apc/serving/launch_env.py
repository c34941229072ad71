"""A launched server's environment: what the plugin sets for it, and which of those variables a launcher
must pass on."""

from __future__ import annotations

import os
from collections.abc import Mapping


def own_variables(env: Mapping[str, str]) -> list[str]:
    """The names of the variables a server's environment sets apart from this process's own: what a launcher
    that starts the server in another environment (a container) must pass on."""
    return sorted(name for name, value in env.items() if os.environ.get(name) != value)


def server_env(profile: str, api_key: str = "") -> dict[str, str]:
    """Environment of a launched server: dev mode for the reset endpoint, offline, CPU KV space, and the
    API key (in the environment, where ``ps`` does not show it, rather than as ``--api-key``)."""
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # registers /reset_prefix_cache
    if api_key:
        env["VLLM_API_KEY"] = api_key
    if profile == "cpu":
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return env
