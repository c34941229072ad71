"""Child processes that never outlive pytest.

Every launched process (a server, vllm-router, the benchmark worker: each an ``executor.Executor``)
starts in a process group of its own, which holds vLLM's API server, EngineCore and tensor-parallel
workers. Each one is

* tagged with ``PYTEST_APC_OWNER`` in its environment, so a descendant that left the group can still be
  found (the mirakuru pattern);
* registered as a file ``<pgid>.pgid`` in a registry folder shared by the controller and every xdist
  worker (passed through ``workerinput``), so the controller can kill what a crashed or interrupted
  worker left behind.

The xdist workers register themselves too (``<pid>.pid``, with their start time): a controller killed
outright leaves them running a test or starting its server, and its guard must stop them with the servers.

Stopping is SIGTERM to the group, a grace period, then SIGKILL to the group and to every tagged
descendant. ``reap()`` does the SIGKILL part for everything registered or tagged; the plugin calls it
from ``pytest_unconfigure`` and at interpreter exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import psutil

OWNER_ENV = "PYTEST_APC_OWNER"


# Set by configure(): the controller creates both, xdist workers receive them through workerinput.
# Deliberately not exported to os.environ: a nested pytest (the plugin's own tests) must get its own.
_state: dict[str, str] = {}


def configure(tag: str | None = None, registry: str | None = None) -> tuple[str, str]:
    """Set this process's owner tag and registry folder (new ones unless given); return both."""
    tag = tag or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    registry = registry or tempfile.mkdtemp(prefix=f"pytest-apc-{tag}-")
    Path(registry).mkdir(parents=True, exist_ok=True)
    _state.update(tag=tag, registry=registry)
    return tag, registry


def owner_tag() -> str:
    """The tag of this pytest run."""
    if "tag" not in _state:
        configure()
    return _state["tag"]


def registry_dir() -> Path:
    """The registry folder of this pytest run."""
    if "registry" not in _state:
        configure()
    return Path(_state["registry"])


# A process group of its own, in pytest's session: Linux's scheduler autogroups (on by default) group CPU
# time by session, and a server in a session of its own, busy-polling on a shared core, kept the benchmark
# client from that core for tens of milliseconds at a time (vLLM's busy poll yields only within its own
# group). Python 3.10 has no process_group argument; there it keeps a session of its own.
_OWN_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


def spawn(
    argv: Sequence[str], env: dict[str, str], log: IO[bytes], stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own (in pytest's session), tagged and registered."""
    env = {**env, OWNER_ENV: owner_tag()}
    proc = subprocess.Popen(
        list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=stdin, env=env, **_OWN_GROUP,
    )  # fmt: skip
    (registry_dir() / f"{proc.pid}.pgid").write_text(" ".join(argv))
    return proc


def register_worker() -> None:
    """Register this process (an xdist worker) for ``reap``: killed with the servers when its controller
    is gone. Its start stamp tells it from a later process given the same pid."""
    (registry_dir() / f"{os.getpid()}.pid").write_text(start_stamp(os.getpid()))


def start_stamp(pid: int) -> str:
    """When process ``pid`` started, as a stamp that tells it from a later process given its pid: on Linux
    its start in clock ticks since boot. Not psutil's ``create_time``: that adds the boot time as the wall
    clock has it now, which moves by a whole second when the clock is adjusted, and a guard that saw its
    pytest "change" would kill the servers of a run still going. Raises ``psutil.Error`` when none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    except OSError:  # no procfs: the wall-clock time, the best there is
        return repr(psutil.Process(pid).create_time())
    return "ticks " + stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after "pid (comm)"


def running(pid: int, stamp: str) -> bool:
    """Whether the process ``pid`` whose :func:`start_stamp` was ``stamp`` still runs (not another one
    given its pid)."""
    try:
        return start_stamp(pid) == stamp and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(OWNER_ENV) == tag:
                found.append(proc)
    return found


def _alive(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group(pgid: int) -> list[psutil.Process]:
    """The processes of group ``pgid``: a leader that has exited leaves its children in it, no longer its
    descendants."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != pgid and os.getpgid(proc.pid) == pgid:
                found.append(proc)
    return found


def stop(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    """SIGTERM the group, wait ``grace`` seconds, SIGKILL group and descendants; return the exit code once
    they are gone (also when the leader had exited before)."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    descendants += [member for member in _group(proc.pid) if member not in descendants]
    _killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _alive(descendants):
            break
        time.sleep(0.2)
    _killpg(proc.pid, signal.SIGKILL)
    for child in _alive(descendants):
        with contextlib.suppress(psutil.Error):
            child.kill()
    try:
        code = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
        code = None
    psutil.wait_procs(_alive(descendants), timeout=10)
    with contextlib.suppress(FileNotFoundError):
        (registry_dir() / f"{proc.pid}.pgid").unlink()
    return code


def reap(tag: str | None = None) -> list[int]:
    """SIGKILL every registered group and worker and every process tagged with this run; return the pids
    killed."""
    killed: list[int] = []
    registry = _state.get("registry")
    if registry and Path(registry).is_dir():
        for entry in Path(registry).glob("*.pgid"):
            pgid = int(entry.stem)
            if psutil.pid_exists(pgid):
                _killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
            entry.unlink(missing_ok=True)
        for entry in Path(registry).glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(entry.stem)
                if pid != os.getpid() and running(pid, entry.read_text()):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            entry.unlink(missing_ok=True)
    tag = tag or _state.get("tag")
    if tag:
        for proc in _tagged(tag):
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.append(proc.pid)
    return killed


def leftovers(tag: str) -> list[psutil.Process]:
    """Live processes tagged with ``tag`` (for tests: must be empty after a run)."""
    return _alive(_tagged(tag))


NODE_LOCK = Path(tempfile.gettempdir()) / "pytest-apc-gpu-node.lock"


def acquire_node_lock(path: Path = NODE_LOCK) -> IO[str]:
    """Hold this node's GPUs for one pytest run: two runs would start two 70B servers on the same GPUs.

    Raises RuntimeError naming the run that holds the lock. The lock is released when the handle is
    closed, or by the kernel when the holder dies.
    """
    import fcntl

    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise RuntimeError(
            f"another pytest-apc run holds this node's GPUs ({holder}; lock {path}): wait for it to finish, "
            "or validate servers that run elsewhere with --apc-url-on/--apc-url-off and -m apc (nothing launched)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}, command {' '.join(sys.argv)}")
    handle.flush()
    return handle
