"""The baseline gate: this run's pair rows against a stored results file (``--apc-baseline``).

The gate fails the session when the baseline cannot be read, was measured under conditions that make its
numbers incomparable (profile, model, lengths, prompts, block size), shares no row with this run, or when a
row regressed beyond ``--apc-baseline-tolerance``. Every compared row is kept, passing or not, so the
terminal and ``results.json`` show what the gate looked at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings, model_path_for_display
from pytest_apc.report.rows import ReportData
from pytest_apc.report.terminal import _num
from pytest_apc.session import ApcSession

# Settings that change what a run measures: a baseline with another value is not comparable.
COMPARED_SETTINGS = (
    "model_shape",
    "length_scale",
    "num_prompts",
    "output_len",
    "prefix_len",
    "suffix_len",
    "rag_prefix_len",
    "input_len",
    "seed",
)
# Settings a results file of an older version may lack, and the value that version ran with.
SETTINGS_BEFORE_THEY_EXISTED: dict[str, Any] = {"model_shape": ""}
# The version the generated models' names encode: tiny-llama-v3-<digest>, llama-3.1-8b-shape-v1-<digest>.
_GENERATED_VERSION = re.compile(r"^(?P<kind>.+)-v(?P<version>\d+)-[0-9a-f]+$")

# (metric key of --apc-baseline-tolerance, label, key of a pair row, +1 when higher is worse / -1 lower)
METRICS = (
    ("ttft_on", "median TTFT ON (ms)", "median_ttft_on_ms", +1),
    ("speedup", "TTFT gain OFF/ON", "ttft_speedup", -1),
    ("cached_tokens", "cached tokens", "cached_tokens", -1),
)


@dataclass
class Gate:
    """What the gate decided: failures fail the session; rows are every compared row, passing or not."""

    baseline: str | None = None
    failures: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    not_comparable: list[dict[str, Any]] = field(default_factory=list)  # {"what", "here", "there"}

    @property
    def compared(self) -> int:
        return len(self.rows)

    @property
    def regressed(self) -> int:
        return sum(1 for row in self.rows if row["result"] != "ok")

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "failures": self.failures,
            "compared": self.compared,
            "regressed": self.regressed,
            "not_comparable": self.not_comparable,
            "rows": self.rows,
        }


def _apc_on_block_sizes(servers: list[dict[str, Any]]) -> dict[str, int]:
    """Block size of every APC-on server (``apc-on`` and ``apc-on-<hash algo>``) that reported one."""
    return {
        str(s["mode"]): int(s["block_size"])
        for s in servers
        if isinstance(s, dict) and str(s.get("mode", "")).startswith("apc-on") and s.get("block_size") is not None
    }


def _model_difference(here: str, there: str) -> dict[str, Any] | None:
    """Models compare by name (the last path component): a results file from another node keeps its paths.
    A generated model's name carries its version and a digest of its spec, so a new version differs."""
    here_name, there_name = model_path_for_display(here), model_path_for_display(there)
    if here_name == there_name:
        return None
    difference: dict[str, Any] = {"what": "model", "here": here_name, "there": there_name}
    a, b = _GENERATED_VERSION.match(here_name), _GENERATED_VERSION.match(there_name)
    if a and b and a["kind"] == b["kind"]:
        difference["note"] = f"generated {a['kind']} model v{a['version']} vs v{b['version']}"
    return difference


def differences(
    settings: Settings, model: str, servers: list[dict[str, Any]], old: dict[str, Any]
) -> list[dict[str, Any]]:
    """What makes this run's numbers incomparable with the baseline's, one entry per difference."""
    found: list[dict[str, Any]] = []
    if settings.profile != old.get("profile"):
        found.append({"what": "profile", "here": settings.profile, "there": old.get("profile")})
    model_difference = _model_difference(model, str(old.get("model") or ""))
    if model_difference:
        found.append(model_difference)
    old_settings = old.get("settings") or {}
    for name in COMPARED_SETTINGS:
        here = getattr(settings, name)
        if name in old_settings:
            there = old_settings[name]
        elif name in SETTINGS_BEFORE_THEY_EXISTED:
            there = SETTINGS_BEFORE_THEY_EXISTED[name]
        else:
            found.append({"what": name, "here": here, "there": None, "note": "not recorded in the baseline"})
            continue
        if here != there:
            found.append({"what": name, "here": here, "there": there})
    here_blocks, there_blocks = _apc_on_block_sizes(servers), _apc_on_block_sizes(old.get("servers") or [])
    for mode in sorted(here_blocks.keys() & there_blocks.keys()):
        if here_blocks[mode] != there_blocks[mode]:
            what = "block_size" if mode == "apc-on" else f"block_size ({mode})"
            found.append({"what": what, "here": here_blocks[mode], "there": there_blocks[mode]})
    return found


