"""One child process that pytest-apc launches, watches and stops: the vLLM server, vllm-router and the
benchmark worker are each an :class:`Executor` (the pattern of mirakuru, which pytest-postgresql uses).

An executor has a command, an environment, a log file and, when it listens, a port it chose. Each
launch

* chooses a free port on ``bind_host`` (none without one) and builds the command for it;
* writes the line ``===== pytest-apc: <command>`` to the log, so that every launch's lines begin with
  what was run (secrets redacted);
* starts the command in its own process group, tagged and registered (``process.spawn``); a command that
  cannot be executed at all is an error that names it;
* waits until the launcher's readiness hook returns; a launch that fails while its log says
  "Address already in use" (another process took the port between choice and bind) is made again on a
  fresh port, ``port_retries`` times.

What the launchers do differently is a parameter or a hook, not a copy: the server's readiness checks
(``Endpoint._wait_ready``) and its wait for the GPUs after a stop (``after_stop``), the router's restart
per policy, the worker's requests on its standard input (``stdin``). Their failures read alike:
:func:`describe` gives what happened, the command, the log and the log's last lines.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_apc.redaction import redact_argv
from pytest_apc.serving import process as procs
from pytest_apc.serving.logwatch import tail

ADDRESS_IN_USE = "Address already in use"


def free_port(host: str) -> int:
    """A port nothing listens on now (another process may still take it before the child binds it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def describe(who: str, what: str, command: str, log_path: Path, log_kind: str, lines: int = 40) -> str:
    """A failure as every launched (or reached) process reports it: who, what happened, the command, the
    log and its last ``lines`` lines."""
    return f"{who} {what}\ncommand: {command}\n" + log_excerpt(log_path, log_kind, lines)


def log_excerpt(log_path: Path, log_kind: str, lines: int) -> str:
    return f"log: {log_path}\n--- last lines of the {log_kind} log ---\n{tail(log_path, lines)}"


class Executor:
    """One launched child process: started (with a port of its own when it listens), polled until ready,
    described in failures with its log's tail, and stopped with its whole process group."""

    def __init__(
        self,
        name: str,
        log_path: Path,
        env: Mapping[str, str],
        *,
        stop_timeout: float,
        error: Callable[[str], Exception],
        log_kind: str,
        bind_host: str = "",
        port_retries: int = 0,
        stdin: int | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        after_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name  # how messages name it: "apc-on server", "vllm-router", "benchmark worker"
        self.log_path = log_path
        self.env = dict(env)
        self.stop_timeout = stop_timeout
        self.error = error  # the launcher's own exception type, built from a message
        self.log_kind = log_kind  # "--- last lines of the <log_kind> log ---"
        self.bind_host = bind_host  # where it listens; "" for a process that takes no port
        self.port_retries = port_retries
        self.stdin = stdin  # subprocess.PIPE for a process that reads requests; None: no input
        self.cancelled = cancelled  # no new launch once its owner gave up
        self.after_stop = after_stop
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.argv: list[str] = []
        self.log_offset = 0  # where this launch's lines begin in the log

    @property
    def command_line(self) -> str:
        return shlex.join(redact_argv(self.argv))

    def exit_code(self) -> int | None:
        """The exit code of a process that has ended; None while it runs (or before any launch)."""
        return self.proc.poll() if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, command: Callable[[int], list[str]], ready: Callable[[], None]) -> None:
        """Launch ``command(port)`` and wait for ``ready`` (which raises when the process will never be
        ready); a failed launch is stopped, and made again on a fresh port when its port was taken."""
        for attempt in range(self.port_retries + 1):
            self.port = free_port(self.bind_host) if self.bind_host else 0
            self.launch(command(self.port))
            try:
                ready()
            except Exception:
                self.stop()
                if attempt < self.port_retries and not self.cancelled() and ADDRESS_IN_USE in tail(self.log_path, 30):
                    continue
                raise
            except BaseException:  # Ctrl-C, SIGTERM: nothing half-started stays behind
                self.stop()
                raise
            return

    def launch(self, argv: Sequence[str]) -> None:
        """Start ``argv`` (a previous launch is stopped first), its output appended to the log after a
        header line; a command that cannot be executed raises the launcher's error naming it."""
        self.stop()
        self.argv = list(argv)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.log_offset = log.tell()
            log.write(f"\n===== pytest-apc: {self.command_line}\n".encode())
            log.flush()
            # stdin only when it reads requests: process.spawn's default is no input.
            options = {} if self.stdin is None else {"stdin": self.stdin}
            try:
                self.proc = procs.spawn(self.argv, self.env, log, **options)
            except OSError as err:
                raise self.error(f"{self.name} could not be executed: {err}\ncommand: {self.command_line}") from err

    def wait_until(
        self,
        done: Callable[[], bool],
        *,
        timeout: float,
        interval: float,
        exited: Callable[[int], Exception],
        timed_out: Callable[[], Exception],
    ) -> None:
        """Poll ``done`` every ``interval`` seconds until it holds; raise ``exited(code)`` as soon as the
        process has ended, ``timed_out()`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done():
            code = self.exit_code()
            if code is not None:
                raise exited(code)
            if time.monotonic() > deadline:
                raise timed_out()
            time.sleep(interval)

    def failure(self, what: str, *, who: str = "", lines: int = 40) -> Exception:
        """The launcher's error for ``what`` happened to this process, with the command and the log's tail."""
        return self.error(describe(who or self.name, what, self.command_line, self.log_path, self.log_kind, lines))

    def stop(self) -> int | None:
        """Close its input, SIGTERM its group, SIGKILL after ``stop_timeout`` seconds (``process.stop``);
        then the ``after_stop`` hook. Returns the exit code; safe to call when nothing runs."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        code = procs.stop(proc, self.stop_timeout)
        self.after_stop()
        return code
