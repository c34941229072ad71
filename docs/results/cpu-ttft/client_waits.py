#!/usr/bin/env python3
"""Per D run of recorded pytest sessions: its median TTFT, its late requests (past the first batch, over
3x the median and over 100 ms), and, where the session's scheduler trace was kept, how long the benchmark
client was runnable but not running (preempted, waiting for a core) while the run lasted.

    python client_waits.py SERIES=SESSION_DIR [SERIES=SESSION_DIR ...] > sessions.csv

A SESSION_DIR holds the session's results folder (apc-results/*/bench/D-c*.json, the benchmark's detailed
results), ps.txt (``ps -eLo pid,tid,psr,comm,args`` every 5 s: it names the benchmark worker's process) and,
where kept, trace.txt (ftrace's sched_switch events on the monotonic clock, the benchmark's own clock).
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

from breakdown import Switch, switches  # the one parser of the trace (this folder)

FIELDS = [
    "series", "session", "run", "median_ttft_ms", "late_requests", "client_on_core_ms",
    "client_waiting_ms", "client_longest_wait_ms",
]  # fmt: skip


def client_pid(session: Path) -> str:
    """The benchmark worker's process id (its main thread runs the benchmark's event loop)."""
    for line in (session / "ps.txt").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[0] == fields[1] and "bench_worker" in line:
            return fields[0]
    return ""


def waits(events: list[Switch], client: str, start: float, end: float) -> list[float]:
    """[seconds on a core, then each wait from being preempted to running again] of ``client``."""
    on_core, found, preempted, since = 0.0, [], None, None
    for when, _, prev, state, following in events:
        if when < start or when > end:
            continue
        if prev == client:
            on_core += when - since if since is not None else 0.0
            since, preempted = None, when if state == "R" else None
        if following == client:
            since = when
            if preempted is not None:
                found.append(when - preempted)
                preempted = None
    return [on_core, *found]


def main(argv: list[str]) -> int:
    out = csv.DictWriter(sys.stdout, FIELDS)
    out.writeheader()
    for arg in argv:
        series, folder = arg.split("=", 1)
        session = Path(folder)
        trace = session / "trace.txt"
        events = switches(trace) if trace.exists() else []
        client = client_pid(session)
        for path in sorted(session.glob("apc-results/*/bench/D-c*.json")):
            if not re.fullmatch(r"D-c\d+\.json", path.name):
                continue
            result = json.loads(path.read_text())
            level = int(path.stem.split("-c")[1])
            ttfts = [1000 * t for t in result["ttfts"]]
            median = statistics.median(ttfts[level:])
            late = sum(1 for t in ttfts[level:] if t > max(100.0, 3 * median))
            start = min(result["start_times"])
            end = max(s + lat for s, lat in zip(result["start_times"], result["latencies"], strict=True))
            row = {"series": series, "session": session.name, "run": path.stem, "median_ttft_ms": f"{median:.1f}",
                   "late_requests": late}  # fmt: skip
            if events and events[0][0] <= start:
                on_core, *waited = waits(events, client, start, end)
                row.update(client_on_core_ms=f"{1000 * on_core:.1f}", client_waiting_ms=f"{1000 * sum(waited):.1f}",
                           client_longest_wait_ms=f"{1000 * max(waited, default=0.0):.1f}")  # fmt: skip
            out.writerow(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
