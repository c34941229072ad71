"""The two kinds of one vLLM OpenAI server, both an ``Endpoint`` (endpoint.py): ``LaunchedServer`` (started
in its own process group, watched, stopped) and ``ExternalServer`` (runs elsewhere: probed, never started
or stopped)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import psutil
import requests

from pytest_apc.redaction import redact_argv
from pytest_apc.serving import probe
from pytest_apc.serving.endpoint import Endpoint, Reach
from pytest_apc.serving.executor import Executor
from pytest_apc.serving.gpus import gpu_memory_used_mib, wait_gpu_memory_released
from pytest_apc.serving.interface import EXTERNAL, ServerError, ServerInfo
from pytest_apc.serving.launch_env import batch_invariant
from pytest_apc.serving.logwatch import Fatal, LogWatch
from pytest_apc.workload.cases import ServerMode

# Titles vLLM gives its engine and worker processes (setproctitle): one that exits is a dead engine.
ENGINE_TITLES = ("VLLM::EngineCore", "VLLM::Worker")


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
        self.info.batch_invariant = batch_invariant(self.env)
        return argv

    def _wait_launched(self, started: float) -> None:
        self._log_watch = LogWatch(self.log_path, start=self._process.log_offset)  # this launch's lines only
        self._engines = {}
        self._wait_ready(
            started, self.startup_timeout, "raise --apc-set startup_timeout if the model is just slow to load"
        )

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
        """Probe it (seconds, not --apc-set startup_timeout: it is up already or it is the wrong URL), then
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
