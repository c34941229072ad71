"""vllm-router in front of a launched fleet's replicas: one process (an ``Executor``), started afresh with
one policy at a time (``Fleet.route``) and ready when it answers ``/health``."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import requests

from pytest_apc.serving.executor import Executor, free_port
from pytest_apc.serving.interface import ServerError

# What the `fleet` extra installs (pyproject.toml; a test keeps the two alike): pytest-apc is on no package index,
# so the message names the router itself.
ROUTER_REQUIREMENT = "vllm-router>=0.1.17"
ROUTER_EXTRA = f"pip install '{ROUTER_REQUIREMENT}'"


class RouterError(ServerError):
    """The router could not be started or stopped routing."""


class Router:
    """vllm-router in front of the replicas, started by pytest-apc with one policy at a time."""

    def __init__(
        self,
        command: Sequence[str],
        extra: Sequence[str],
        *,
        bind_host: str,
        connect_host: str,
        log_path: Path,
        env: dict[str, str],
        startup_timeout: float,
        stop_timeout: float,
    ) -> None:
        self.command = _beside_python(list(command))
        self.extra = list(extra)
        self.bind_host = bind_host
        self.connect_host = connect_host
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.policy = ""
        self._process = Executor(
            "vllm-router", log_path, env, stop_timeout=stop_timeout, error=RouterError, log_kind="router",
            bind_host=bind_host, port_retries=2,
        )  # fmt: skip

    @property
    def port(self) -> int:
        return self._process.port

    @property
    def argv(self) -> list[str]:
        return self._process.argv

    @property
    def url(self) -> str:
        return f"http://{self.connect_host}:{self.port}"

    @property
    def command_line(self) -> str:
        return self._process.command_line

    def missing(self) -> str | None:
        """Why the router cannot be started here, said before trying."""
        if shutil.which(self.command[0]) is None and not Path(self.command[0]).is_file():
            return (
                f"the fleet tests start vllm-router ({self.command[0]!r}), which is not installed: {ROUTER_EXTRA} "
                "(or point --apc-set router_command at it, or measure a fleet run elsewhere with --apc-fleet-url)"
            )
        return None

    def start(self, policy: str, worker_urls: Sequence[str]) -> None:
        """Start with ``policy`` (the router of the previous policy is stopped first) and wait until it answers
        /health; raises RouterError with its log."""
        self.stop()
        self.policy = policy

        def command(port: int) -> list[str]:
            # vllm-router also serves Prometheus metrics, on 127.0.0.1:29000 unless told otherwise: with that
            # port taken (another run's router, any other process) it exits while starting. Its own free port;
            # a --prometheus-port in --apc-set router_arg comes later and wins.
            return [
                *self.command, "--worker-urls", *worker_urls, "--policy", policy,
                "--host", self.bind_host, "--port", str(port),
                "--prometheus-port", str(free_port("127.0.0.1")), *self.extra,
            ]  # fmt: skip

        self._process.start(command, self._wait_healthy)

    def _wait_healthy(self) -> None:
        self._process.wait_until(
            self._healthy,
            timeout=self.startup_timeout,
            interval=0.3,
            exited=lambda code: self.failure(f"exited with code {code} while starting"),
            timed_out=lambda: self.failure(f"did not answer /health within {self.startup_timeout:.0f} s"),
        )

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def failure(self, what: str) -> Exception:
        """RouterError for ``what``, with the router's log tail; the router is stopped (its group too)."""
        self.stop()
        return self._process.failure(what, who=f"vllm-router ({self.policy})", lines=30)

    def alive(self) -> bool:
        return self._process.running()

    def exited(self) -> bool:
        """Started (not only configured) and ended since."""
        return self._process.proc is not None and not self._process.running()

    def stop(self) -> None:
        self._process.stop()


def _beside_python(command: list[str]) -> list[str]:
    """A bare program name not on PATH is looked up next to this interpreter (a virtualenv not activated)."""
    if command and "/" not in command[0] and shutil.which(command[0]) is None:
        candidate = Path(sys.executable).parent / command[0]
        if candidate.is_file():
            return [str(candidate), *command[1:]]
    return command
