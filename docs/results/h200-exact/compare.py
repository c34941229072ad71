"""Per pair of runs in exactness.py's file: requests identical, near ties, differ (vLLM's top-k rule).

usage: compare.py RESULTS.json
"""

from __future__ import annotations

import json
import sys
from itertools import combinations


def outcome(a: dict, b: dict) -> str:
    for position, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=False)):
        if x != y:
            top_a = {t for t, _ in a["top"][position]}
            top_b = {t for t, _ in b["top"][position]}
            return "near" if y in top_a and x in top_b else "differ"
    return "same"


def counts(a: list[dict], b: list[dict]) -> dict[str, int]:
    found = [outcome(x, y) for x, y in zip(a, b, strict=True)]
    return {k: found.count(k) for k in ("same", "near", "differ")}


def main() -> None:
    with open(sys.argv[1]) as f:
        runs = json.load(f)["runs"]
    print("run A            run B            identical  near ties  differ   (of requests)")
    for a, b in combinations(sorted(runs), 2):
        c = counts(runs[a], runs[b])
        print(f"{a:<16} {b:<16} {c['same']:>9}  {c['near']:>9}  {c['differ']:>6}   ({len(runs[a])})")


if __name__ == "__main__":
    main()
