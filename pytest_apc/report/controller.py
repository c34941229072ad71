"""``ControllerReporter``: on the controller only, gathers what every test said, gates the exit status,
writes the final results.json, summary.md and plots once, and prints the table. The results document is
built once, after the tests ran, and every output reads it: the gate, the table, summary.md and the final
write (which adds the gate's verdict, the files and the timing)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_apc.gate.baseline import Baseline
from pytest_apc.gate.compare import Gate, compare_documents
from pytest_apc.measure.session import ApcSession
from pytest_apc.redaction import redact
from pytest_apc.report.markdown import markdown
from pytest_apc.report.plots import plots
from pytest_apc.report.terminal import terminal_summary
from pytest_apc.results import document as results
from pytest_apc.results.rows import Outcomes, ReportData
from pytest_apc.results.view import ReportView

# user_properties the plugin attaches to test reports (plain data, so they cross from xdist workers).
VERDICTS_PROPERTY = "apc_verdicts"  # the call report: [Verdict.to_json(), ...]
RUNS_PROPERTY = "apc_runs"  # a failed report of any phase: the ids of the runs the test is about


def report_blocks(data: ReportData, gate: Gate, tests: dict[str, int] | None = None) -> dict[str, Any]:
    """What the report adds to results.json, in the file's order: pytest's count of the tests, the verdicts,
    then the rows of each table (``pairs``, ``hash_algos``, ``fleet``, ``offload``) and the baseline gate."""
    return {
        **({"tests": tests} if tests is not None else {}),
        "verdicts": data.verdicts,
        "pairs": data.pair_numbers(),
        "hash_algos": data.algo_numbers(),
        "fleet": data.fleet_numbers(),
        "offload": data.offload_numbers(),
        "gate": gate.to_json(),
    }


class ControllerReporter:
    """Registered on the controller only (or the single process). Gathers verdicts from every report,
    which is how results cross from xdist workers; gates the exit code; writes every file once."""

    def __init__(self, config: pytest.Config, apc: ApcSession, baseline: Baseline | None = None) -> None:
        self.config = config
        self.apc = apc
        self.baseline = baseline  # read and checked at configure time (--apc-baseline)
        self.outcomes = Outcomes()
        self.tests: Counter[str] = Counter()  # pytest's count of the session's tests by outcome, as it prints it
        self.gate = Gate()
        self.data: ReportData | None = None
        self._document: dict[str, Any] | None = None
        self._view: ReportView | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Counted as pytest's own summary line counts: the category pytest_report_teststatus gives each report.
        category = self.config.hook.pytest_report_teststatus(report=report, config=self.config)[0]
        if category and getattr(report, "count_towards_summary", True):
            self.tests[category] += 1
        properties = dict(report.user_properties)
        runs = properties.get(RUNS_PROPERTY)
        if report.failed and isinstance(runs, list):
            # A test that failed before recording a verdict (cannot verify, not measured) still fails its row.
            self.outcomes.failed_runs.update(map(str, runs))
        verdicts = properties.get(VERDICTS_PROPERTY)
        if report.when == "call" and isinstance(verdicts, list):
            self.outcomes.verdicts += [{**v, "test": report.nodeid, "outcome": report.outcome} for v in verdicts]

    def report_data(self) -> ReportData:
        """The rows, built once from every run measured by any process of this run, after the tests ran."""
        if self.data is None:
            self.apc.load_store()
            self.data = ReportData.build(self.apc.measured.records, self.outcomes, self.apc.settings)
        return self.data

    def document(self) -> dict[str, Any]:
        """This session's results document as results.json holds it, built once: what every report reads."""
        if self._document is None:
            data = self.report_data()  # first: under xdist it loads what the workers measured
            self._document = results.of_session(self.apc, report_blocks(data, self.gate, dict(self.tests)))
        return self._document

    def view(self) -> ReportView:
        """What the table and summary.md show, read from the document once."""
        if self._view is None:
            self._view = ReportView.from_document(self.document(), str(self.apc.json_path))
        return self._view

    def _gated(self, gate: Gate) -> None:
        """The gate's verdict, and its warnings, into the document (and the view read from it)."""
        self.gate = gate
        self.apc.measured.warnings.extend(gate.warnings)
        blocks = {"warnings": list(self.apc.measured.warnings), "gate": gate.to_json()}
        self._document, self._view = results.with_blocks(self.document(), blocks), None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # The gate must change testsfailed before pytest_sessionfinish computes the exit status.
        result = yield
        if self.config.option.collectonly or not self.config.pluginmanager.is_registered(self):
            return result  # nothing was measured (or no APC test selected, under xdist), so there is nothing to gate
        settings = self.apc.settings
        if self.baseline is not None:
            self._gated(compare_documents(
                self.baseline.results, self.document(), self.baseline.path, settings.baseline_false_alarm,
                settings.baseline_repeats,
            ))  # fmt: skip
            if self.gate.failures:
                session.testsfailed += 1
        return result

    @pytest.hookimpl(trylast=True)  # after the plugin's own sessionfinish has stopped the servers
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.config.option.collectonly:
            return  # nothing ran: no results to write
        apc, data = self.apc, self.report_data()
        text = redact(markdown(self.view()))
        md_path = Path(apc.settings.markdown) if apc.settings.markdown else apc.json_path.with_name("summary.md")
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(text)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as handle:
                handle.write(text)
        apc.json_path.parent.mkdir(parents=True, exist_ok=True)
        written = plots(data, apc.json_path.parent)
        files = {"json": str(apc.json_path), "markdown": str(md_path), "plots": written}
        # The timing taken after the plots, so that it counts them.
        final = {"files": files, "timing": results.timing(apc.measured, apc.elapsed_s())}
        results.write(apc.json_path, results.with_blocks(self.document(), final))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.config.option.collectonly:
            terminal_summary(terminalreporter, self.view())
