"""Per pair of runs in exactness.py's file: requests identical, near ties, differ, by the rule of pytest-apc's
``same_answers`` (vLLM's top-k rule: two answers that part where each one's token is among the other's
top-k are a near tie).

usage: compare.py RESULTS.json[.gz]          every pair of runs
       compare.py --groups RESULTS.json[.gz] the pairs grouped by the servers they compare (README.md)
"""

from __future__ import annotations

import gzip
import json
import sys
from itertools import combinations, product

from pytest_apc.measure.answers import Answer
from pytest_apc.verdicts import answers

OUTCOMES = (answers.IDENTICAL, answers.NEAR_TIE, answers.DIFFER)
# (what the group compares, its runs on one side, on the other); a run is SERVER/RUN, a server all its runs
GROUPS = [
    ("S: cached/uncached, c8/c1, with each other", "S", "S"),
    ("S2: the same, no chunked prefill", "S2", "S2"),
    ("O (APC off): c8 against c1", "O", "O"),
    ("S against S2", "S", "S2"),
    ("O against S2", "O", "S2"),
    ("O against S", "O", "S"),
    ("F under load (F8) against S", "F/F8", "S"),
    ("F alone (F1) against S", "F/F1", "S"),
]


def counts(a: list[dict], b: list[dict]) -> dict[str, int]:
    """Requests of two runs (in order) by outcome, by pytest-apc's own rule (``same_answers``)."""
    pairs = zip(a, b, strict=True)
    return answers.counts(
        [answers.compare(i, Answer.from_json(x), Answer.from_json(y)) for i, (x, y) in enumerate(pairs)]
    )


def load(path: str) -> dict[str, list[dict]]:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)["runs"]


def _members(runs: dict[str, list[dict]], side: str) -> list[str]:
    return [r for r in sorted(runs) if r == side or r.split("/")[0] == side]


def groups(runs: dict[str, list[dict]]) -> list[tuple[str, int, dict[str, tuple[int, int]]]]:
    """Each group: its pairs' count and, per outcome, the smallest and largest count over its pairs."""
    rows = []
    for what, left, right in GROUPS:
        mine, theirs = _members(runs, left), _members(runs, right)
        pairs = list(combinations(mine, 2) if left == right else product(mine, theirs))
        found = [counts(runs[a], runs[b]) for a, b in pairs]
        rows.append((what, len(pairs), {k: (min(c[k] for c in found), max(c[k] for c in found)) for k in found[0]}))
    return rows


def main() -> None:
    if sys.argv[1] == "--groups":
        runs = load(sys.argv[2])
        print(f"{len(next(iter(runs.values())))} requests per run")
        print(f"{'pairs of runs':<46} {'pairs':>5} {'identical':>10} {'near ties':>10} {'differ':>8}")
        for what, n, found in groups(runs):
            cells = ["-".join(str(v) for v in sorted(set(found[k]))) for k in OUTCOMES]
            print(f"{what:<46} {n:>5} {cells[0]:>10} {cells[1]:>10} {cells[2]:>8}")
        return
    runs = load(sys.argv[1])
    print("run A            run B            identical  near ties  differ   (of requests)")
    for a, b in combinations(sorted(runs), 2):
        c = counts(runs[a], runs[b])
        same, near, differ = (c[k] for k in OUTCOMES)
        print(f"{a:<16} {b:<16} {same:>9}  {near:>9}  {differ:>6}   ({len(runs[a])})")


if __name__ == "__main__":
    main()
