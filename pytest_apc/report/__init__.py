"""What people and pipelines read, written once, on the controller. One job per module:

* ``terminal``: header and progress lines, the tables (their rows, ``results.rows``, declare the columns),
  server lines, the terminal summary
* ``markdown``: ``summary.md``; ``plots``: the PNG plots; ``reference``: the configuration reference page and
  the listing of ``pytest-apc settings``
* ``junit``: JUnit properties; ``failures``: sections below a failure
* ``controller``: ``ControllerReporter``, which gathers the verdicts and writes every file once

Layer: the top but for ``plugin`` and ``__main__``; may import every layer below (``gate`` and down).
"""

from __future__ import annotations

from pytest_apc.report.controller import RUNS_PROPERTY, VERDICTS_PROPERTY, ControllerReporter
from pytest_apc.report.failures import failure_sections
from pytest_apc.report.junit import record_properties
from pytest_apc.report.terminal import RunProgress, header_lines, progress_writer
from pytest_apc.results import SCHEMA_PATH
from pytest_apc.results.rows import AlgoRow, Outcomes, PairRow, ReportData

__all__ = [
    "RUNS_PROPERTY",
    "SCHEMA_PATH",
    "VERDICTS_PROPERTY",
    "AlgoRow",
    "ControllerReporter",
    "Outcomes",
    "PairRow",
    "ReportData",
    "RunProgress",
    "failure_sections",
    "header_lines",
    "progress_writer",
    "record_properties",
]
