#!/usr/bin/env python3
"""How often the pure payoff verdict fails a healthy CPU server, and whether it fails one whose cache hits
but saves no prefill time: a benchmark, not a test (run from a checkout, on real vLLM's CPU build).

Each session is a pytest run of its own with fresh server starts: the C/D sweep (`-m sweep -k
test_pure_apc`, cases C and D at every level of sweep_concurrency) on the CPU profile, on a server that is
healthy or carries the test fault ``slow-hit`` (tests/vllm_fault.py: every hit served and counted right,
but as slow as computing its tokens). Per session and level it records the pure payoff's verdict and its
numbers (the median-TTFT gain, its interval, the bounds), so that a threshold can be judged against every
recorded session.

    python scripts/payoff_power.py [--sessions N] [--shapes none,slow-hit] [--json OUT] [-- PYTEST ARGS]
    python scripts/payoff_power.py --table OUT.json [OUT.json ...]   # the Markdown table of recorded sessions

A false alarm is a healthy session with a failed payoff verdict at a level where the gain is required.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fault_sessions import fault_env, pytest_session, record_sessions  # noqa: E402
from tests.vllm_fault import seconds_per_hit_token  # noqa: E402

SELECTION = ["-m", "sweep", "-k", "test_pure_apc", "--apc-set", "sweep_cases=CD"]
PAYOFF = ("ttft_gain", "not_slower")  # what pure_effect returns: the gain where required, else not slower


def session(shape: str, work: Path, extra: list[str]) -> dict[str, Any]:
    """One pytest session against fresh servers, ``shape`` the fault ("none": healthy)."""
    env = fault_env(work, shape)
    started = time.monotonic()
    done, data = pytest_session(work, env, [*SELECTION, *extra])
    if data is None:
        return {"shape": shape, "error": f"no results.json (exit {done.returncode})", "tail": done.stdout[-2000:]}
    levels = []
    for verdict in data["verdicts"]:
        if verdict["name"] not in PAYOFF:
            continue
        n = verdict["numbers"]
        saved = next(
            (v["passed"] for v in data["verdicts"] if v["name"] == "prefill_saved" and v["runs"] == verdict["runs"]),
            None,
        )
        levels.append({
            "runs": verdict["runs"],
            "concurrency": int(verdict["runs"][-1].rsplit("-c", 1)[1]),
            "verdict": verdict["name"],
            "passed": verdict["passed"],
            "prefill_saved": saved,
            **{k: n.get(k) for k in ("median_ttft_off_ms", "median_ttft_on_ms", "ttft_speedup", "ttft_speedup_low",
                                     "ttft_speedup_high", "prefill_bound", "modelled_ttft_bound")},
        })  # fmt: skip
    return {
        "shape": shape,
        **({"hit_us": seconds_per_hit_token(env) * 1e6} if shape == "slow-hit" else {}),
        "exit": done.returncode,
        "levels": sorted(levels, key=lambda r: r["concurrency"]),
        "settings": {k: data["settings"].get(k) for k in ("pure_gain_concurrency", "min_bound_fraction", "confidence")},
        "timing": data.get("timing"),
        "wall_s": round(time.monotonic() - started, 1),
    }


def table(records: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per server and level: sessions, what the pair was held to (the gain it needed: a
    significant one at least ``min_bound_fraction`` of the way to the bound), how many sessions failed it,
    the gain's spread over sessions and the lowest low end of its interval."""
    rows = [
        "| server | concurrency | sessions | held to | failed | gain min / median / max | lowest CI low |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape in dict.fromkeys(r["shape"] for r in records):
        mine = [r for r in records if r["shape"] == shape and "error" not in r]
        server = "healthy" if shape == "none" else f"`{shape}`"
        for level in sorted({lv["concurrency"] for r in mine for lv in r["levels"]}):
            found = [(r, lv) for r in mine for lv in r["levels"] if lv["concurrency"] == level]
            gains = np.array([lv["ttft_speedup"] for _, lv in found], dtype=float)
            held = " / ".join(sorted({_held_to(r, lv) for r, lv in found}))
            failed = sum(not lv["passed"] for _, lv in found)
            low = min(lv["ttft_speedup_low"] for _, lv in found)
            spread = f"{gains.min():.2f} / {np.median(gains):.2f} / {gains.max():.2f}"
            cells = [server, level, len(found), held, failed, spread, f"{low:.2f}"]
            rows.append("| " + " | ".join(map(str, cells)) + " |")
    return rows


def _held_to(record: dict[str, Any], level: dict[str, Any]) -> str:
    """A significant gain of at least 1 + fraction x (bound - 1), or not slower."""
    if level["verdict"] != "ttft_gain":
        return "not slower"
    bound = level["modelled_ttft_bound"] or level["prefill_bound"]
    fraction = record["settings"]["min_bound_fraction"] or 0
    return f"gain >= {1 + fraction * (bound - 1):.2f}x" if bound and fraction else "significant gain"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per shape (default 5)")
    parser.add_argument("--shapes", default="none,slow-hit", help="comma-separated fault shapes (none: healthy)")
    parser.add_argument("--json", type=Path, help="write every session's record here (after each session)")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of these recorded files instead")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args()
    if args.table:
        print("\n".join(table([r for path in args.table for r in json.loads(path.read_text())])))
        return 0
    records = record_sessions(
        lambda shape, work: session(shape, work, args.pytest_args), args.sessions, args.shapes.split(","), args.json
    )
    print("\n".join(table(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
