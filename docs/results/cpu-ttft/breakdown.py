#!/usr/bin/env python3
"""Where a first token's time goes on the 2-core machine: from a kernel scheduler trace (ftrace's
sched_switch events, clock "mono", so that its times are the benchmark's perf_counter times) and the
benchmark's detailed result of the same run, each thread's time on a core inside every request's TTFT
window (the first request, which computes the prefix, left out), averaged over the requests.

    python breakdown.py RESULT.json TRACE PID=ROLE [PID=ROLE ...]

PID is a thread id as the trace names it (``ps -eLo pid,tid,comm`` while the servers run); threads not
named are summed as "other", the idle task as "idle".
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

SWITCH = re.compile(
    r"\[(\d+)\]\s+\S+\s+([\d.]+): sched_switch: .* prev_pid=(\d+) .*prev_state=(\S+) ==> .* next_pid=(\d+)"
)


class Switch(NamedTuple):
    time: float
    core: int
    prev: str  # the thread that left the core
    state: str  # its state: R (preempted, still runnable), S (sleeping), ...
    next: str  # the thread now running


def switches(trace: Path) -> list[Switch]:
    """Every context switch of an ftrace text trace (``client_waits.py`` reads the same)."""
    found = []
    for line in trace.read_text(errors="replace").splitlines():
        match = SWITCH.search(line)
        if match:
            core, when, prev, state, following = match.groups()
            found.append(Switch(float(when), int(core), prev, state, following))
    return found


def on_core(events: list[Switch], start: float, end: float) -> Counter[str]:
    """Seconds each thread ran inside [start, end], over both cores."""
    ran: Counter[str] = Counter()
    last: dict[int, tuple[float, str]] = {}
    for when, core, _, _, running in events:
        if core in last:
            since, thread = last[core]
            overlap = min(when, end) - max(since, start)
            if overlap > 0:
                ran[thread] += overlap
        last[core] = (when, running)
        if when > end:
            break
    return ran


def main(argv: list[str]) -> int:
    result = json.loads(Path(argv[0]).read_text())
    events = switches(Path(argv[1]))
    roles = dict(arg.split("=", 1) for arg in argv[2:])
    roles["0"] = "idle"
    per_role: dict[str, list[float]] = {role: [] for role in [*dict.fromkeys(roles.values()), "other"]}
    for start, ttft in list(zip(result["start_times"], result["ttfts"], strict=True))[1:]:
        ran = on_core(events, start, start + ttft)
        for role in per_role:
            per_role[role].append(1000 * sum(s for t, s in ran.items() if roles.get(t, "other") == role))
    ttfts = [1000 * t for t in result["ttfts"][1:]]
    cells = " ".join(f"{role} {statistics.mean(ms):.1f}" for role, ms in per_role.items())
    print(f"{Path(argv[0]).stem}: TTFT mean {statistics.mean(ttfts):.1f} ms; on a core per request (ms): {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
