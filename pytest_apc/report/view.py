"""What the terminal summary and ``summary.md`` show, as plain data: from a live session, or read back from
a results file (``python -m pytest_apc report``). Both outputs render a :class:`ReportView` only, so a
results file re-reads exactly as its run printed it, without recomputing a number."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_apc.report.rows import ReportData

if TYPE_CHECKING:
    from pytest_apc.report.gate import Gate
    from pytest_apc.session import ApcSession


@dataclass(frozen=True)
class ReportView:
    """The rows and lines of one run's report. Rows are the dicts of ``ReportData.pair_numbers()`` and
    ``algo_numbers()``, which is what results.json stores as ``pairs`` and ``hash_algos``."""

    model: str  # as recorded: a path or a name
    profile: str | None
    servers: list[dict[str, Any]]  # ServerInfo fields, as results.json stores them
    launches: Mapping[str, int]
    pairs: list[dict[str, Any]]
    algos: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    errors: list[tuple[str, str]]  # (run id, why it was not measured), in run order
    warnings: list[str]
    gate: dict[str, Any] = field(default_factory=dict)  # Gate.to_json(), or a results file's "gate"
    results: str = ""  # where the results file is

    @classmethod
    def from_session(cls, apc: ApcSession, data: ReportData, gate: Gate | None = None) -> ReportView:
        return cls(
            model=apc.json_model(),
            profile=apc.settings.profile,
            servers=[dict(info.__dict__) for info in apc.measured.servers.values()],
            launches=apc.measured.launches,
            pairs=data.pair_numbers(),
            algos=data.algo_numbers(),
            verdicts=data.verdicts,
            errors=[(key.id, error) for key, error in sorted(apc.measured.errors.items())],
            warnings=apc.measured.warnings,
            gate=gate.to_json() if gate is not None else {},
            results=str(apc.json_path),
        )

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], path: str) -> ReportView:
        """A results file of any schema version, as written: its rows are not recomputed."""
        return cls(
            model=str(doc.get("model") or ""),
            profile=doc.get("profile"),
            servers=[s for s in doc.get("servers") or [] if isinstance(s, dict)],
            launches=doc.get("server_launches") or {},
            pairs=list(doc.get("pairs") or []),
            algos=list(doc.get("hash_algos") or []),
            verdicts=list(doc.get("verdicts") or []),
            errors=[(str(run), str(error)) for run, error in (doc.get("errors") or {}).items()],
            warnings=[str(w) for w in doc.get("warnings") or []],
            gate=dict(doc.get("gate") or {}),
            results=path,
        )

    def cases(self) -> list[str]:
        """The cases of the pair rows (``C/D``, or ``C/D xxhash`` in a schema_version 1 file), sorted."""
        return sorted({case for row in self.pairs for case in str(row["pair"]).split()[0].split("/")})
