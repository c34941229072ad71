#!/usr/bin/env python3
"""The page's tables. Of runs.csv: per series of concurrency-1 D runs, the spread of their median TTFT, of
the API server's and the benchmark's CPU time per run, how closely the API server's CPU time follows the
median TTFT (Pearson's r), the hypervisor's steal and the probes' cost while they ran. Of sessions.csv: per
way of starting the servers and level, the spread of the D runs' median TTFT, the runs with late requests,
and, in the sessions whose trace was kept, how long the benchmark client waited for a core.

    python summary.py
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
BEFORE = {  # what the APC-on server did before each run of a series
    "back-to-back": "1 s idle",
    "with-memory-probe": "3 s idle",
    "idle-or-after-off": "6 s idle, or a C run on the APC-off server",
    "sweep": "a C run on the APC-off server, levels 1, 4, 8 in turn",
}


def _span(values: list[float], digits: int = 1) -> str:
    return f"{min(values):.{digits}f} / {float(np.median(values)):.{digits}f} / {max(values):.{digits}f}"


def rows() -> list[str]:
    runs = list(csv.DictReader((HERE / "runs.csv").open()))
    lines = [
        "| series | before each run | runs | median TTFT (ms): min / median / max | API server CPU (ms) "
        "| benchmark CPU (ms) | r(TTFT, API CPU) | steal ticks, most | core-1 probe (ms) | memory probe (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for series, before in BEFORE.items():
        picked = [r for r in runs if r["series"] == series and r["concurrency"] == "1"]
        ttft = [float(r["median_ttft_ms"]) for r in picked]
        api = [float(r["api_cpu_ms"]) for r in picked]
        client = [float(r["client_cpu_ms"]) for r in picked]
        r = np.corrcoef(ttft, api)[0, 1]
        probe = [float(x["probe_core1_ms"]) for x in picked if x["probe_core1_ms"]]
        memory = [float(x["memory_probe_ms"]) for x in picked if x["memory_probe_ms"]]
        lines.append(
            f"| {series} | {before} | {len(picked)} | {_span(ttft)} | {_span(api, 0)} | {_span(client, 0)} | {r:.2f} "
            f"| {max(int(x['steal_ticks']) for x in picked)} | {_span(probe, 2) if probe else '-'} "
            f"| {_span(memory, 2) if memory else '-'} |"
        )
    return lines


SLOW = 1.5
SERIES = {  # how pytest-apc started the servers and the benchmark worker in a series of sessions
    "own-session": "each in a session of its own",
    "own-group": "each in a process group of its own, in pytest's session",
}


def session_rows() -> list[str]:
    runs = list(csv.DictReader((HERE / "sessions.csv").open()))
    lines = [
        "| servers and benchmark started | sessions | level | D median TTFT (ms): min / median / max "
        "| runs with late requests | slow runs | traced runs: client waiting for a core (ms), min / max |",
        "|---|---|---|---|---|---|---|",
    ]
    # A slow run: its median TTFT 1.5x or more that of the level's usual run (the median over the sessions
    # that start the servers as pytest-apc does now).
    now = [r for r in runs if r["series"] == "own-group"]
    usual = {
        run: statistics.median(float(r["median_ttft_ms"]) for r in now if r["run"] == run)
        for run in {r["run"] for r in now}
    }
    for series, started in SERIES.items():
        picked = [r for r in runs if r["series"] == series]
        sessions = len({r["session"] for r in picked})
        for run in sorted({r["run"] for r in picked}, key=lambda name: int(name.split("-c")[1])):
            level = [r for r in picked if r["run"] == run]
            ttft = [float(r["median_ttft_ms"]) for r in level]
            late = sum(1 for r in level if int(r["late_requests"]) > 0)
            slow = sum(1 for t in ttft if t >= SLOW * usual[run])
            waited = [float(r["client_waiting_ms"]) for r in level if r["client_waiting_ms"]]
            spread = f"{min(waited):.0f} / {max(waited):.0f} ({len(waited)} runs)" if waited else "-"
            lines.append(f"| {started} | {sessions} | {run} | {_span(ttft)} | {late} | {slow} | {spread} |")
    lines += ["", "| servers and benchmark started | sessions | sessions with a late or slow D run |", "|---|---|---|"]
    for series, started in SERIES.items():
        picked = [r for r in runs if r["series"] == series]
        hit = {
            r["session"]
            for r in picked
            if int(r["late_requests"]) > 0 or float(r["median_ttft_ms"]) >= SLOW * usual[r["run"]]
        }
        lines.append(f"| {started} | {len({r['session'] for r in picked})} | {len(hit)} |")
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
    print()
    print("\n".join(session_rows()))
