"""Damaged results files, made from the committed ones by seeded mutations (a field removed, a value of
another type at a random place, the JSON cut short): ``report``, ``compare`` and ``calibrate`` read each
through the one reader, so a file the schema refuses is one line naming the file and exit status 4 (an input
the command cannot use), and a file it accepts is used without a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from pytest_apc.__main__ import USAGE, main
from pytest_apc.results import SCHEMA_PATH

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
# One file of each schema version and kind of run (pairs, fleet, offload, gate repeats).
FILES = ("h200", "h200-recheck", "h200-fleet/round_robin", "h200-gate/same-build/cd-1", "h200-offload", "cpu",
         "fleet-cpu")  # fmt: skip
MUTATIONS = 30  # per file
SEED = 20261203
# Values of every JSON type, to put where another type is.
VALUES: list[Any] = ["x", "", 0, -1, 2.5, True, None, [], [1], {}, {"x": 1}]
# The exit statuses a command may end with on a file the schema accepts: 1 a failed row, verdict or gate, 4
# a baseline or calibration the file cannot make (said in full, not as a damaged file's one line), 5 no runs.
ALLOWED = {"report": {0, 1, 5}, "compare": {0, 1, 4, 5}, "calibrate": {0, 1, 4}}


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document (the first two items of an array only: its thousand TTFTs are alike)."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:2]):
            found += _places(item, (*path, i))
    return found


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _json_type(value: Any) -> str:
    return type(value).__name__ if not isinstance(value, bool) else "bool"


def _mutated(rng: np.random.Generator, text: str) -> tuple[str, str]:
    """(the damaged file's text, what was done to it)."""
    doc = json.loads(text)
    kind = rng.choice(["remove", "retype", "retype", "truncate"])
    if kind == "truncate":
        cut = int(rng.integers(1, len(text)))
        return text[:cut], f"cut at {cut} of {len(text)} characters"
    places = [p for p in _places(doc) if p and (kind == "retype" or isinstance(_at(doc, p[:-1]), dict))]
    path = places[int(rng.integers(len(places)))]
    parent = _at(doc, path[:-1])
    if kind == "remove":
        del parent[path[-1]]
        return json.dumps(doc), f"removed {list(path)}"
    others = [v for v in VALUES if _json_type(v) != _json_type(parent[path[-1]])]
    parent[path[-1]] = others[int(rng.integers(len(others)))]
    return json.dumps(doc), f"{list(path)} set to {parent[path[-1]]!r}"


def _schema_accepts(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).is_valid(doc)


@pytest.mark.parametrize("name", FILES)
def test_a_damaged_results_file_is_one_line_and_exit_3_never_a_traceback(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng([SEED, FILES.index(name)])
    text = (RESULTS / name / "results.json").read_text()
    path = tmp_path / "damaged.json"
    refused = 0
    for _ in range(MUTATIONS):
        damaged, how = _mutated(rng, text)
        path.write_text(damaged)
        accepted = _schema_accepts(damaged)
        for command, args in (("report", [str(path)]), ("report", ["--markdown", str(path)]),
                              ("compare", [str(path), str(path)]), ("calibrate", [str(path), str(path)])):  # fmt: skip
            status = main([command, *args])
            out, err = capsys.readouterr()
            if status == USAGE and not out and accepted is False:
                assert out == "", (how, command)
                assert len(err.splitlines()) == 1, (how, command, err)
                assert str(path) in err, (how, command, err)
            else:
                assert accepted, (how, command, status, out[-500:], err)  # the schema refuses it: so must the tool
                assert status in ALLOWED[command], (how, command, status, err)
        refused += not accepted
    assert refused >= MUTATIONS // 3  # many mutations break the file: the test tests something
