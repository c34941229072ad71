"""Results files read back: the one reader of ``results.json`` for ``report``, ``compare``, ``calibrate``
and ``--apc-baseline``.

:func:`read` checks a file before anything uses it: JSON, the current schema version (a file of an older one
is refused with the command that migrates it), the schema
(``results.schema.json``, with what its version requires), then what the schema cannot say (a run's id
agrees with its case and concurrency, each run once, one counter entry per repeat). It returns a
:class:`Results`: the document as the file holds it, and its runs as
:class:`~pytest_apc.measure.records.RunRecord`, the representation the verdicts, the rows and the gate
read. A file that cannot be used is :class:`BadResults`, whose message is one line naming the file, the
field and what is wrong with it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import jsonschema

from pytest_apc.measure.records import RunRecord, server_from_json
from pytest_apc.results import SCHEMA_PATH
from pytest_apc.results.document import MIGRATE, SCHEMA_VERSION, SCHEMA_VERSIONS
from pytest_apc.workload.cases import CASE_APC, CASE_FAMILY, RunKey


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
    """The results file at ``path``, checked (:func:`problem`); :class:`BadResults` names ``role`` (e.g.
    "baseline"), the path and the first problem otherwise."""
    try:
        doc = json.loads(path.read_text(), parse_constant=_not_json)
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: JSON nested beyond what Python parses
        raise BadResults(_one_line(f"cannot read {role} {path}: {err}")) from err
    if not isinstance(doc, dict):
        raise BadResults(f"{role} {path} is not a pytest-apc results file (not a JSON object)")
    version = doc.get("schema_version")
    if version is None:
        raise BadResults(f"{role} {path} is not a pytest-apc results file (no schema_version)")
    if version in SCHEMA_VERSIONS and version != SCHEMA_VERSION and not isinstance(version, bool):
        raise BadResults(
            f"{role} {path} has schema_version {version}, older than the {SCHEMA_VERSION} this pytest-apc reads; "
            f"migrate it with: {MIGRATE} {path}"
        )
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BadResults(
            _one_line(f"{role} {path} has schema_version {version!r}; this pytest-apc reads {SCHEMA_VERSION}")
        )
    found = problem(doc)
    if found is None:
        try:
            return Results.of(doc, str(path))
        except (KeyError, TypeError, ValueError) as err:  # what the checks above should have caught
            found = f"its runs cannot be read back ({type(err).__name__}: {err})"
    raise BadResults(_one_line(f"{role} {path} is not a valid results file of schema_version {version}: {found}"))


def problem(doc: Mapping[str, Any]) -> str | None:
    """The first thing that makes ``doc`` unusable, naming the field (``runs[2].repeat_counters``); None
    for a document that is valid for its schema version and means what it says."""
    error = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if error is not None:
        return _schema_problem(error)
    return next(_meaning_problems(doc), None)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def _meaning_problems(doc: Mapping[str, Any]) -> Iterator[str]:
    """What the schema cannot say: each run's id is its case, concurrency and route, once; its family and
    APC are its case's; it has one ``repeat_counters`` entry per repeat; errors are keyed by run id."""
    seen: set[str] = set()
    for i, run in enumerate(doc["runs"]):
        where = f"runs[{i}]"
        try:
            key = RunKey.parse(run["id"])
        except ValueError as err:
            yield f"{where}.id: {err}"
            continue
        expected = {"case": key.case, "concurrency": key.concurrency, "family": CASE_FAMILY[key.case],
                    "apc": CASE_APC[key.case]}  # fmt: skip
        if key.route:
            expected["route"] = key.route
        for name, value in expected.items():
            if name in run and run[name] != value:
                yield f"{where}.{name} is {_short(run[name])}, but its id {key.id!r} says {_short(value)}"
        if key.route and "route" not in run:
            yield f"{where}.route is missing for the fleet run {key.id!r}"
        if key.id in seen:
            yield f"{where}.id: run {key.id!r} is in the file twice"
        seen.add(key.id)
        if len(run["repeat_counters"]) != run["repeats"]:
            yield (f"{where}.repeat_counters has {len(run['repeat_counters'])} entries for "
                   f"{run['repeats']} repeats (one per repeat)")  # fmt: skip
    for run_id in doc["errors"]:
        try:
            RunKey.parse(run_id)
        except ValueError as err:
            yield f"errors: {err}"


def _schema_problem(error: jsonschema.ValidationError) -> str:
    """One jsonschema error in words: the field, what it is, what the schema wants."""
    where = _path(error.absolute_path)
    value, wanted = error.instance, error.validator_value
    since = " (its schema_version has it)" if "allOf" in error.schema_path else ""
    if error.validator == "required":
        missing = next((name for name in wanted if name not in value), "?")
        return f"{_path([*error.absolute_path, missing])} is missing{since}"
    if error.validator == "type":
        kinds = " or ".join(_KINDS.get(kind, kind) for kind in ([wanted] if isinstance(wanted, str) else wanted))
        return f"{where} is {_kind(value)}, not {kinds}"
    if error.validator in ("enum", "const"):
        allowed = ", ".join(map(_short, wanted if error.validator == "enum" else [wanted]))
        return f"{where} is {_short(value)}, not one of {allowed}"
    if error.validator in _BOUNDS:
        return f"{where} is {_short(value)}, {_BOUNDS[error.validator]} {wanted}"
    if error.validator == "pattern":
        return f"{where} is {_short(value)}, which is not of the form {wanted}"
    return f"{where}: {_clipped(error.message)}"


_KINDS = {"object": "an object", "array": "an array", "string": "a string", "number": "a number",
          "integer": "an integer", "boolean": "a boolean", "null": "null"}  # fmt: skip
_BOUNDS = {"minimum": "below the minimum", "exclusiveMinimum": "not above", "maximum": "above the maximum",
           "minItems": "with fewer items than", "maxItems": "with more items than"}  # fmt: skip


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({_short(value)})"
    kind = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}
    found = kind.get(type(value), "null" if value is None else type(value).__name__)
    return found if isinstance(value, (dict, list)) or value is None else f"{found} ({_short(value)})"


def _path(parts: Iterable[Any]) -> str:
    """``runs[2].repeat_counters[0].delta`` for a path into the document; "the document" for none."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")
    return text or "the document"


def _short(value: Any) -> str:
    """A value as JSON writes it, clipped: a message stays one readable line."""
    return _clipped(json.dumps(value, default=str), 60)


def _clipped(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())
