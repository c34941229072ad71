"""``summary.md``: the validation tables in GitHub Markdown, the cases' purpose and the failures."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from pytest_apc.cases import CASE_PURPOSE
from pytest_apc.report.rows import ReportData
from pytest_apc.report.terminal import _num, server_lines
from pytest_apc.session import ApcSession


def markdown(apc: ApcSession, data: ReportData, gate: list[str]) -> str:
    lines = ["# APC validation", "", f"Model `{apc.json_model()}`, profile `{apc.settings.profile}`.", ""]
    lines += [f"- {line}" for line in server_lines(apc)]
    rows = [[_md_cell(k, v) for k, v in n.items()] for n in data.pair_numbers()]
    if rows:
        lines += ["", tabulate(rows, headers=_md_headers(), tablefmt="github", disable_numparse=True), ""]
    algos = [[_md_cell(k, v) for k, v in n.items()] for n in data.algo_numbers()]
    if algos:
        lines += ["", "Hash algorithms against the default (equal cached tokens; TTFT ratio algorithm/default):"]
        lines += ["", tabulate(algos, headers=_md_algo_headers(), tablefmt="github", disable_numparse=True), ""]
    lines += [f"- {case}: {CASE_PURPOSE[case]}" for case in data.cases()] + [""]
    failed = [v for v in data.verdicts if not v["passed"]]
    lines.append(f"Verdicts: {len(data.verdicts) - len(failed)} passed, {len(failed)} failed.")
    lines += [f"- FAIL `{v['test']}`: {v['message'].splitlines()[0]}" for v in failed]
    lines += [f"- NOT MEASURED {k.id}: {e.splitlines()[0]}" for k, e in sorted(apc.errors.items())]
    lines += [f"- FAIL baseline: {line}" for line in gate]
    return "\n".join(lines) + "\n"


def _md_cell(name: str, value: Any) -> str:
    return _num(value, ".1%") if name == "hit_ratio" and value is not None else _num(value)


def _md_headers() -> list[str]:
    return ["pair", "conc", "hit?", "cached tokens", "expected", "hit ratio", "TTFT OFF ms", "TTFT ON ms",
            "gain", "gain CI low", "gain CI high", "prefill bound", "in tok/s OFF", "in tok/s ON", "out tok/s OFF",
            "out tok/s ON", "E2E OFF ms", "E2E ON ms", "verdict"]  # fmt: skip


def _md_algo_headers() -> list[str]:
    return ["case", "conc", "hash", "default hash", "cached tokens", "default cached tokens", "TTFT default ms",
            "TTFT ms", "ratio", "ratio CI low", "ratio CI high", "duration default s", "duration s",
            "verdict"]  # fmt: skip
