"""The baseline gate: regressions of this run's pair rows against a stored results file."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_apc.report.rows import ReportData
from pytest_apc.report.terminal import _num
from pytest_apc.session import ApcSession


def compare_baseline(apc: ApcSession, data: ReportData, baseline_path: Path) -> list[str]:
    """Regressions against a stored results file, one message per row and metric; a row the baseline
    lacks is a warning of the session."""
    try:
        old = json.loads(baseline_path.read_text())
    except (OSError, ValueError) as err:
        return [f"cannot read baseline {baseline_path}: {err}"]
    if not old.get("pairs"):
        return [f"baseline {baseline_path} has no measured pairs to compare with (an incomplete run?)"]
    old_rows = {(r["pair"], r["concurrency"]): r for r in old["pairs"] if not r.get("hash_algo")}
    tolerances = apc.settings.baseline_tolerance
    failures = []
    rows = data.pair_numbers()
    if not rows:
        return [f"nothing was measured to compare with baseline {baseline_path}"]
    for row in rows:
        before = old_rows.get((row["pair"], row["concurrency"]))
        if before is None:
            apc.warnings.append(
                f"baseline {baseline_path} has no row {row['pair']} c{row['concurrency']}: not compared"
            )
            continue
        name = f"{row['pair']} c{row['concurrency']}"
        checks = [
            ("ttft_on", "median TTFT ON (ms)", before["median_ttft_on_ms"], row["median_ttft_on_ms"], +1),
            ("speedup", "TTFT gain OFF/ON", before["ttft_speedup"], row["ttft_speedup"], -1),
            ("cached_tokens", "cached tokens", before["cached_tokens"], row["cached_tokens"], -1),
        ]
        for metric, label, was, now, direction in checks:
            if was is None or now is None:
                continue
            kind, amount = tolerances[metric]
            allowed = abs(was) * amount / 100 if kind == "%" else amount
            worse = (now - was) * direction  # > 0 means a regression
            if worse > allowed:
                limit = f"{amount:g}%" if kind == "%" else f"{amount:g}"
                failures.append(
                    f"{name}: {label} {_num(was)} -> {_num(now)} regressed by {_num(worse)} (allowed {limit}) "
                    f"against {baseline_path}"
                )
    return failures
