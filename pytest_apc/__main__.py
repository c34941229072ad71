"""``python -m pytest_apc`` and the console script ``pytest-apc``: re-read results files without a server or
a pytest run, and (``pytest-apc`` only) run the installed suite.

``report`` prints a results file's validation table as its run printed it; ``compare`` gates one results
file against another by the rules of ``--apc-baseline``; ``calibrate`` measures the run-to-run noise of
several results files of one build, the limits it implies, and can store it in a baseline. They render and
compare through the functions the plugin uses (``report.terminal``, ``report.markdown``, ``gate.compare``,
``gate.calibration`` and its ``gate.noise``); nothing is recomputed. ``settings`` lists every setting
(``report.reference``).
``pytest-apc [PYTEST ARGS]`` is ``pytest --pyargs tests_apc [PYTEST ARGS]``: the suite as the wheel installed it,
from any folder. ``python -m pytest_apc.measure.bench`` and ``python -m pytest_apc.report.reference`` are
separate modules.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from pytest_apc import __version__, arguments
from pytest_apc.config import SPEC_BY_NAME, default_for
from pytest_apc.gate import calibration
from pytest_apc.gate.compare import compare_documents
from pytest_apc.report import reference
from pytest_apc.report.markdown import markdown
from pytest_apc.report.terminal import gate_lines, summary_lines
from pytest_apc.results.reader import BadResults, Results, read
from pytest_apc.results.view import ReportView

PROG = "python -m pytest_apc"
SCRIPT = "pytest-apc"
SUITE = "tests_apc"

# Exit statuses, one table for pytest and every command: pytest's own codes where they overlap.
OK = int(pytest.ExitCode.OK)  # passed
FAILED = int(pytest.ExitCode.TESTS_FAILED)  # a verdict or the gate failed
USAGE = int(pytest.ExitCode.USAGE_ERROR)  # bad usage, or an input file or baseline the command cannot use
NO_RUNS = int(pytest.ExitCode.NO_TESTS_COLLECTED)  # no tests selected; a results file without runs

EXIT_STATUSES = """exit status: pytest's codes, one table with pytest -m apc (docs/ci.md, "Exit codes")
  0  passed: report: no row, verdict or gate of the file failed; compare: the gate passed;
     calibrate: the same-build check passed
  1  a verdict or the gate failed: report: a row says FAIL, a run was not measured or the file's gate
     failed; compare: a run regressed; calibrate: the rule failed same-build pairs more often than its
     false-alarm probability
  4  bad usage, or an input the command cannot use: an unknown option or value; a file that cannot be
     read or is not a valid pytest-apc results file (one line names the file, the field and what is
     wrong; nothing else is printed); compare: a baseline the gate refuses (measured under other
     conditions, too few cold repeats, no run in common, an unusable calibration); calibrate: files
     that cannot make a calibration
  5  no runs: report, compare: RESULTS has no measured run to show or judge"""


class _Parser(argparse.ArgumentParser):
    """argparse, with pytest's usage-error status (4) in place of argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def _setting_option(name: str) -> Any:
    """An argparse type that parses a value as the setting ``name`` does (its --apc- option)."""
    spec = SPEC_BY_NAME[name]

    def parse(text: str) -> Any:
        try:
            return spec.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err

    return parse


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100)


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    top = _Parser(
        prog=prog,
        description=_wrapped(
            "Re-read pytest-apc results files (results.json of the current schema_version) without a server: print "
            "a run's validation table, or compare two runs by the rules of --apc-baseline; or list every setting."
        ),
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"pytest-apc {__version__}")
    top.set_defaults(prog=prog)  # the name error messages start with
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
    report.add_argument("-v", "--verbose", action="store_true", help="add the columns of pytest -v (p90 TTFT, gain CI)")
    compare = command(
        "compare",
        "gate a results file against a baseline results file",
        "Compare RESULTS with BASELINE by the rules of --apc-baseline: refused when they were measured under "
        "other conditions (profile, model name, workload settings, seed, block size, GPU model or count, "
        "parallel layout, dtype) or share no run, or when the baseline has too few cold repeats; fails when a "
        "run's mean TTFT (median of the cold repeats: each repeat's mean over its requests, of those the median) "
        "rose beyond the limit its noise allows (the baseline's calibration, "
        "else the profile's default), or its cached tokens fell. Prints the rule and every compared run "
        "(baseline -> now (limit)). Fleet runs (case R) are not compared.",
    )
    compare.add_argument("baseline", metavar="BASELINE", type=Path, help="the results.json to compare with")
    compare.add_argument("results", metavar="RESULTS", type=Path, help="the results.json to judge")
    _gate_options(compare, "RESULTS")
    calibrate = command(
        "calibrate",
        "measure the run-to-run noise of several results files of one build",
        "Read results files of one build (each a pytest run with --apc-repeats K of the same runs) and print, "
        "per run, the spread of its mean TTFT between cold repeats and between runs, the limit that keeps the "
        "gate's false alarms at --false-alarm for K repeats, the smallest slowdown that limit catches with 95% "
        "probability, and the same for the median TTFT and the duration (to see why the gate judges the mean). "
        "Then it applies the rule to every pair of K-sets of repeats from two different files: how often the "
        "unchanged build failed. K is --repeats, the repeats of a gated run, not how many the files have. "
        "--write BASELINE stores the noise in that results file (or, where there is none, in a copy of the first "
        "file), so that compare and --apc-baseline use this node's limits instead of the profile's default. "
        "Refused (exit status 4, before anything is printed): files the gate would not compare with each other "
        "(the first file is the reference for the others, --slower and --write), and files it cannot measure "
        "both spreads from (a run needs 2 or more cold repeats in each file, and to be in 2 or more files).",
    )
    calibrate.add_argument("results", metavar="RESULTS", type=Path, nargs="+", help="results.json files of one build")
    _gate_options(calibrate, "the first file")
    calibrate.add_argument(
        "--slower",
        metavar="RESULTS",
        type=Path,
        nargs="+",
        default=[],
        help="results files of the same runs with a known slowdown: how often the rule catches them",
    )
    calibrate.add_argument(
        "--write",
        metavar="BASELINE",
        type=Path,
        help="store the measured noise in this results file (rewritten in place), or in a new one, a copy of the "
        "first RESULTS, for use as the baseline",
    )
    command(
        "settings",
        "list every setting of the plugin, with its defaults",
        "List every pytest-apc setting by group: the options pytest --help shows, then the verdict thresholds and "
        "every other setting, given as --apc-set NAME=VALUE (ini apc_set, env PYTEST_APC_SET), each with its "
        "default, its --gpu-node and --cpu-node defaults, and what it does.",
    )
    return top


