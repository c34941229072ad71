"""The results file: what was measured, as ``results.json`` (its schema is ``results.schema.json``).

The session writes it after every measurement, so a later crash loses nothing; the report writes it a
last time with the pairs, verdicts and gate. Redacted: an API key never reaches the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.measure.records import Measured
from pytest_apc.measure.session import ApcSession
from pytest_apc.redaction import redact
from pytest_apc.workload.cases import CASE_FAMILY

SCHEMA_VERSION = 6
SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6)  # every version pytest-apc has written; readers accept each


def document(settings: Settings, measured: Measured, model: str, started_at: str, elapsed_s: float) -> dict[str, Any]:
    """The measured part of the results file, with the time accounting of the suite."""
    records = sorted(measured.records.values(), key=lambda r: (CASE_FAMILY[r.key.case], r.key))
    bench_s = sum(float(rep.bench["duration"]) for r in records for rep in r.repeats)
    measure_s = sum(r.wall_s for r in records)
    server_s = measured.server_seconds
    return {
        "schema_version": SCHEMA_VERSION,
        "started_at": started_at,
        "profile": settings.profile,
        "model": model,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.as_dict().items()},
        "server_launches": dict(measured.launches),
        "servers": [info.__dict__ for info in measured.servers.values()],
        "runs": [r.to_json() for r in records],
        "errors": {k.id: v for k, v in sorted(measured.errors.items())},
        "warnings": measured.warnings,
        "timing": {
            "suite_elapsed_s": round(elapsed_s, 3),
            "server_lifecycle_s": round(server_s, 3),
            "measurements_wall_s": round(measure_s, 3),
            "bench_duration_s": round(bench_s, 3),
            # Time the suite spent on anything but starting/stopping servers and measuring.
            "harness_overhead_s": round(elapsed_s - server_s - measure_s, 3),
            # Suite time over (server lifecycle + the benchmarks' own durations); target <= 1.05 on GPU.
            "overhead_ratio": round(elapsed_s / (server_s + bench_s), 3) if server_s + bench_s > 0 else None,
        },
    }


def of_session(session: ApcSession, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """The session's results document: what it measured so far and ``report`` (the controller's part:
    environment, verdicts, rows, gate, files), in the file's order; timing stays the last block.
    "verdicts" is required by the schema; until the controller's final write it is empty."""
    measured = document(session.settings, session.measured, session.json_model(), session.started_at,
                        session.elapsed_s())  # fmt: skip
    timing = measured.pop("timing")
    return {**measured, "verdicts": [], **(report or {}), "timing": timing}


def publish(session: ApcSession) -> None:
    """Rewrite the session's results file with what it measured so far (after every run)."""
    write(session.json_path, of_session(session))


def write(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(redact(json.dumps(data, indent=2, default=str)))
    os.replace(tmp, path)
