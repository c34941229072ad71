"""The store xdist workers share: what one process measured reaches another exactly, as JSON."""

from __future__ import annotations

import json

from pytest_apc.measure.records import Measured
from pytest_apc.measure.store import RunStore
from pytest_apc.workload.cases import RunKey, ServerMode
from tests.test_verdict import delta, off_delta, record, settings


def _measured(pytester) -> Measured:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    return Measured(
        records={off.key: off, on.key: on},
        errors={RunKey("F", 1): "run F-c1 failed: boom"},
        servers={"apc-on": on.server},
        launches={"apc-on": 1},
        done_modes={ServerMode(True), ServerMode(False)},
        warnings=["a warning"],
        server_seconds=12.5,
        model="/models/tiny",
    )


def test_a_record_survives_the_store_unchanged(pytester, tmp_path) -> None:
    measured = _measured(pytester)
    store = RunStore(tmp_path)
    assert store.load() is None
    store.save(measured)
    json.loads((tmp_path / "store.json").read_text())  # plain JSON, readable by anything
    loaded = store.load()
    assert loaded == measured
    # Derived numbers are the same too (they are what verdicts and the table read).
    for key, run in measured.records.items():
        assert loaded.records[key].to_json() == run.to_json()
        assert loaded.records[key].samples_ms().tolist() == run.samples_ms().tolist()


def test_adopting_only_adds(pytester) -> None:
    mine = Measured(errors={RunKey("A", 8): "mine"}, warnings=["w1"], server_seconds=3.0)
    theirs = _measured(pytester)
    mine.adopt(theirs)
    assert set(mine.records) == set(theirs.records)
    assert mine.errors == {RunKey("A", 8): "mine", RunKey("F", 1): "run F-c1 failed: boom"}
    assert mine.warnings == ["w1", "a warning"]
    assert mine.server_seconds == 12.5
    assert mine.done_modes == {ServerMode(True), ServerMode(False)}
