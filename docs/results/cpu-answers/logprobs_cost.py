#!/usr/bin/env python3
"""What keeping every request's top-k logprobs costs the timed runs on the CPU build in bfloat16: per session
(a pytest session with fresh servers, `answers_logprobs` on or off), each run's mean and median TTFT as its
results.json holds them, collected into logprobs-ttft.csv; then the median over sessions of each.

    python logprobs_cost.py --collect on KEPT_DIR... --collect off KEPT_DIR... > logprobs-ttft.csv
    python logprobs_cost.py                     # the table of logprobs-ttft.csv
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FIELDS = ["session", "logprobs", "run", "mean_ttft_ms", "median_ttft_ms", "duration_s"]


def collect(argv: list[str]) -> None:
    writer = csv.DictWriter(sys.stdout, FIELDS, lineterminator="\n")
    writer.writeheader()
    logprobs = ""
    for arg in argv:
        if arg == "--collect":
            continue
        if arg in ("on", "off"):
            logprobs = arg
            continue
        data = json.loads((Path(arg) / "results.json").read_text())
        for run in data["runs"]:
            ttft = {f"{s}_ttft_ms": f"{run[f'{s}_ttft_ms']:.2f}" for s in ("mean", "median")}
            row = {"session": Path(arg).name, "logprobs": logprobs, "run": run["id"], **ttft}
            writer.writerow({**row, "duration_s": f"{run['bench_duration_s']:.3f}"})


def rows(path: Path = HERE / "logprobs-ttft.csv") -> list[str]:
    """Per run and logprobs on/off: sessions, and the median over sessions of the mean TTFT, the median TTFT
    and the benchmark's duration, with the lowest and highest session's median TTFT."""
    with path.open() as f:
        found = list(csv.DictReader(f))
    lines = ["run   logprobs  sessions  mean TTFT ms  median TTFT ms  (lowest-highest)  duration s"]
    for run in sorted({r["run"] for r in found}):
        for logprobs in ("off", "on"):
            mine = [r for r in found if r["run"] == run and r["logprobs"] == logprobs]
            if not mine:
                continue
            mean, median, duration = (np.array([float(r[k]) for r in mine]) for k in FIELDS[3:])
            lines.append(
                f"{run:<5} {logprobs:<9} {len(mine):>8}  {np.median(mean):>12.1f}  {np.median(median):>14.1f}  "
                f"({median.min():.1f}-{median.max():.1f}){'':>4}  {np.median(duration):>10.2f}"
            )
    return lines


if __name__ == "__main__":
    if "--collect" in sys.argv:
        collect(sys.argv[1:])
    else:
        print("\n".join(rows()))