def _gate_options(parser: argparse.ArgumentParser, whose: str) -> None:
    """--false-alarm and --repeats, whose defaults are the settings ``whose`` (a file) ran with."""
    for option, metavar, name in (("--false-alarm", "FRACTION", "baseline_false_alarm"),
                                  ("--repeats", "K", "baseline_repeats")):  # fmt: skip
        flag = SPEC_BY_NAME[name].label
        parser.add_argument(
            option,
            metavar=metavar,
            type=_setting_option(name),
            help=f"{SPEC_BY_NAME[name].help} ({flag}); default: the {flag} {whose} ran with (its settings.{name}; "
            f"in files written before the setting existed, the profile's default)",
        )


def _gate_setting(args: argparse.Namespace, option: str, name: str, doc: Results) -> Any:
    """A gate setting: the command line's, else the value ``doc`` ran with, else its profile's default."""
    given = getattr(args, option)
    if given is not None:
        return given
    stored = (doc.data.get("settings") or {}).get(name)
    return stored if stored is not None else default_for(name, doc.data.get("profile"))


def _report(args: argparse.Namespace) -> int:
    doc = read(args.results).data
    view = ReportView.from_document(doc, str(args.results))
    if args.markdown:
        sys.stdout.write(markdown(view))
    else:
        print(f"apc validation: schema_version {doc['schema_version']}, started {doc.get('started_at', '-')}")
        for text, _markup in summary_lines(view, verbose=args.verbose):
            print(text)
    return _report_status(doc, view)


def _report_status(doc: Mapping[str, Any], view: ReportView) -> int:
    """What the file's rows say, as an exit status: FAILED when a row says FAIL, a verdict failed, a run
    was not measured or the gate failed; NO_RUNS for a file without runs."""
    rows = [
        *(row.verdict for row in view.pairs), *(row.verdict for row in view.algos),
        *(row.verdict for row in view.fleet), *(row.verdict for row in view.offload),
    ]  # fmt: skip
    if (
        "FAIL" in rows
        or any(not verdict.get("passed", True) for verdict in view.verdicts)
        or view.errors
        or view.gate.get("failures")
    ):
        return FAILED
    return OK if doc.get("runs") else NO_RUNS


