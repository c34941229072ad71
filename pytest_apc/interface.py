"""What the session needs from whatever serves one APC mode, declared once: one server (``server.py``:
``Endpoint`` and its kinds subclass it) or a fleet of them (``fleet.py``); ``deployment.py`` picks the kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pytest_apc import metrics
from pytest_apc.cases import ServerMode
from pytest_apc.records import ServerInfo


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

    def chat_header_tokens(self) -> int:
        """Tokens the chat template puts before every prompt."""
        ...

    def stop(self) -> None:
        """Stop whatever pytest-apc started; always safe to call."""
        ...

    def route(self, route: str) -> str:
        """Make the next run go through ``route`` (a router policy); returns the router's command line."""
        ...
