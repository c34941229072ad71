"""``summary.md``: the validation, hash-algorithm and fleet tables in GitHub Markdown, the cases' purpose
and the failures.

It renders a :class:`ReportView`, so ``python -m pytest_apc report --markdown`` writes the same summary
from a results file."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from pytest_apc.report.terminal import fleet_lead, offload_lead, server_lines
from pytest_apc.results.columns import Row, cells
from pytest_apc.results.formatting import first_line
from pytest_apc.results.rows import AlgoRow, FleetRow, PairRow, TierRow
from pytest_apc.results.view import ReportView
from pytest_apc.workload.cases import CASE_PURPOSE


def _table(kind: type[Row], rows: Sequence[Row]) -> str:
    """A summary.md table: every column the rows' class declares for the file."""
    headers, body = cells(kind.markdown_columns(rows), rows)
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def markdown(view: ReportView) -> str:
    lines = ["# APC validation", "", f"Model `{view.model}`, profile `{view.profile}`.", ""]
    lines += [f"- {line}" for line in server_lines(view.servers, view.launches)]
    lines += ["", f"**{view.fit}**"] if view.fit else []
    if view.pairs:
        lines += ["", _table(PairRow, view.pairs), ""]
    if view.algos:
        lines += ["", "Hash algorithms against the default (equal cached tokens; TTFT ratio algorithm/default):"]
        lines += ["", _table(AlgoRow, view.algos), ""]
    if view.fleet:
        lines += ["", f"{fleet_lead(view.fleet)}:"]
        lines += ["", _table(FleetRow, view.fleet), ""]
        lines += [f"- FLEET {n.id}: {first_line(n.error)}" for n in view.fleet if n.error]
    if view.offload:
        lines += ["", f"{offload_lead(view.offload)}:"]
        lines += ["", _table(TierRow, view.offload), ""]
    lines += [f"- {case}: {CASE_PURPOSE.get(case, '')}" for case in view.cases()] + [""]
    failed = [v for v in view.verdicts if not v["passed"]]
    lines.append(f"Verdicts: {len(view.verdicts) - len(failed)} passed, {len(failed)} failed.")
    lines += [f"- FAIL `{v.get('test')}`: {first_line(v.get('message'))}" for v in failed]
    lines += [f"- NOT MEASURED {run_id}: {first_line(error)}" for run_id, error in view.errors]
    lines += [f"- FAIL baseline: {line}" for line in view.gate.get("failures") or []]
    return "\n".join(lines) + "\n"
