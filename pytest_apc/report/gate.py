"""The baseline gate: this run's pair rows against a stored results file (``--apc-baseline``), and one
results file against another (``python -m pytest_apc compare``), by the same rules
(:func:`compare_documents`).

The gate fails the session when the baseline cannot be read, was measured under conditions that make its
numbers incomparable (profile, model, lengths, prompts, block size), shares no row with this run, or when a
row regressed beyond ``--apc-baseline-tolerance``. Every compared row is kept, passing or not, so the
terminal and ``results.json`` show what the gate looked at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_apc.config import default_for, model_path_for_display
from pytest_apc.report.rows import ReportData
from pytest_apc.report.terminal import _num
from pytest_apc.report.view import fleet_run_ids

if TYPE_CHECKING:
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
    warnings: list[str] = field(default_factory=list)  # rows of this run the baseline lacks (not in to_json)

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


def differences(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What makes the numbers of results document ``here`` (this run) incomparable with those of ``there``
    (the baseline), one entry per difference. Each document needs ``profile``, ``model``, ``settings`` and
    ``servers`` as results.json holds them."""
    found: list[dict[str, Any]] = []
    if here.get("profile") != there.get("profile"):
        found.append({"what": "profile", "here": here.get("profile"), "there": there.get("profile")})
    model_difference = _model_difference(str(here.get("model") or ""), str(there.get("model") or ""))
    if model_difference:
        found.append(model_difference)
    here_settings, there_settings = here.get("settings") or {}, there.get("settings") or {}
    for name in COMPARED_SETTINGS:
        value = here_settings.get(name, SETTINGS_BEFORE_THEY_EXISTED.get(name))
        if name in there_settings:
            other = there_settings[name]
        elif name in SETTINGS_BEFORE_THEY_EXISTED:
            other = SETTINGS_BEFORE_THEY_EXISTED[name]
        else:
            found.append({"what": name, "here": value, "there": None, "note": "not recorded in the baseline"})
            continue
        if value != other:
            found.append({"what": name, "here": value, "there": other})
    here_blocks = _apc_on_block_sizes(here.get("servers") or [])
    there_blocks = _apc_on_block_sizes(there.get("servers") or [])
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
    rows: list[dict[str, Any]],
    old_rows: dict[tuple[str, int], dict[str, Any]],
    tolerances: Mapping[str, tuple[str, float]],
    baseline: str,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each of ``rows`` that the baseline has, metric by metric; and the failure messages of regressions."""
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


class UnreadableResults(Exception):
    """A results file that cannot be read, or is not a JSON object; the message says which and why."""


def read_results(path: Path, role: str = "results file") -> dict[str, Any]:
    """A results file as a dict; :class:`UnreadableResults` names ``role`` (e.g. "baseline") and the path."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UnreadableResults(f"cannot read {role} {path}: {err}") from err
    if not isinstance(doc, dict):
        raise UnreadableResults(f"{role} {path} is not a pytest-apc results file (not a JSON object)")
    return doc


def tolerances_of(doc: Mapping[str, Any]) -> dict[str, tuple[str, float]]:
    """The baseline tolerances a results file ran with (``settings.baseline_tolerance``, whose pairs JSON
    stores as lists); where it has none, the default of its profile. Metrics it lacks keep their defaults."""
    found: dict[str, tuple[str, float]] = dict(default_for("baseline_tolerance", doc.get("profile")))
    stored = (doc.get("settings") or {}).get("baseline_tolerance")
    if isinstance(stored, dict):
        for metric, value in stored.items():
            if metric in found and isinstance(value, (list, tuple)) and len(value) == 2:
                found[metric] = (str(value[0]), float(value[1]))
    return found


def compare_documents(
    old: Mapping[str, Any], new: Mapping[str, Any], baseline: str, tolerances: Mapping[str, tuple[str, float]]
) -> Gate:
    """The gate's rules: results document ``new`` against the baseline document ``old`` (read from
    ``baseline``, which the messages name). Refused (a failure) when the baseline has no pairs, ``new`` has
    none, they were measured under other conditions, or they share no row; a row of ``new`` the baseline
    lacks, while others overlap, is a warning (``Gate.warnings``). Rows of hash-algorithm servers (kept
    among the pairs by schema_version 1) and fleet runs (no OFF partner) are not gated; a refusal for want of
    pairs names the fleet runs a document has instead."""
    gate = Gate(baseline=baseline)
    if not old.get("pairs"):
        why = _not_gated(old, "its") or " (an incomplete run?)"
        gate.failures.append(f"baseline {baseline} has no measured pairs to compare with{why}")
        return gate
    rows = [r for r in new.get("pairs") or [] if not r.get("hash_algo")]
    if not rows:
        gate.failures.append(f"nothing was measured to compare with baseline {baseline}{_not_gated(new, 'the')}")
        return gate
    gate.not_comparable = differences(new, old)
    if gate.not_comparable:
        gate.failures.append(f"not comparable with baseline {baseline}: {_difference_text(gate.not_comparable)}")
        return gate
    old_rows = {(r["pair"], r["concurrency"]): r for r in old["pairs"] if not r.get("hash_algo")}
    gate.rows, gate.failures = compare_rows(rows, old_rows, tolerances, baseline)
    if not gate.rows:
        gate.failures.append(
            f"no row of this run is in baseline {baseline}: this run has {_row_names(rows)}; "
            f"the baseline has {_row_names(old_rows.values())}"
        )
        return gate
    gate.warnings = [
        f"baseline {baseline} has no row {row['pair']} c{row['concurrency']}: not compared"
        for row in rows
        if (row["pair"], row["concurrency"]) not in old_rows
    ]
    return gate


def _not_gated(doc: Mapping[str, Any], whose: str) -> str:
    """``: the fleet runs (R-c8-round_robin) are not gated ...`` for a document with fleet runs; else ""."""
    ids = fleet_run_ids(doc)  # the fleet rows' runs too: every fleet run is in runs[] with its route
    if not ids:
        return ""
    return f": {whose} fleet runs ({', '.join(ids)}) are not gated (the gate compares OFF/ON pair rows only)"


def session_document(apc: ApcSession, data: ReportData) -> dict[str, Any]:
    """What the gate reads of this session, as its results.json will hold it."""
    return {
        "profile": apc.settings.profile,
        "model": apc.json_model(),
        "settings": apc.settings.as_dict(),
        "servers": [dict(info.__dict__) for info in apc.measured.servers.values()],
        "pairs": data.pair_numbers(),
        "fleet": data.fleet_numbers(),
    }


def compare_baseline(apc: ApcSession, data: ReportData, baseline_path: Path) -> Gate:
    """This run against a stored results file (``--apc-baseline``), by :func:`compare_documents`; a file
    that cannot be read is a failure of the gate. The gate's warnings become the session's."""
    try:
        old = read_results(baseline_path, "baseline")
    except UnreadableResults as err:
        return Gate(baseline=str(baseline_path), failures=[str(err)])
    gate = compare_documents(old, session_document(apc, data), str(baseline_path), apc.settings.baseline_tolerance)
    apc.measured.warnings.extend(gate.warnings)
    return gate
