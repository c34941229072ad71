#!/usr/bin/env python3
"""A probe pinned to one core: every 50 ms it times, in its own thread's CPU time (preemption left out),
a fixed piece of work, and writes (monotonic time, ms) rows to OUT when stopped (SIGTERM). ``--memory``
times random reads over 64 MiB (bound by the memory system) and, in a third column, the same reads over
16 KiB (held in the core's own cache); without it, a pure-Python loop.

    python probe.py CORE OUT.json [--memory]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np


def main(argv: list[str]) -> int:
    core, out, memory = int(argv[0]), argv[1], "--memory" in argv
    os.sched_setaffinity(0, {core})
    rng = np.random.default_rng(0)
    big, small = np.arange(16 * 1024 * 1024, dtype=np.int32), np.arange(4096, dtype=np.int32)
    big_at, small_at = rng.integers(0, big.size, 200_000), rng.integers(0, small.size, 200_000)
    rows: list[tuple[float, ...]] = []

    def stop(*_: Any) -> None:
        with open(out, "w") as f:
            json.dump(rows, f)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        when, start = time.monotonic(), time.thread_time_ns()
        if memory:
            big.take(big_at).sum()
            middle = time.thread_time_ns()
            small.take(small_at).sum()
            end = time.thread_time_ns()
            rows.append((when, (middle - start) / 1e6, (end - middle) / 1e6))
        else:
            total = 0
            for i in range(20000):
                total += i * i
            rows.append((when, (time.thread_time_ns() - start) / 1e6))
        time.sleep(0.1 if memory else 0.05)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