def _difference_text(differences_: list[dict[str, Any]]) -> str:
    """``num_prompts 30 here vs 10 there; block_size 16 vs 128``: the first names the sides, the rest follow."""
    parts = []
    for i, d in enumerate(differences_):
        here, there = ("-" if d["here"] in (None, "") else d["here"]), ("-" if d["there"] in (None, "") else d["there"])
        text = f"{d['what']} {here} here vs {there} there" if i == 0 else f"{d['what']} {here} vs {there}"
        if d.get("note"):
            text += f" ({d['note']})"
        parts.append(text)
    return "; ".join(parts)


def _row_names(rows: Any) -> str:
    names = sorted({(str(r["pair"]), int(r["concurrency"])) for r in rows})
    return ", ".join(f"{pair} c{c}" for pair, c in names) or "none"


def compare_rows(
    rows: list[dict[str, Any]], old_rows: dict[tuple[str, int], dict[str, Any]], settings: Settings, baseline: Path
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each of ``rows`` that the baseline has, metric by metric; and the failure messages of regressions."""
    tolerances = settings.baseline_tolerance
    compared, failures = [], []
    for row in rows:
        before = old_rows.get((row["pair"], row["concurrency"]))
        if before is None:
            continue
        name = f"{row['pair']} c{row['concurrency']}"
        metrics = []
        for metric, label, key, direction in METRICS:
            was, now = before.get(key), row.get(key)
            kind, amount = tolerances[metric]
            tolerance = f"{amount:g}%" if kind == "%" else f"{amount:g}"
            entry: dict[str, Any] = {"metric": metric, "label": label, "was": was, "now": now, "tolerance": tolerance}
            if was is None or now is None:
                compared_metric = {**entry, "allowed": None, "limit": None, "result": "not compared"}
                metrics.append(compared_metric)
                continue
            allowed = abs(was) * amount / 100 if kind == "%" else amount
            worse = (now - was) * direction  # > 0 means a regression
            regressed = worse > allowed
            metrics.append({**entry, "allowed": allowed, "limit": was + direction * allowed,
                            "result": "REGRESSED" if regressed else "ok"})  # fmt: skip
            if regressed:
                failures.append(
                    f"{name}: {label} {_num(was)} -> {_num(now)} regressed by {_num(worse)} (allowed {tolerance}) "
                    f"against {baseline}"
                )
        result = "REGRESSED" if any(m["result"] == "REGRESSED" for m in metrics) else "ok"
        compared.append({"pair": row["pair"], "concurrency": row["concurrency"], "metrics": metrics, "result": result})
    return compared, failures


def compare_baseline(apc: ApcSession, data: ReportData, baseline_path: Path) -> Gate:
    """This run against a stored results file. Refused (a failure) when the file cannot be read, has no pairs,
    was measured under other conditions, or shares no row with this run; a row of this run the baseline
    lacks, while others overlap, is a warning of the session."""
    gate = Gate(baseline=str(baseline_path))
    try:
        old = json.loads(baseline_path.read_text())
    except (OSError, ValueError) as err:
        gate.failures.append(f"cannot read baseline {baseline_path}: {err}")
        return gate
    if not isinstance(old, dict):
        gate.failures.append(f"baseline {baseline_path} is not a pytest-apc results file (not a JSON object)")
        return gate
    if not old.get("pairs"):
        gate.failures.append(f"baseline {baseline_path} has no measured pairs to compare with (an incomplete run?)")
        return gate
    rows = data.pair_numbers()
    if not rows:
        gate.failures.append(f"nothing was measured to compare with baseline {baseline_path}")
        return gate
    servers = [dict(info.__dict__) for info in apc.servers.values()]
    gate.not_comparable = differences(apc.settings, apc.json_model(), servers, old)
    if gate.not_comparable:
        gate.failures.append(f"not comparable with baseline {baseline_path}: {_difference_text(gate.not_comparable)}")
        return gate
    old_rows = {(r["pair"], r["concurrency"]): r for r in old["pairs"] if not r.get("hash_algo")}
    gate.rows, gate.failures = compare_rows(rows, old_rows, apc.settings, baseline_path)
    if not gate.rows:
        gate.failures.append(
            f"no row of this run is in baseline {baseline_path}: this run has {_row_names(rows)}; "
            f"the baseline has {_row_names(old_rows.values())}"
        )
        return gate
    for row in rows:
        if (row["pair"], row["concurrency"]) not in old_rows:
            apc.warnings.append(
                f"baseline {baseline_path} has no row {row['pair']} c{row['concurrency']}: not compared"
            )
    return gate
