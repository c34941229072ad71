"""A fleet: several vLLM replicas behind one router, measured as one deployment.

Where each request lands decides APC's payoff: a request can only hit the prefix blocks of the replica it
is routed to. A fleet is therefore measured replica by replica: every replica's cache is reset (and the
reset verified) before a run, and every replica's counters are scraped around it (``metrics.merge`` keeps
each as a part), so the verdicts can count requests, hits and cold prefills per replica.

Two kinds:

* launched: ``--apc-replicas`` vLLM servers (``LaunchedServer``, one log each) behind ``vllm-router``,
  which this module starts with one policy at a time (``route``); the replicas stay up across policies;
* external: a router or gateway run elsewhere (``--apc-fleet-url``) and every replica's base URL
  (``--apc-metrics-url``): measured, reset and scraped, never started or stopped.

A data-parallel server (``--data-parallel-size``) is one ``LaunchedServer``: its ranks are the parts of
one ``/metrics`` (the ``engine`` label).
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import requests

from pytest_apc.serving import metrics, probe
from pytest_apc.serving import process as procs
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.logwatch import tail
from pytest_apc.serving.server import Endpoint, ServerError, free_port
from pytest_apc.workload.cases import ServerMode

# What replicas of one fleet must agree on to be measured as one (the cache_config_info labels).
MUST_AGREE = ("block_size", "enable_prefix_caching", "prefix_caching_hash_algo")
ROUTER_EXTRA = "pip install 'pytest-apc[fleet]'"  # or: pip install vllm-router


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
        self.env = env
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.policy = ""
        self.argv: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.connect_host}:{self.port}"

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def missing(self) -> str | None:
        """Why the router cannot be started here, said before trying."""
        if shutil.which(self.command[0]) is None and not Path(self.command[0]).is_file():
            return (
                f"the fleet tests start vllm-router ({self.command[0]!r}), which is not installed: {ROUTER_EXTRA} "
                "(or point --apc-router-command at it, or measure a fleet run elsewhere with --apc-fleet-url)"
            )
        return None

    def start(self, policy: str, worker_urls: Sequence[str]) -> None:
        """Start with ``policy`` and wait until it answers /health; raises RouterError with its log."""
        self.stop()
        self.port = free_port(self.bind_host)
        self.policy = policy
        # vllm-router also serves Prometheus metrics, on 127.0.0.1:29000 unless told otherwise: with that port
        # taken (another run's router, any other process) it exits while starting. Its own free port; a
        # --prometheus-port in --apc-router-arg comes later and wins.
        self.argv = [
            *self.command, "--worker-urls", *worker_urls, "--policy", policy,
            "--host", self.bind_host, "--port", str(self.port),
            "--prometheus-port", str(free_port("127.0.0.1")), *self.extra,
        ]  # fmt: skip
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== pytest-apc: {self.command_line}\n".encode())
            log.flush()
            try:
                self.proc = procs.spawn(self.argv, self.env, log)
            except OSError as err:
                raise RouterError(f"vllm-router could not be executed: {err}\ncommand: {self.command_line}") from err
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self.failure(f"exited with code {code} while starting")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise self.failure(f"did not answer /health within {self.startup_timeout:.0f} s")
            time.sleep(0.3)

    def failure(self, what: str) -> RouterError:
        self.stop()
        return RouterError(
            f"vllm-router ({self.policy}) {what}\ncommand: {self.command_line}\nlog: {self.log_path}\n"
            f"--- last lines of the router log ---\n{tail(self.log_path, 30)}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, self.stop_timeout)
            self.proc = None


def _beside_python(command: list[str]) -> list[str]:
    """A bare program name not on PATH is looked up next to this interpreter (a virtualenv not activated)."""
    if command and "/" not in command[0] and shutil.which(command[0]) is None:
        candidate = Path(sys.executable).parent / command[0]
        if candidate.is_file():
            return [str(candidate), *command[1:]]
    return command


class Fleet:
    """Replicas (launched or external) and the URL that routes to them: one :class:`Deployment`."""

    def __init__(
        self,
        mode: ServerMode,
        replicas: Sequence[Endpoint],
        *,
        router: Router | None = None,
        url: str = "",
        log_path: Path,
        progress: Callable[[str], None] = lambda message: None,
        gateway: requests.Session | None = None,
    ) -> None:
        self.mode = mode
        self.replicas = list(replicas)
        self.router = router
        self._url = url
        self.log_path = log_path  # the router's log (launched), else the first replica's note
        self.launched = any(r.launched for r in self.replicas)
        self.info = ServerInfo(mode=mode.name, command=[], url=url, log=str(log_path))
        self._progress = progress
        self.gateway = gateway or requests.Session()  # how the external gateway is reached (key, CA bundle)

    @staticmethod
    def name(index: int) -> str:
        return f"replica {index + 1}"

    @property
    def url(self) -> str:
        return self.router.url if self.router is not None else self._url

    @property
    def served_model_name(self) -> str:
        """What the benchmark requests: the replicas' model (they are refused unless they serve one)."""
        return self.replicas[0].served_model_name

    # -- start and stop -------------------------------------------------------------------------------------

    def start(self) -> ServerInfo:
        """Every replica ready (started side by side), and all of them alike; raises ServerError."""
        if self.router is not None:
            missing = self.router.missing()
            if missing:
                raise RouterError(missing)
        started = time.monotonic()
        if self.router is None:
            self._probe_gateway()
        with ThreadPoolExecutor(max_workers=len(self.replicas)) as pool:
            try:
                outcomes = list(pool.map(self._start_one, range(len(self.replicas))))
            except BaseException:
                # Interrupted (Ctrl-C, SIGTERM): leaving this block joins the threads, which would wait for
                # every replica to be ready or time out (--apc-startup-timeout); they give up now, each
                # stopping its own server.
                for replica in self.replicas:
                    replica.cancel()
                raise
        failed = [text for text in outcomes if text]
        if failed:
            self.stop()
            raise ServerError("\n".join(failed))
        self._require_alike()
        if self.router is None:
            self._require_gateway_serves()
        first = self.replicas[0].info
        self.info = ServerInfo(**{**asdict(first), "mode": self.mode.name, "url": self.url, "log": str(self.log_path)})
        self.info.members = [asdict(r.info) for r in self.replicas]
        self.info.startup_s = round(time.monotonic() - started, 3)
        self._progress(f"{self.mode.name}: {len(self.replicas)} replicas ready in {self.info.startup_s:.0f} s")
        return self.info

    def _probe_gateway(self) -> None:
        """The external gateway answers its model list in seconds, or the fleet fails naming what it answered."""
        failure = probe.check(self.gateway, self._url, ("/v1/models",), key_hint="--apc-api-key")
        if failure:
            raise ServerError(f"the {self.mode.name} gateway (--apc-fleet-url {self._url}) does not answer: {failure}")

    def _require_gateway_serves(self) -> None:
        """The gateway routes by model name: it must list the one the replicas serve."""
        with contextlib.suppress(requests.RequestException, ValueError, AttributeError):
            listed = self.gateway.get(f"{self._url}/v1/models", timeout=probe.TIMEOUT_S).json()
            ids = [entry.get("id") for entry in listed.get("data", [])]
            if ids and self.served_model_name not in ids:
                self.stop()
                raise ServerError(
                    f"the {self.mode.name} gateway (--apc-fleet-url {self._url}) serves {ids}, not "
                    f"{self.served_model_name!r}, which its replicas serve: --apc-fleet-url and --apc-metrics-url "
                    "point at different deployments, or --apc-served-model-name is not the name the gateway routes by"
                )

    def _start_one(self, index: int) -> str:
        try:
            self.replicas[index].start()
        except ServerError as err:
            return f"{self.name(index)} of {len(self.replicas)} could not start:\n{err}"
        return ""

    def _require_alike(self) -> None:
        """Replicas that differ in version, served model, block size or APC setting are not one fleet."""
        problems = []
        first = self.replicas[0].info
        for index, replica in enumerate(self.replicas[1:], start=1):
            other = replica.info
            for name in MUST_AGREE:
                if first.cache_config.get(name) != other.cache_config.get(name):
                    problems.append(
                        f"{self.name(index)} has {name}={other.cache_config.get(name)!r}, replica 1 "
                        f"{first.cache_config.get(name)!r}"
                    )
            if self.replicas[0].served_model_name != replica.served_model_name:
                problems.append(
                    f"{self.name(index)} serves {replica.served_model_name!r}, replica 1 "
                    f"{self.replicas[0].served_model_name!r}"
                )
            if first.version != other.version:
                problems.append(f"{self.name(index)} runs vLLM {other.version}, replica 1 {first.version}")
        if problems:
            self.stop()
            raise ServerError(
                f"the {self.mode.name} replicas are not alike, so their counters cannot be added up or compared:\n- "
                + "\n- ".join(problems)
                + "\nreplicas: "
                + ", ".join(r.url for r in self.replicas)
            )

    def route(self, route: str) -> str:
        """Send the next repeat through ``route``: a fresh launched router with that policy, so that what a
        policy learned (cache_aware's prefix tree) is as cold as the reset caches. Returns the router's
        command line ("" for an external fleet)."""
        if self.router is None:
            return ""
        self.router.start(route, [r.url for r in self.replicas])
        self._progress(f"{self.mode.name}: vllm-router started with --policy {route}")
        return self.router.command_line

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        with ThreadPoolExecutor(max_workers=max(1, len(self.replicas))) as pool:
            list(pool.map(lambda replica: replica.stop(), self.replicas))

    # -- liveness -------------------------------------------------------------------------------------------

    def _router_gone(self) -> Router | None:
        """The router pytest-apc started (not only configured) if it has exited; else None."""
        router = self.router
        return router if router is not None and router.proc is not None and not router.alive() else None

    def alive(self) -> bool:
        return self._router_gone() is None and all(r.alive() for r in self.replicas)

    def check_alive(self, doing: str) -> None:
        for index, replica in enumerate(self.replicas):
            try:
                replica.check_alive(doing)
            except ServerError as err:
                raise ServerError(f"{self.name(index)} of the {self.mode.name} fleet: {err}") from None
        gone = self._router_gone()
        if gone is not None:
            raise gone.failure(f"is not running {doing}")

    def watch(self) -> str | None:
        gone = self._router_gone()
        if gone is not None:
            return f"vllm-router ({gone.policy}) exited; its log: {gone.log_path}"
        for index, replica in enumerate(self.replicas):
            trouble = replica.watch()
            if trouble:
                return f"{self.name(index)}: {trouble}"
        return None

    # -- what a measurement needs ---------------------------------------------------------------------------

    def reset_prefix_cache(self) -> str:
        """Reset every replica (each verified); a replica that does not reset fails the run."""
        done = []
        for index, replica in enumerate(self.replicas):
            try:
                done.append(f"{self.name(index)}: {replica.reset_prefix_cache()}")
            except ServerError as err:
                raise ServerError(f"{self.name(index)} of the {self.mode.name} fleet: {err}") from None
        return "; ".join(done)

    def _each(self, read: Callable[[Endpoint], metrics.Snapshot]) -> metrics.Snapshot:
        parts = {}
        for index, replica in enumerate(self.replicas):
            try:
                parts[self.name(index)] = read(replica)
            except (requests.RequestException, metrics.MetricsError) as err:
                raise metrics.MetricsError(f"{self.name(index)} ({replica.url}): {err}") from err
        return metrics.merge(parts)

    def scrape(self) -> metrics.Snapshot:
        return self._each(lambda replica: replica.scrape())

    def wait_idle(self) -> metrics.Snapshot:
        return self._each(lambda replica: replica.wait_idle())

    def chat_header_tokens(self) -> int:
        """The first replica's (they serve one model; a router need not pass /tokenize on)."""
        return self.replicas[0].chat_header_tokens()
