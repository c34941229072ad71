#!/usr/bin/env python3
"""Where the APC-on run's answers part from their references, judged by the rule as it ships.

The run folder's store (the records with every request's tokens and top-5 logprobs) is 24 MB, too large
for the repository; ``--extract`` keeps what the rule saw of it in ``parting.json``: for each repeat of
D-c8, each request's outcome against the salted reference (same tokens, near tie or differ, where the two
first part) and against the APC-off twin (C-c8's request), and, for a request that differs, both answers'
top-5 logprobs at the token where they part.

    python parting.py --extract STORE.json   # writes parting.json (run once, on the run folder's store)
    python parting.py                        # the tables of the page, from parting.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2]))  # the checkout, for the rule itself

from pytest_apc.verdicts.answers import DIFFER, IDENTICAL, NEAR_TIE, against_salted, under_load  # noqa: E402

# The first tokens of each answer judged: a CPU node's answers_tokens, a GPU node's, and the whole answer.
WINDOWS = (16, 32, 256)


def extract(store: Path) -> dict:
    from pytest_apc.measure.records import Measured

    records = {key.id: run for key, run in Measured.from_state(json.loads(store.read_text())).records.items()}
    on, off = records["D-c8"], records["C-c8"]
    kept: dict = {"run": on.key.id, "twin": off.key.id, "salted": [], "twin_outcomes": [], "differ": []}
    for name, outcomes in (("salted", against_salted(on)), ("twin_outcomes", under_load(on, off))):
        assert outcomes is not None, name
        for o in outcomes:
            c = o.tokens
            assert c is not None
            kept[name].append([o.repeat, o.index, c.outcome, c.position, c.gap_nats])
            if name == "salted" and c.outcome == DIFFER:
                a, b = on.repeats[o.repeat].answers[o.index], on.salted.answers[o.index]  # type: ignore[union-attr]
                p = c.position
                kept["differ"].append({
                    "repeat": o.repeat, "request": o.index, "position": p, "tokens": list(c.tokens or ()),
                    "cached_top": {str(t): lp for t, lp in a.top[p].items()},
                    "salted_top": {str(t): lp for t, lp in b.top[p].items()},
                })  # fmt: skip
    return kept


def _within(row: list, window: int) -> str:
    """A request's outcome judged on its first ``window`` tokens: the rule stops at the first parting token,
    so a parting at or after the window leaves the tokens judged the same."""
    _, _, outcome, position, _ = row
    return IDENTICAL if position is None or position >= window else outcome


def tables(kept: dict) -> list[str]:
    lines = ["repeat  against         same tokens  near tie  differ  parting token of the near ties (median, max)"]
    for name, label in (("salted", "salted"), ("twin_outcomes", kept["twin"])):
        for repeat in sorted({row[0] for row in kept[name]}):
            rows = [row for row in kept[name] if row[0] == repeat]
            found = Counter(row[2] for row in rows)
            ties = sorted(row[3] for row in rows if row[2] == NEAR_TIE)
            lines.append(
                f"{repeat + 1:>6}  {label:<14}  {found[IDENTICAL]:>11}  {found[NEAR_TIE]:>8}  {found[DIFFER]:>6}  "
                f"{ties[len(ties) // 2]:>4}, {ties[-1]}"
            )
    lines.append("")
    lines.append("first tokens judged  same tokens  near tie  differ   (every repeat, against salted)")
    for window in WINDOWS:
        found = Counter(_within(row, window) for row in kept["salted"])
        lines.append(f"{window:>19}  {found[IDENTICAL]:>11}  {found[NEAR_TIE]:>8}  {found[DIFFER]:>6}")
    lines.append("")
    lines.append("repeat  request  token  cached chose  salted chose  cached run's top 5        salted run's top 5")
    for d in kept["differ"]:
        tops = [" ".join(f"{t}:{lp:.2f}" for t, lp in top.items()) for top in (d["cached_top"], d["salted_top"])]
        lines.append(
            f"{d['repeat'] + 1:>6}  {d['request']:>7}  {d['position']:>5}  {d['tokens'][0]:>12}  {d['tokens'][1]:>12}  "
            f"{tops[0]}  |  {tops[1]}"
        )
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["--extract"]:
        (HERE / "parting.json").write_text(json.dumps(extract(Path(sys.argv[2]))) + "\n")
    else:
        print("\n".join(tables(json.loads((HERE / "parting.json").read_text()))))
