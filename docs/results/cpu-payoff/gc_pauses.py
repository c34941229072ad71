#!/usr/bin/env python3
"""The full garbage collections that gc_hook.py logged in the sessions after the benchmark froze its heap
(gc-pauses.txt: time, process id, duration, objects collected, the process's first arguments, paths
shortened): how long they took, per kind of process, and per session those that came while the session's
APC-on runs ran, beside that session's gains at concurrency 4 and 8.

    python gc_pauses.py
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

HERE = Path(__file__).parent
LONG_MS = 100  # a collection this long shows in a first token of some 20 to 100 ms
APC_ON_RUNS_S = 12  # a session's last seconds: its APC-on server's runs (the D sweep, then the probe)
BENCH = "pytest-apc's benchmark process (its own collection before each run included)"
SERVER = "vLLM's server processes (API server, engine core, model worker)"


def _events() -> list[tuple[float, str, int, str]]:
    """(time, process id, ms, kind) of every logged collection."""
    found = []
    for line in (HERE / "gc-pauses.txt").read_text().splitlines():
        when, pid, ms, _, command = line.split(" ", 4)
        kind = BENCH if "bench_worker" in command else SERVER if "api_server" in command or "--model" in command else ""
        found.append((float(when), pid, int(ms.removesuffix("ms")), kind))
    return sorted(found)


def rows() -> list[str]:
    events = _events()
    lines = [f"| process | full collections of {LONG_MS} ms or more | ms: min / median / max |", "|---|---|---|"]
    for kind in (SERVER, BENCH):
        found = sorted(ms for _, _, ms, k in events if k == kind and ms >= LONG_MS)
        lines.append(f"| {kind} | {len(found)} | {found[0]} / {median(found):.0f} / {found[-1]} |")
    # Each session has one benchmark process, started beside its first server: its first event starts it.
    starts = sorted({pid: when for when, pid, _, kind in reversed(events) if kind == BENCH}.values())
    records = json.loads((HERE / "frozen-client-sessions.json").read_text())
    lines += [
        "",
        f"| session | gain c4 | gain c8 | collections of {LONG_MS} ms or more in its last {APC_ON_RUNS_S} s "
        "(its APC-on runs) |",
        "|---|---|---|---|",
    ]
    for number, (start, record) in enumerate(zip(starts, records, strict=True), 1):
        end = starts[number] if number < len(starts) else events[-1][0] + 1
        last = max(when for when, _, _, _ in events if start <= when < end)
        late = [ms for when, _, ms, _ in events if last - APC_ON_RUNS_S < when <= last and ms >= LONG_MS]
        gains = {level["concurrency"]: level["ttft_speedup"] for level in record["levels"]}
        late_text = ", ".join(f"{ms} ms" for ms in late) or "-"
        lines.append(f"| {number} | {gains[4]:.2f}x | {gains[8]:.2f}x | {late_text} |")
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
