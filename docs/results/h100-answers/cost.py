#!/usr/bin/env python3
"""What the answers work cost in the sessions of this page (or of the results page FOLDER): per session (one
results.json each), the two servers' start-up, the APC-off run, the APC-on run and its salted reference, and
the whole session.

    python cost.py [FOLDER] > FOLDER/cost.txt
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def rows(folder: Path = HERE) -> list[str]:
    lines = [
        "session                        start-up off/on s  APC-off run s  APC-on run s  its salted run s  session s",
    ]
    for path in sorted(folder.glob("*results-*.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()))
        startup = {s["mode"]: s["startup_s"] for s in data["servers"]}
        off = next(r for r in data["runs"] if not r["apc"])
        on = next(r for r in data["runs"] if r["apc"])
        name = path.name.removesuffix(".json.gz").replace("results-", "")
        lines.append(
            f"{name:<30} {startup['apc-off']:>6.0f} / {startup['apc-on']:<6.0f}   "
            f"{off['id']} {off['bench_duration_s']:>6.1f}   {on['id']} {on['bench_duration_s']:>5.1f}   "
            f"{on['answers']['salted']['duration_s']:>15.1f}   {data['timing']['suite_elapsed_s']:>8.0f}"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)))
