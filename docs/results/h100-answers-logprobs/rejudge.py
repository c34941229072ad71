#!/usr/bin/env python3
"""The per-request rule on one GPU in its default kernels, re-judged from what the sessions of this page
recorded: every request's token comparison with its salted reference (first parting token: identical, near
tie or differ; its gap and the shared tokens' drift in nats), as ``scripts/answers_power.py`` kept it per
session, and every request's answers (store-*.json.gz) for the comparisons the sessions did not judge.

    python rejudge.py            # the tables of the page
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2]))  # the checkout, for the rule itself

from pytest_apc.measure.answers import Answer  # noqa: E402
from pytest_apc.verdicts.answers import DIFFER, IDENTICAL, NEAR_TIE, compare  # noqa: E402

SHAPES = {"none": "healthy", "shift-under-load": "hits wrong only under load", "shift": "every hit wrong"}


def records() -> list[dict]:
    return [r for path in sorted(HERE.glob("sessions-*.json")) for r in json.loads(path.read_text())]


def sessions() -> list[str]:
    """Per session: the requests and how their tokens compared with the salted reference, the verdict by the
    rule as shipped (fails where any request differs) and as run (which also failed a gap or drift over
    0.25 nats), and the largest gap and drift."""
    lines = [
        "server                      requests  same text  tokens same/near tie/differ  verdict  as run  "
        "max gap  max drift"
    ]
    for r in sorted(records(), key=lambda r: (list(SHAPES).index(r["shape"]), r["wall_s"])):
        found = Counter(outcome for outcome, _, _ in r["by_logprobs"])
        gaps = [gap for _, gap, _ in r["by_logprobs"] if gap is not None]
        drifts = [drift for _, _, drift in r["by_logprobs"]]
        verdict = "FAIL" if found[DIFFER] else "pass"
        lines.append(
            f"{SHAPES[r['shape']]:<27} {r['requests_compared']:>8}  {r['requests_identical']:>9}  "
            f"{found[IDENTICAL]:>13} / {found[NEAR_TIE]:>2} / {found[DIFFER]:<2}       {verdict:<7}  "
            f"{'pass' if r['same_answers_passed'] else 'FAIL':<6}  {max(gaps, default=0.0):>7.2f}  {max(drifts):>9.2f}"
        )
    return lines


def _answers(path: Path) -> dict[str, list[Answer]]:
    state = json.loads(gzip.decompress(path.read_bytes()))
    runs = {r["key"]["case"]: r for r in state["records"]}
    load = lambda kept: [Answer.from_json(a) for a in kept]  # noqa: E731
    return {"on": load(runs["D"]["repeats"][0]["answers"]), "salted": load(runs["D"]["salted"]["answers"]),
            "off": load(runs["C"]["repeats"][0]["answers"])}  # fmt: skip


def _counts(a: list[Answer], b: list[Answer]) -> str:
    found = Counter(compare(i, x, y).outcome for i, (x, y) in enumerate(zip(a, b, strict=True)))
    return f"{found[IDENTICAL]:>2} / {found[NEAR_TIE]:>2} / {found[DIFFER]:>2}"


def references() -> list[str]:
    """Per kept session, the tokens of three comparisons (same/near tie/differ): the APC-on run against its
    salted reference (the judged one) and against the APC-off twin, and the two uncached runs (salted, twin)
    against each other; then each session's uncached APC-off run against the first healthy session's (two
    fresh starts of the same server)."""
    stores = sorted(HERE.glob("store-*.json.gz"))
    kept = {p.name.removeprefix("store-").removesuffix(".json.gz"): _answers(p) for p in stores}
    first = next(name for name in kept if name.startswith("pure-none"))
    lines = ["session                        on~salted     on~twin       salted~twin   twin~first session's twin"]
    for name, got in kept.items():
        lines.append(
            f"{name:<30} {_counts(got['on'], got['salted'])}  {_counts(got['on'], got['off'])}  "
            f"{_counts(got['salted'], got['off'])}  {_counts(got['off'], kept[first]['off'])}"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(sessions()))
    print()
    print("\n".join(references()))
