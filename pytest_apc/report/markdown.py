"""``summary.md``: the validation, hash-algorithm and fleet tables in GitHub Markdown, the cases' purpose
and the failures.

It renders a :class:`ReportView`, so ``python -m pytest_apc report --markdown`` writes the same summary
from a results file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from pytest_apc.report.terminal import algo_lead, fleet_lead, offload_lead, pair_legend, server_lines
from pytest_apc.results.columns import Row, cells
from pytest_apc.results.formatting import first_line
from pytest_apc.results.rows import AlgoRow, FleetRow, PairRow, TierRow
from pytest_apc.results.view import ReportView
from pytest_apc.workload.cases import CASE_PURPOSE


def _table(kind: type[Row], rows: Sequence[Row]) -> str:
    """A summary.md table: every column the rows' class declares for the file."""
    headers, body = cells(kind.markdown_columns(rows), rows)
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


# The outcomes pytest's summary line counts, in its order.
_OUTCOMES = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")


def tests_line(tests: Mapping[str, int]) -> str:
    """The tests as pytest's summary line counts them: ``Tests: 2 failed, 7 passed.`` ("2 errors", as pytest
    says it)."""
    parts = [f"{tests[key]} {key}{'s' if key == 'error' and tests[key] != 1 else ''}"
             for key in _OUTCOMES if tests.get(key)]  # fmt: skip
    return f"Tests: {', '.join(parts) or 'none ran'}."


def verdicts_line(verdicts: Sequence[Mapping[str, Any]]) -> str:
    """For a results file that does not record pytest's count: the verdicts, which are not tests (a test may
    record several)."""
    failed = sum(1 for v in verdicts if not v["passed"])
    return f"Verdicts (a test may record several): {len(verdicts) - failed} passed, {failed} failed."


def markdown(view: ReportView) -> str:
    lines = ["# APC validation", "", f"Model `{view.model}`, profile `{view.profile}`.", ""]
    lines += [f"- {line}" for line in server_lines(view.servers, view.launches)]
    lines += ["", f"**{view.fit}**"] if view.fit else []
    if view.pairs:
        lines += ["", _table(PairRow, view.pairs), ""]
        legend = pair_legend(view.pairs)
        lines += [f"{legend}.", ""] if legend else []
    if view.algos:
        lines += ["", f"{algo_lead(view.algos)}; TTFT ratio algorithm/default:"]
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
    lines.append(tests_line(view.tests) if view.tests else verdicts_line(view.verdicts))
    lines += [f"- FAIL `{v.get('test')}`: {first_line(v.get('message'))}" for v in failed]
    lines += [f"- UNPAIRED {line}" for line in view.unpaired]
    lines += [f"- NOT MEASURED {run_id}: {first_line(error)}" for run_id, error in view.errors]
    lines += [f"- FAIL baseline: {line}" for line in view.gate.get("failures") or []]
    return "\n".join(lines) + "\n"
