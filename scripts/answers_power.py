#!/usr/bin/env python3
"""How often the answers verdict catches a wrong cache, and how often it fails a healthy one: a benchmark,
not a test (run from a checkout, on real vLLM's CPU build).

Each session is a pytest run of its own with fresh server starts, `-m "pure and not sweep"` (or rag) without
the timing test, on a server that is healthy or carries a test fault (tests/vllm_fault.py): ``shift`` corrupts
every cache hit, ``shift-under-load`` only hits made while another request holds blocks. Per session it
records whether same_answers passed, the answers cell, and how many requests were compared and identical.

    python scripts/answers_power.py [--sessions N] [--shapes none,shift,shift-under-load] [--json OUT]
        [--node="--gpu-node --apc-model-shape llama-3.1-8b"] [--set NAME=VALUE ...] [--marker rag] [--keep DIR]
    python scripts/answers_power.py --table OUT.json [OUT.json ...]   # the Markdown table of recorded sessions
    python scripts/answers_power.py --logprob-table OUT.json [...]    # ... of sessions judged on logprobs

Detection is the share of faulted sessions that fail same_answers; false alarms the share of healthy
sessions that fail it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fault_sessions import fault_env, pytest_session, record_sessions  # noqa: E402


def selection(marker: str) -> list[str]:
    """The marker's cases without the sweep and without the timing test (``pure``: C/D, ``rag``: E/F)."""
    return ["-m", f"{marker} and not sweep", "-k", f"not test_{marker}_apc"]


def session(
    shape: str,
    work: Path,
    node: list[str] | None = None,
    settings: tuple[str, ...] = (),
    marker: str = "pure",
    keep: Path | None = None,
) -> dict[str, Any]:
    """One pytest session against fresh servers, ``shape`` the fault ("none": healthy); ``node``: the
    profile's arguments (default: the CPU profile, the checkout's suite); ``settings``: ``--apc-set`` values;
    ``keep``: a folder that receives the session's results.json and pytest output."""
    env = fault_env(work, shape)
    started = time.monotonic()
    done, data = pytest_session(
        work, env, [*selection(marker), *(f"--apc-set={s}" for s in settings)], timeout=1800, node=node
    )
    if keep:
        kept = keep / f"{marker}-{shape}-{time.strftime('%H%M%S')}"
        while kept.exists():  # another stream's session ended within the same second
            kept = kept.with_name(kept.name + "b")
        kept.mkdir(parents=True)
        (kept / "pytest.log").write_text(done.stdout + done.stderr)
        for results in work.glob("apc-results/*/results.json"):
            (kept / "results.json").write_text(results.read_text())
        for store in work.glob("apc-results/*/store.json"):  # every request's answers, where they were kept
            (kept / "store.json").write_text(store.read_text())
    if data is None:
        return {"shape": shape, "error": f"no results.json (exit {done.returncode})", "tail": done.stdout[-2000:]}
    answers = next((v for v in data["verdicts"] if v["name"] == "same_answers"), None)
    if answers is None:
        return {"shape": shape, "error": "no same_answers verdict", "tail": done.stdout[-2000:]}
    requests = answers["numbers"].get("requests") or []
    return {
        "shape": shape,
        "marker": marker,
        "exit": done.returncode,
        "same_answers_passed": answers["passed"],
        "answers": answers["numbers"].get("answers"),
        "exact": answers["numbers"].get("exact"),
        "requests_compared": len(requests),
        "requests_identical": sum(r["identical"] for r in requests),
        # The per-request rule's inputs, where the requests kept their logprobs: outcome, gap and drift (nats).
        "by_logprobs": [
            [r["tokens"]["outcome"], r["tokens"]["gap_nats"], r["drift_nats"]] for r in requests if r.get("tokens")
        ],
        "probe": answers["numbers"].get("cached_vs_uncached"),
        "reference": answers["numbers"].get("reference"),
        "salted_hits": [
            run["answers"]["salted"]["prefix_cache_hits"]
            for run in data["runs"]
            if (run.get("answers") or {}).get("salted")
        ],
        "wall_s": round(time.monotonic() - started, 1),
    }


