"""What the session needs from whatever serves one APC mode, declared once: one server (``endpoint.py``:
``Endpoint``, and its kinds in ``server.py``, subclass it) or a fleet of them (``fleet.py``);
``deployment.py`` picks the kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_apc.serving import metrics
from pytest_apc.workload.cases import ServerMode
from pytest_apc.workload.multiturn import Message

EXTERNAL = "(external)"  # ServerInfo.command of a server given by URL


class ServerError(RuntimeError):
    """A server that could not start, died, or answered what it must not."""


@dataclass
class ServerInfo:
    """What the results file records about one server."""

    mode: str
    command: list[str]
    url: str
    log: str
    served_model_name: str = ""  # the name the benchmark requests: as given, else the one /v1/models lists
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    prefix_caching_hash_algo: str | None = None
    kv_cache_line: str | None = None
    version: str | None = None
    max_model_len: int | None = None
    startup_s: float | None = None
    chat_header_tokens: int | None = None  # tokens the chat template puts before the user's text
    chat_header_error: str | None = None  # why /tokenize could not measure them
    cache_config: dict[str, str] = field(default_factory=dict)
    # vLLM's batch-invariant mode: a launched server's from its environment, one run elsewhere as the
    # batch_invariant setting declares it.
    batch_invariant: bool = False
    # A fleet: each replica's own identity (the fields above, as a dict); the fleet's own are replica 1's
    # where they agree (the fleet refuses replicas that do not), its URL is the router's.
    members: list[dict[str, Any]] = field(default_factory=list)
    # The offload case: the sizes it was launched with and why (offload.OffloadSizes, as a dict).
    offload: dict[str, Any] = field(default_factory=dict)

    @property
    def external(self) -> bool:
        """Run elsewhere (--apc-url-on/off): not started, stopped or logged by pytest-apc."""
        return self.command[:1] == [EXTERNAL]


class Deployment(Protocol):
    """What the session needs from whatever serves one APC mode."""

    mode: ServerMode
    info: ServerInfo  # identity: command, URL, version, block size, KV capacity, hash algorithm, chat header
    log_path: Path
    launched: bool  # started by pytest-apc (counts as a launch; its log is ours)

    @property
    def url(self) -> str:
        """Where the benchmark sends its requests."""
        ...

    @property
    def served_model_name(self) -> str:
        """The model name the benchmark requests (a server run elsewhere: its own, unless one was given)."""
        ...

    def start(self) -> ServerInfo:
        """Start (or find) it and return once it is ready; raises ``ServerError`` with its log tail."""
        ...

    def alive(self) -> bool:
        """Serving: its process runs (if it has one) and nothing says its engine is gone."""
        ...

    def check_alive(self, doing: str) -> None:
        """Raise ``ServerError`` (naming ``doing``) when it no longer serves."""
        ...

    def watch(self) -> str | None:
        """Polled while a benchmark runs: why the benchmark should stop now (a dead or hung engine)."""
        ...

    def reset_prefix_cache(self) -> str:
        """Empty every prefix cache it has, verified; returns how."""
        ...

    def scrape(self) -> metrics.Snapshot: ...

    def wait_idle(self) -> metrics.Snapshot:
        """A scrape once nothing runs and the counters have settled."""
        ...

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        """The prompt token ids it prefills for ``messages`` (the chat template applied); never routed, so
        that a router does not count it as a request."""
        ...

    def chat_header_tokens(self) -> int:
        """Tokens the chat template puts before every prompt (from ``tokenize``)."""
        ...

    def stop(self) -> None:
        """Stop whatever pytest-apc started; always safe to call."""
        ...

    def route(self, route: str) -> str:
        """Make the next run go through ``route`` (a router policy); returns the router's command line."""
        ...
