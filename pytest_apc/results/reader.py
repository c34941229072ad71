"""Results files read back: the one reader of ``results.json`` for ``report``, ``compare``, ``calibrate``
and ``--apc-baseline``.

:func:`read` returns a :class:`Results`: the document as the file holds it, and its runs as
:class:`~pytest_apc.measure.records.RunRecord`, the representation the verdicts, the rows and the gate
read. A file that cannot be used is :class:`BadResults`, whose message is one line naming the file and
what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from pytest_apc.measure.records import RunRecord, server_from_json
from pytest_apc.results.document import SCHEMA_VERSIONS


class BadResults(Exception):
    """A results file that cannot be read or used; the message names the file and why, on one line."""


@dataclass(frozen=True)
class Results:
    """A results document with its runs read back (:meth:`RunRecord.from_json`)."""

    name: str  # the file it came from, as messages name it
    data: Mapping[str, Any]  # the document as the file holds it
    runs: tuple[RunRecord, ...]  # in the file's order

    @classmethod
    def of(cls, doc: Document, name: str = "") -> Results:
        """A document as :func:`read` returns it, or one held in memory (this session's own, built by
        :mod:`pytest_apc.results.document`): not read from a file, so not checked again."""
        if isinstance(doc, Results):
            return doc
        servers = {s.get("mode"): server_from_json(s) for s in doc.get("servers") or [] if isinstance(s, Mapping)}
        runs = tuple(RunRecord.from_json(run, servers.get(run.get("server"))) for run in doc.get("runs") or [])
        return cls(name, doc, runs)


# A results document: read from a file (:class:`Results`) or held in memory as the document module built it.
Document: TypeAlias = "Results | Mapping[str, Any]"


def read(path: Path, role: str = "results file") -> Results:
    """The results file at ``path``, of a schema version this package knows; :class:`BadResults` names
    ``role`` (e.g. "baseline") and the path otherwise."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadResults(f"cannot read {role} {path}: {err}") from err
    if not isinstance(doc, dict):
        raise BadResults(f"{role} {path} is not a pytest-apc results file (not a JSON object)")
    version = doc.get("schema_version")
    if version is None:
        raise BadResults(f"{role} {path} is not a pytest-apc results file (no schema_version)")
    if version not in SCHEMA_VERSIONS:
        known = ", ".join(map(str, SCHEMA_VERSIONS))
        raise BadResults(f"{role} {path} has schema_version {version!r}; this pytest-apc reads {known}")
    return Results.of(doc, str(path))