MARKERS = {"pure": "cases C/D", "rag": "cases E/F"}  # the suite's markers a session may select
SHAPES = {
    "none": "healthy",
    "shift-under-load": "hits wrong only while another request holds blocks",
    "shift": "every hit wrong",
}


def _groups(records: list[dict[str, Any]]) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """The recorded sessions with a verdict, per fault shape and marker: (the row's name, the shape, its
    sessions); the marker is named where it is not pure."""
    for (shape, what), (marker, cases) in itertools.product(SHAPES.items(), MARKERS.items()):
        mine = [r for r in records if r["shape"] == shape and r.get("marker", "pure") == marker and "error" not in r]
        if mine:
            yield (what if marker == "pure" else f"{what}, {cases}"), shape, mine


def table(records: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per fault shape (and marker, where not pure): sessions, how many failed same_answers,
    and over their requests and probes how many answers were identical to the reference."""
    rows = [
        "| server | sessions | same_answers failed | requests identical to their reference | probes identical |",
        "|---|---|---|---|---|",
    ]
    for what, shape, mine in _groups(records):
        failed = sum(not r["same_answers_passed"] for r in mine)
        identical = sum(r["requests_identical"] for r in mine)
        compared = sum(r["requests_compared"] for r in mine)
        probes = sum(r["probe"]["identical"] for r in mine)
        probed = sum(sum(r["probe"].values()) for r in mine)
        rows.append(f"| {what} (`{shape}`) | {len(mine)} | {failed} | {identical}/{compared} | {probes}/{probed} |")
    return rows


def logprob_table(records: list[dict[str, Any]]) -> list[str]:
    """Sessions whose requests were judged on their logprobs: one Markdown row per fault shape (and marker,
    where not pure) with the sessions, how many failed same_answers, and every request's tokens against its
    reference (the same, a near tie, or parting outside each other's top-k)."""
    rows = [
        "| server | sessions | same_answers failed | requests: same tokens / near tie / differ |",
        "|---|---|---|---|",
    ]
    for what, shape, mine in _groups(records):
        failed = sum(not r["same_answers_passed"] for r in mine)
        found = [outcome for r in mine for outcome, _, _ in r["by_logprobs"]]
        tally = " / ".join(str(found.count(o)) for o in ("identical", "near tie", "differ"))
        rows.append(f"| {what} (`{shape}`) | {len(mine)} | {failed} | {tally} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per shape (default 5)")
    parser.add_argument("--shapes", default="none,shift-under-load,shift", help="comma-separated fault shapes")
    parser.add_argument("--json", type=Path, help="write every session's record here")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of these recorded files instead")
    parser.add_argument("--logprob-table", type=Path, nargs="+", help="... of sessions judged on their logprobs")
    parser.add_argument("--node", help="the profile's arguments (default: --cpu-node, the checkout's suite)")
    parser.add_argument("--set", action="append", default=[], help="an --apc-set NAME=VALUE for every session")
    parser.add_argument("--marker", default="pure", choices=MARKERS, help="the cases: pure (C/D), rag (E/F)")
    parser.add_argument("--keep", type=Path, help="keep each session's results.json and pytest output here")
    args = parser.parse_args()
    if args.table or args.logprob_table:
        printed = table if args.table else logprob_table
        paths = args.table or args.logprob_table
        print("\n".join(printed([r for path in paths for r in json.loads(path.read_text())])))
        return 0
    node = shlex.split(args.node) if args.node else None
    shapes = args.shapes.split(",")
    records = record_sessions(
        lambda shape, work: session(shape, work, node, tuple(args.set), args.marker, args.keep),
        args.sessions,
        shapes,
        args.json,
    )
    for shape in shapes:
        mine = [r for r in records if r["shape"] == shape]
        failed = sum(r.get("same_answers_passed") is False for r in mine)
        errors = sum("error" in r for r in mine)
        what = "false alarms" if shape == "none" else "detected"
        print(f"{shape}: {what} {failed}/{len(mine) - errors} sessions ({errors} without a verdict)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
