#!/usr/bin/env python3
"""What the main job on the embedded CPU default costs: a benchmark, not a test.

Runs the main job's pytest session (``pytest -m apc --cpu-node``, as ``scripts/apc-cpu.sh`` runs it after the
install) in fresh folders, one session after another, and records from each session's results.json where its
time went: the two server start-ups, the rest of the servers' lifecycle (stopping them), the benchmarks'
own durations, the time between benchmarks (cache reset, idle scrapes, the benchmark worker's set-up, the
answers probe and salted runs where there are any) and the harness (collection, verdicts, reports), with the
suite's overhead ratio (its time over server lifecycle plus benchmark time).

    python scripts/main_job_timing.py [--sessions N] [--json OUT]
    python scripts/main_job_timing.py --table OUT.json   # the Markdown table of recorded sessions
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest", "-m", "apc", "--cpu-node", "-p", "no:cacheprovider"]


def session(work: Path) -> dict[str, Any]:
    """One main-job session in ``work``: its time accounting, from its results file and pytest's last line."""
    done = subprocess.run(
        [*COMMAND, f"--apc-results-dir={work}/apc-results"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    files = sorted(work.glob("apc-results/*/results.json"))
    if not files:
        return {"error": f"no results.json (exit {done.returncode})", "tail": done.stdout[-2000:]}
    data = json.loads(files[0].read_text())
    timing = data["timing"]
    summary = re.findall(r"(\d+) (passed|failed|skipped)", done.stdout.splitlines()[-1] if done.stdout else "")
    runs = data["runs"]
    return {
        "exit": done.returncode,
        "outcome": {what: int(n) for n, what in summary},
        "runs": len(runs),
        "suite_s": timing["suite_elapsed_s"],
        "startups_s": round(sum(s["startup_s"] for s in data["servers"]), 1),
        "server_lifecycle_s": timing["server_lifecycle_s"],
        "bench_s": timing["bench_duration_s"],
        "between_runs_s": round(timing["measurements_wall_s"] - timing["bench_duration_s"], 1),
        "harness_s": timing["harness_overhead_s"],
        "overhead_ratio": timing["overhead_ratio"],
        "commit": data["environment"].get("git_commit"),
    }


COLUMNS = [  # key, heading
    ("suite_s", "session (s)"),
    ("startups_s", "server start-ups (s)"),
    ("server_lifecycle_s", "server lifecycle (s)"),
    ("bench_s", "benchmarks (s)"),
    ("between_runs_s", "between benchmarks (s)"),
    ("harness_s", "harness (s)"),
    ("overhead_ratio", "overhead ratio"),
]


def _cells(values: dict[str, float]) -> str:
    """The columns' values as table cells: the ratio to three decimals, seconds to one."""
    return " | ".join(f"{values[k]:.3f}" if k == "overhead_ratio" else f"{values[k]:.1f}" for k, _ in COLUMNS)


def table(records: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per session, then the median of each column."""
    import numpy as np

    good = [r for r in records if "error" not in r]
    rows = [
        "| session | runs | outcome | " + " | ".join(h for _, h in COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for number, r in enumerate(good, 1):
        outcome = ", ".join(f"{n} {what}" for what, n in r["outcome"].items())
        rows.append(f"| {number} | {r['runs']} | {outcome} | {_cells(r)} |")
    medians = {k: float(np.median([r[k] for r in good])) for k, _ in COLUMNS}
    rows.append(f"| median | | | {_cells(medians)} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every session's record here")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of these recorded files")
    args = parser.parse_args()
    if args.table:
        print("\n".join(table([r for path in args.table for r in json.loads(path.read_text())])))
        return 0
    records = []
    for number in range(args.sessions):
        with tempfile.TemporaryDirectory(prefix="apc-main-job-") as work:
            records.append(session(Path(work)))
        print(f"session {number + 1}: {json.dumps(records[-1])}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(records, indent=1) + "\n")
    print("\n".join(table(records)))
    return 0 if all("error" not in r and r["exit"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
