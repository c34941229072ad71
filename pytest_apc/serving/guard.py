"""The guard: what stops a run's servers when pytest itself is killed outright.

SIGKILL (a scheduler's kill after its grace period, ``timeout -s KILL``), a crash or the OOM killer end
pytest without its teardown, and the servers it started live in process groups of their own, so nothing
would stop them and the next run on the node would find its GPUs taken. The guard is a small process, in a
session of its own, started by the run's controller: it waits for that pytest process to end and then kills
what the run still has registered or tagged (``process.reap``). A run that ends normally reaps first, and
the guard with it (it carries the run's owner tag). The xdist workers are registered too: they would go
on running tests, and starting servers, after their controller is gone.

Run as ``python -m pytest_apc.serving.guard PID START_STAMP TAG REGISTRY``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence

from pytest_apc.serving import process as procs

POLL_S = 0.5  # how soon after pytest is gone its servers are killed
REAP_FOR_S = 30.0  # the longest the guard goes on killing what the run's processes still start
_started: list[subprocess.Popen[bytes]] = []  # kept: a Popen collected while its process runs warns


def start(tag: str, registry: str) -> subprocess.Popen[bytes]:
    """The guard of this process (the run's controller) and its run ``tag``/``registry``."""
    argv = [sys.executable, "-m", __name__, str(os.getpid()), procs.start_stamp(os.getpid()), tag, registry]
    guard = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, procs.OWNER_ENV: tag}, start_new_session=True,  # not in the group a Ctrl-C reaches
    )  # fmt: skip
    _started.append(guard)
    return guard


def main(argv: Sequence[str]) -> int:
    pid, stamp, tag, registry = int(argv[0]), argv[1], argv[2], argv[3]
    procs.configure(tag, registry)
    while procs.running(pid, stamp):
        time.sleep(POLL_S)
    # Again while a pass kills something: a worker may have been starting a server while the first ran.
    deadline = time.monotonic() + REAP_FOR_S
    while procs.reap(tag) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
