"""What the terminal summary and ``summary.md`` show, as plain data: a results document, the live
session's (built by the controller) or one read back from a file (``python -m pytest_apc report``). Both
outputs render a :class:`ReportView` only, so a results file re-reads exactly as its run printed it,
without recomputing a number (a pair row of a file written before rows carried ``timing`` reads it from the
file's verdicts, as the run that wrote a newer file did)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_apc.results.rows import AlgoRow, FleetRow, Outcomes, PairRow, TierRow
from pytest_apc.workload.cases import RunKey


@dataclass(frozen=True)
class ReportView:
    """The rows and lines of one run's report. Its rows are read back from what results.json stores as
    ``pairs``, ``hash_algos``, ``fleet`` and ``offload`` (``ReportData``'s rows as ``to_json`` wrote them)."""

    model: str  # as recorded: a path or a name
    profile: str | None
    servers: list[dict[str, Any]]  # ServerInfo fields, as results.json stores them
    launches: Mapping[str, int]
    pairs: list[PairRow]
    algos: list[AlgoRow]
    verdicts: list[dict[str, Any]]
    errors: list[tuple[str, str]]  # (run id, why it was not measured), in run order
    warnings: list[str]
    gate: dict[str, Any] = field(default_factory=dict)  # Gate.to_json(), or a results file's "gate"
    results: str = ""  # where the results file is
    fleet: list[FleetRow] = field(default_factory=list)  # one row per fleet run
    offload: list[TierRow] = field(default_factory=list)  # one row per offload run
    tests: Mapping[str, int] = field(default_factory=dict)  # pytest's count of its tests by outcome, as it printed
    fit: str = ""  # how the runs were fitted to the model's context (results.json's fit.summary); "" they fit
    unpaired: list[str] = field(default_factory=list)  # measured runs whose pair's other run is not, yet

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], path: str) -> ReportView:
        """A results document as written: its rows are not recomputed (a pair row without ``timing`` reads it
        from the document's verdicts)."""
        verdicts = list(doc.get("verdicts") or [])
        outcomes = Outcomes(verdicts)
        pairs = [
            row if row.timing is not None else replace(row, timing=outcomes.timing(row.run_ids))
            for row in PairRow.typed(doc.get("pairs") or [])
        ]
        return cls(
            model=str(doc.get("model") or ""),
            profile=doc.get("profile"),
            servers=[s for s in doc.get("servers") or [] if isinstance(s, dict)],
            launches=doc.get("server_launches") or {},
            pairs=pairs,
            algos=AlgoRow.typed(doc.get("hash_algos") or []),
            verdicts=verdicts,
            errors=[(str(run), str(error)) for run, error in (doc.get("errors") or {}).items()],
            warnings=[str(w) for w in doc.get("warnings") or []],
            gate=dict(doc.get("gate") or {}),
            results=path,
            fleet=FleetRow.typed(doc.get("fleet") or []),
            offload=TierRow.typed(doc.get("offload") or []),
            tests=dict(doc.get("tests") or {}),
            fit=str((doc.get("fit") or {}).get("summary") or ""),
            unpaired=unpaired_lines(doc.get("runs") or []),
        )

    def cases(self) -> list[str]:
        """The cases of the pair rows (``C/D``; ``C/D xxhash`` in a file first written by schema_version 1),
        R for fleet rows and N/O for offload rows, sorted."""
        cases = {case for row in self.pairs for case in str(row.pair).split()[0].split("/")}
        cases |= {str(row.case) for row in self.offload}
        return sorted(cases | ({"R"} if self.fleet else set()))


def unpaired_lines(runs: list[dict[str, Any]]) -> list[str]:
    """A line for each measured run that no table shows because the other run of its pair is not measured (a
    session stopped or pre-empted between the two): what was measured and which run it waits for. Runs that
    are shown alone (fleet, offload, hash algorithms, multi-turn variants) never wait."""
    measured = {str(run["id"]): run for run in runs}
    lines = []
    for run_id, run in measured.items():
        key = RunKey.parse(run_id)
        if key.route or key.hash_algo or key.variant or key.family in ("fleet", "offload"):
            continue
        other = next(k for k in key.pair() if k != key).id
        if other in measured:
            continue
        completed, failed = run.get("completed"), run.get("failed")
        requests = f"{completed} of {completed + failed} requests" if failed is not None else "requests n/a"
        repeats = int(run.get("repeats") or 1)
        plural = "" if repeats == 1 else "s"
        lines.append(
            f"{run_id}: measured on {run.get('server')} ({repeats} repeat{plural}, {requests} each); "
            f"its pair waits for {other}, not measured yet (compare reads the run alone)"
        )
    return lines
