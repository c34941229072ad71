"""``python -m pytest_apc``: re-read results files without a server or a pytest run.

``report`` prints a results file's validation table as its run printed it; ``compare`` gates one results
file against another by the rules of ``--apc-baseline``. Both render and compare through the functions the
plugin uses (``report.terminal``, ``report.markdown``, ``report.gate``); nothing is recomputed.
``python -m pytest_apc.bench`` and ``python -m pytest_apc.reference`` are separate modules.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_apc.config import BASELINE_METRICS, _tolerances
from pytest_apc.report.gate import UnreadableResults, compare_documents, read_results, tolerances_of
from pytest_apc.report.markdown import markdown
from pytest_apc.report.terminal import gate_lines, summary_lines
from pytest_apc.report.view import ReportView
from pytest_apc.results import SCHEMA_VERSIONS

PROG = "python -m pytest_apc"

# Exit statuses: what a pipeline branches on.
OK, GATE_FAILED, USAGE = 0, 1, 2

EXIT_STATUSES = """exit status:
  0  done (compare: the gate passed)
  1  compare: the gate failed (not comparable, no overlapping row, or a regression)
  2  usage error, or a file that cannot be read or is not a pytest-apc results file"""


def _tolerance_option(text: str) -> dict[str, tuple[str, float]]:
    """``--tolerance``, parsed as ``--apc-baseline-tolerance`` is."""
    try:
        return _tolerances(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=PROG,
        description=_wrapped(
            "Re-read pytest-apc results files (results.json of any schema_version) without a server: print "
            "a run's validation table, or compare two runs by the rules of --apc-baseline."
        ),
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=_wrapped(description),
            epilog=EXIT_STATUSES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    report = command(
        "report",
        "print the validation table of a results file",
        "Print the validation table of a results file as the run printed it: server lines, the pair rows, "
        "the hash-algorithm rows, the fleet rows, runs not measured, warnings, and the rows the baseline gate "
        "compared. The numbers are the file's (pairs[], hash_algos[], fleet[], gate); nothing is recomputed.",
    )
    report.add_argument("results", metavar="RESULTS", type=Path, help="a results.json written by pytest-apc")
    report.add_argument("--markdown", action="store_true", help="print summary.md (GitHub Markdown) instead")
    report.add_argument("-v", "--verbose", action="store_true", help="add the columns of pytest -v (gain CI)")
    compare = command(
        "compare",
        "gate a results file against a baseline results file",
        "Compare RESULTS with BASELINE by the rules of --apc-baseline: refused when they were measured under "
        "other conditions (profile, model name, workload settings, seed, APC-on block size) or share no "
        "row; fails when a row's median TTFT ON, TTFT gain or cached tokens regressed beyond the "
        "tolerance. Prints every compared row (baseline -> now (limit)). Fleet runs (case R) have no OFF "
        "partner and are not compared.",
    )
    compare.add_argument("baseline", metavar="BASELINE", type=Path, help="the results.json to compare with")
    compare.add_argument("results", metavar="RESULTS", type=Path, help="the results.json to judge")
    compare.add_argument(
        "--tolerance",
        metavar="METRIC=N[%],...",
        type=_tolerance_option,
        help=(
            f"allowed regression per metric ({', '.join(BASELINE_METRICS)}), as --apc-baseline-tolerance; "
            "default: the tolerances RESULTS ran with, else its profile's default"
        ),
    )
    return top


def _read(path: Path, role: str) -> dict[str, Any]:
    """A results file of a schema version this package knows; :class:`UnreadableResults` otherwise."""
    doc = read_results(path, role)
    version = doc.get("schema_version")
    if version is None:
        raise UnreadableResults(f"{role} {path} is not a pytest-apc results file (no schema_version)")
    if version not in SCHEMA_VERSIONS:
        known = ", ".join(map(str, SCHEMA_VERSIONS))
        raise UnreadableResults(f"{role} {path} has schema_version {version!r}; this pytest-apc reads {known}")
    return doc


def _tolerance_text(tolerances: Mapping[str, tuple[str, float]]) -> str:
    return ", ".join(f"{m}={n:g}{'%' if kind == '%' else ''}" for m, (kind, n) in tolerances.items())


def _report(args: argparse.Namespace) -> int:
    doc = _read(args.results, "results file")
    view = ReportView.from_document(doc, str(args.results))
    if args.markdown:
        sys.stdout.write(markdown(view))
        return OK
    print(f"apc validation: schema_version {doc['schema_version']}, started {doc.get('started_at', '-')}")
    for text, _markup in summary_lines(view, verbose=args.verbose):
        print(text)
    return OK


def _compare(args: argparse.Namespace) -> int:
    old = _read(args.baseline, "baseline")
    new = _read(args.results, "results file")
    tolerances = args.tolerance if args.tolerance is not None else tolerances_of(new)
    if args.tolerance is not None:
        source = "--tolerance"
    elif (new.get("settings") or {}).get("baseline_tolerance"):
        source = f"as {args.results} ran with"
    else:
        source = f"the {new.get('profile')} profile's default"
    print(f"{args.results} against baseline {args.baseline}; tolerances {_tolerance_text(tolerances)} ({source})")
    gate = compare_documents(old, new, str(args.baseline), tolerances)
    for text, _markup in gate_lines(gate.to_json()):
        print(text)
    for line in gate.warnings:
        print(f"WARNING {line}")
    print("baseline gate: FAILED" if gate.failures else "baseline gate: passed")
    return GATE_FAILED if gate.failures else OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (argparse exits 2 itself on a usage error)."""
    args = parser().parse_args(argv)
    try:
        return _report(args) if args.command == "report" else _compare(args)
    except UnreadableResults as err:
        print(f"{PROG} {args.command}: {err}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
