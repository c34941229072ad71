"""A fleet: several vLLM replicas behind one router, measured as one deployment.

Where each request lands decides APC's payoff: a request can only hit the prefix blocks of the replica it
is routed to. A fleet is therefore measured replica by replica: every replica's cache is reset (and the
reset verified) before a run, and every replica's counters are scraped around it (``metrics.merge`` keeps
each as a part), so the verdicts can count requests, hits and cold prefills per replica.

Two kinds:

* launched: ``--apc-set replicas`` vLLM servers (``LaunchedServer``, one log each) behind ``vllm-router``
  (``router.Router``), started with one policy at a time (``route``); the replicas stay up across policies;
* external: a router or gateway run elsewhere (``--apc-fleet-url``) and every replica's base URL
  (``--apc-metrics-url``): measured, reset and scraped, never started or stopped.

A data-parallel server (``--data-parallel-size``) is one ``LaunchedServer``: its ranks are the parts of
one ``/metrics`` (the ``engine`` label).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import requests

from pytest_apc.serving import metrics, probe
from pytest_apc.serving.endpoint import Endpoint
from pytest_apc.serving.interface import ServerError, ServerInfo
from pytest_apc.serving.router import Router, RouterError
from pytest_apc.workload.cases import ServerMode
from pytest_apc.workload.multiturn import Message

# What replicas of one fleet must agree on to be measured as one (the cache_config_info labels).
MUST_AGREE = ("block_size", "enable_prefix_caching", "prefix_caching_hash_algo")


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
                # every replica to be ready or time out (--apc-set startup_timeout); they give up now, each
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
                    "point at different deployments, or --apc-set served_model_name is not the name the gateway "
                    "routes by"
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
        return router if router is not None and router.exited() else None

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

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        """The first replica's tokens (they serve one model; a router need not pass /tokenize on, and must
        not count it as routed)."""
        return self.replicas[0].tokenize(messages)

    def chat_header_tokens(self) -> int:
        """The first replica's (they serve one model)."""
        return self.replicas[0].chat_header_tokens()