def _compare(args: argparse.Namespace) -> int:
    old = read(args.baseline, "baseline")
    new = read(args.results)
    false_alarm = _gate_setting(args, "false_alarm", "baseline_false_alarm", new)
    repeats = _gate_setting(args, "repeats", "baseline_repeats", new)
    print(f"{args.results} against baseline {args.baseline}")
    gate = compare_documents(old, new, str(args.baseline), false_alarm, repeats)
    for text, _markup in gate_lines(gate.to_json()):
        print(text)
    for line in gate.warnings:
        print(f"WARNING {line}")
    print("baseline gate: FAILED" if gate.failures else "baseline gate: passed")
    if gate.refused_to_judge:
        return USAGE
    return (NO_RUNS if gate.nothing_measured else FAILED) if gate.failures else OK


def _calibrate(args: argparse.Namespace) -> int:
    docs = [read(path) for path in args.results]
    slower = [read(path) for path in args.slower]
    # --write to a results file stores the noise in it; to a new file, it writes the first file with it.
    target = read(args.write, "baseline") if args.write is not None and args.write.exists() else None
    first = docs[0]
    false_alarm = _gate_setting(args, "false_alarm", "baseline_false_alarm", first)
    repeats = _gate_setting(args, "repeats", "baseline_repeats", first)
    try:  # every file read and every refusal made before anything is printed
        found = calibration.report(docs, repeats, false_alarm, slower, target)
    except calibration.NotCalibratable as err:
        print(f"{args.prog} calibrate: {err}", file=sys.stderr)
        return USAGE
    for line in found.lines:
        print(line)
    if args.write is not None:
        calibration.store(args.write, target or first, found.calibration)
        into = f"into {args.write}" if target else f"into a new baseline {args.write} (a copy of {first.name})"
        print(f"wrote the noise of {len(docs)} results files {into}: compare and --apc-baseline with it use these "
              "limits")  # fmt: skip
    return FAILED if found.failed else OK


def _settings(args: argparse.Namespace) -> int:
    print(reference.settings_text())
    return OK


COMMANDS = {"report": _report, "compare": _compare, "calibrate": _calibrate, "settings": _settings}


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run one command; return its exit status (:data:`EXIT_STATUSES`; the parser exits 4 itself on a usage
    error, 0 on --version)."""
    args = parser(prog).parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except BadResults as err:
        print(f"{args.prog} {args.command}: {err}", file=sys.stderr)
        return USAGE


SCRIPT_HELP = f"""usage: {SCRIPT} [PYTEST ARGS]
         the installed suite, from any folder: pytest --pyargs {SUITE} [PYTEST ARGS]
       {SCRIPT} {{{",".join(COMMANDS)}}} ...
         the commands of {PROG} ({SCRIPT} COMMAND -h)
       {SCRIPT} --version
pytest's help follows; the suite's options are in its group "vLLM automatic prefix caching validation".
"""


def suite_command(args: Sequence[str]) -> list[str]:
    """The pytest command ``pytest-apc ARGS`` runs: the installed suite, unless ARGS name a part of it
    (``tests_apc.test_pure``, ``tests_apc.test_pure::test_x``), which --pyargs then resolves."""
    named = any(arg == SUITE or arg.startswith((f"{SUITE}.", f"{SUITE}::")) for arg in args)
    # Values joined to their options: pytest must not take ``--apc-model /models/x``'s path for a test path.
    return [sys.executable, "-m", "pytest", "--pyargs", *([] if named else [SUITE]), *arguments.joined(args)]


def console(argv: Sequence[str] | None = None) -> int:
    """``pytest-apc``: a command of ``python -m pytest_apc`` when the first argument names one (or is
    --version), else pytest on the installed suite. pytest replaces this process rather than running in it,
    so that it imports (and rewrites the asserts of) the plugin itself, exactly as ``python -m pytest`` does."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and (args[0] in COMMANDS or args[0] == "--version"):
        return main(args, prog=SCRIPT)
    if "-h" in args or "--help" in args:
        print(SCRIPT_HELP, flush=True)
    command = suite_command(args)
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
