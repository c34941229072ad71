"""A launched vLLM server's command line: the launcher (its ``{env}`` placeholders expanded), the server
command, the plugin's flags and the user's ``--apc-server-arg``."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from pytest_apc.workload.cases import ServerMode

# {env} or {env:FLAG} as one word of --apc-launcher: the server's own environment variables, by name.
ENV_PLACEHOLDER = re.compile(r"^\{env(?::(?P<flag>[^}]+))?\}$")


def expand_launcher(launcher: Sequence[str], env_names: Sequence[str]) -> list[str]:
    """The launcher with each ``{env}`` replaced by ``-e NAME`` for every variable the plugin sets for the
    server (``{env:FLAG}``: ``FLAG NAME``). Names only: a container runtime given ``-e NAME`` takes the value
    from its own environment, where the plugin put it, so no value (an API key) is on a command line."""
    argv: list[str] = []
    for part in launcher:
        found = ENV_PLACEHOLDER.match(part)
        if found is None:
            argv.append(part)
            continue
        for name in env_names:
            argv += [found["flag"] or "-e", name]
    return argv


def build_command(
    base: Sequence[str],
    *,
    model: str,
    served_model_name: str,
    host: str,
    port: int,
    mode: ServerMode,
    max_model_len: int,
    tensor_parallel_size: int,
    extra: Sequence[str],
    launcher: Sequence[str] = (),
    env_names: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The server command line: launcher (its ``{env}`` expanded; ``{python}`` there is this interpreter,
    which runs it), server (``{python}`` replaced by ``python``), the plugin's flags, the user's
    ``--apc-server-arg`` last."""
    argv = [part.replace("{python}", sys.executable) for part in expand_launcher(launcher, env_names)]
    argv += [part.replace("{python}", python) for part in base]
    argv += ["--model", model, "--served-model-name", served_model_name, "--host", host, "--port", str(port)]
    argv += ["--max-model-len", str(max_model_len), "--seed", "0"]
    if tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    argv += ["--enable-prefix-caching" if mode.apc else "--no-enable-prefix-caching"]
    if mode.hash_algo:
        argv += ["--prefix-caching-hash-algo", mode.hash_algo]
    return argv + list(extra)
