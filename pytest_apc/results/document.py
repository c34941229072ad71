"""The results file, ``results.json``, built and written here only (its schema is ``results.schema.json``;
:mod:`pytest_apc.results.reader` reads it back).

The session writes it after every measurement (:func:`publish`), so a later crash loses nothing; the
controller writes it a last time with the report's part (environment, verdicts, rows, gate, files), and
``calibrate --write`` stores a calibration in one. Every block has one place in the file's order, the
timing last. Written atomically and redacted: an API key never reaches the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.measure.provenance import environment
from pytest_apc.measure.records import Measured
from pytest_apc.measure.session import ApcSession
from pytest_apc.redaction import redact
from pytest_apc.workload.cases import CASE_FAMILY

FILE_NAME = "results.json"  # in the run's folder, unless --apc-set json names another file
SCHEMA_VERSION = 9  # the one version read; a file of an older one is migrated first (MIGRATE names how)
SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # every version pytest-apc has written
MIGRATE = "python scripts/migrate_results.py"  # rewrites a file of an older version as the current one


def document(settings: Settings, measured: Measured, model: str, started_at: str, elapsed_s: float) -> dict[str, Any]:
    """The measured part of the results file, with the time accounting of the suite."""
    records = sorted(measured.records.values(), key=lambda r: (CASE_FAMILY[r.key.case], r.key))
    return {
        "schema_version": SCHEMA_VERSION,
        "started_at": started_at,
        "profile": settings.profile,
        "model": model,
        "settings": as_written(settings),
        **({"fit": measured.fit.as_dict()} if measured.fit else {}),
        "server_launches": dict(measured.launches),
        "servers": [info.__dict__ for info in measured.servers.values()],
        "runs": [r.to_json() for r in records],
        "errors": {k.id: v for k, v in sorted(measured.errors.items())},
        "warnings": measured.warnings,
        "timing": timing(measured, elapsed_s),
    }


def as_written(settings: Settings) -> dict[str, Any]:
    """The settings as the file's ``settings`` block holds them (a tuple is a list)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.as_dict().items()}


def timing(measured: Measured, elapsed_s: float) -> dict[str, Any]:
    """The time accounting of the suite after ``elapsed_s`` seconds: the file's ``timing`` block."""
    records = measured.records.values()
    bench_s = sum(float(rep.bench["duration"]) for r in records for rep in r.repeats)
    measure_s = sum(r.wall_s for r in records)
    server_s = measured.server_seconds
    return {
        "suite_elapsed_s": round(elapsed_s, 3),
        "server_lifecycle_s": round(server_s, 3),
        "measurements_wall_s": round(measure_s, 3),
        "bench_duration_s": round(bench_s, 3),
        # Time the suite spent on anything but starting/stopping servers and measuring.
        "harness_overhead_s": round(elapsed_s - server_s - measure_s, 3),
        # Suite time over (server lifecycle + the benchmarks' own durations); target <= 1.05 on GPU.
        "overhead_ratio": round(elapsed_s / (server_s + bench_s), 3) if server_s + bench_s > 0 else None,
    }


def of_session(session: ApcSession, report: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The session's results document: what it measured so far, where it ran (the environment: its commit
    and versions, from the first write on, so that a session resuming an interrupted one can check them) and
    ``report`` (the controller's part: verdicts, rows, gate), in the file's order. "verdicts" is required by
    the schema; until the controller's final write it is empty."""
    measured = document(session.settings, session.measured, session.json_model(), session.started_at,
                        session.elapsed_s())  # fmt: skip
    where = environment(session.measured.servers)
    return with_blocks(measured, {"verdicts": [], "environment": where, **(report or {})})


def with_blocks(doc: Mapping[str, Any], blocks: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``blocks`` added or replaced, the timing (``blocks``' own, else ``doc``'s) staying the last
    block (where a reader of the file looks for how long the suite took)."""
    timing = {"timing": blocks.get("timing", doc.get("timing"))} if "timing" in {*doc, *blocks} else {}
    added = {k: v for k, v in blocks.items() if k != "timing"}
    return {**{k: v for k, v in doc.items() if k != "timing"}, **added, **timing}


def publish(session: ApcSession) -> None:
    """Rewrite the session's results file with what it measured so far (after every run)."""
    write(session.json_path, of_session(session))


def write(path: Path, data: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically (a reader never sees half a file): the one place a results file is
    written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(redact(json.dumps(data, indent=2, default=str)))
    os.replace(tmp, path)
