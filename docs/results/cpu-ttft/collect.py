#!/usr/bin/env python3
"""Collect drive.py's runs into runs.csv: one row per APC-on run, with its median TTFT (the requests after
the first batch, which computes the prefix), the CPU time of the API server and of the benchmark process
during the run, the hypervisor's steal ticks, and the median cost of the probes pinned to a core
(probe.py) while it ran.

    python collect.py SERIES=RUN_DIR [SERIES=RUN_DIR ...] > runs.csv

Each RUN_DIR holds drive.py's log (drive.log), its benchmark results (*.json) and the probes' files
(probe-core0.json, probe-core1.json, probe-memory.json), where they ran.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

FIELDS = [
    "series", "run", "concurrency", "median_ttft_ms", "api_cpu_ms", "client_cpu_ms", "steal_ticks",
    "probe_core0_ms", "probe_core1_ms", "memory_probe_ms", "cached_probe_ms",
]  # fmt: skip
LOG = re.compile(r"^(\S+) median \S+ max \S+ odd .* steal_ticks \[(\d+), (\d+)\] api_cpu_ms (\d+) client_cpu_ms (\d+)")


def _median(rows: list[list[float]], start: float, end: float, column: int) -> str:
    found = [row[column] for row in rows if start <= row[0] <= end]
    return f"{statistics.median(found):.2f}" if found else ""


def main(argv: list[str]) -> int:
    out = csv.DictWriter(sys.stdout, FIELDS)
    out.writeheader()
    for arg in argv:
        series, folder = arg.split("=", 1)
        run_dir = Path(folder)
        probes = {
            name: json.loads((run_dir / f"{name}.json").read_text()) if (run_dir / f"{name}.json").exists() else []
            for name in ("probe-core0", "probe-core1", "probe-memory")
        }
        for line in (run_dir / "drive.log").read_text().splitlines():
            match = LOG.match(line)
            if not match or "-D-" not in match.group(1):
                continue
            name = match.group(1)
            result = json.loads((run_dir / f"{name}.json").read_text())
            level = int(re.search(r"-c(\d+)", name).group(1))  # type: ignore[union-attr]
            start = min(result["start_times"])
            end = max(s + lat for s, lat in zip(result["start_times"], result["latencies"], strict=True))
            out.writerow({
                "series": series, "run": name, "concurrency": level,
                "median_ttft_ms": f"{statistics.median(result['ttfts'][level:]) * 1000:.1f}",
                "api_cpu_ms": match.group(4), "client_cpu_ms": match.group(5),
                "steal_ticks": int(match.group(2)) + int(match.group(3)),
                "probe_core0_ms": _median(probes["probe-core0"], start, end, 1),
                "probe_core1_ms": _median(probes["probe-core1"], start, end, 1),
                "memory_probe_ms": _median(probes["probe-memory"], start, end, 1),
                "cached_probe_ms": _median(probes["probe-memory"], start, end, 2),
            })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
