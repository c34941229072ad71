"""The baseline gate: this run against a stored results file (``--apc-baseline``), and one results file
against another (``python -m pytest_apc compare``), by the same rules (:func:`compare_documents`).

Each run both files have (``C-c8``, ``D-c8``, ...) is judged on two things:

* **mean TTFT (median of the cold repeats)** (:mod:`pytest_apc.gate.noise`): a regression when it rose
  beyond the limit that the run-to-run noise allows, so that a build that did not change fails the whole
  gate with probability at most ``--apc-set baseline_false_alarm`` (split over the runs judged);
* **cached tokens** (APC-on runs): exact; fewer than the baseline's is a regression.

The gate also fails (refuses) when the baseline was measured under conditions that make its numbers
incomparable (profile, model, workload, block size, GPU model or count, parallel layout, dtype), holds a
calibration without a usable spread, has fewer repeats of a run than the rule needs (the run's row says
``refused``), or shares no run with this one; :mod:`pytest_apc.gate.baseline` applies these refusals before
a gated run measures. Another vLLM or torch version is compared, and named. Every compared run is kept,
passing or not, so the terminal and ``results.json`` show what the gate looked at. Documents come as
:class:`~pytest_apc.results.reader.Results` (read and checked) or as this session's own document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.config import model_path_for_display
from pytest_apc.gate import noise
from pytest_apc.measure.provenance import layouts
from pytest_apc.measure.records import RunRecord
from pytest_apc.results.formatting import num, percent
from pytest_apc.results.reader import Document, Results

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
# The version the generated models' names encode: tiny-llama-v2-<digest>, llama-3.1-8b-shape-v2-<digest>.
_GENERATED_VERSION = re.compile(r"^(?P<kind>.+)-v(?P<version>\d+)-[0-9a-f]+$")
# Versions of the software under test: what a release gate compares, so a difference is named, not refused.
VERSIONS = ("vllm", "torch")
# vLLM releases whose benchmark measures differently from the release before: a metric that moves across one
# may have moved with the benchmark's definition, not with the server (each the first release with it).
BENCHMARK_CHANGES = (
    (
        (0, 33),
        "vLLM 0.33's benchmark starts the chat TTFT at the first chunk that carries output (a role-only chunk "
        "no longer counts) and ends the latency at the last token chunk",
    ),
)
# A compared run's result: ok, a regressed metric, or its TTFT refused (too few repeats; cached tokens compared).
REGRESSED, REFUSED = "REGRESSED", "refused"


@dataclass
class Gate:
    """What the gate decided: failures fail the session; rows are every compared run, passing or not."""

    baseline: str | None = None
    failures: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    not_comparable: list[dict[str, Any]] = field(default_factory=list)  # {"what", "here", "there"}
    changes: list[dict[str, Any]] = field(default_factory=list)  # versions that differ: compared, and named
    rule: dict[str, Any] = field(default_factory=dict)  # what the gate applied (the statistic, K, alpha)
    warnings: list[str] = field(default_factory=list)  # runs of this run the baseline lacks (not in to_json)
    nothing_measured: bool = False  # this run has no run the gate judges: its failure is no refusal (not in to_json)

    @property
    def compared(self) -> int:
        return len(self.rows)

    @property
    def regressed(self) -> int:
        return sum(1 for row in self.rows if row["result"] == REGRESSED)

    @property
    def refused(self) -> int:
        """Compared runs whose TTFT the gate refused to judge (too few repeats on a side): each a failure."""
        return sum(1 for row in self.rows if row["result"] == REFUSED)

    @property
    def refused_to_judge(self) -> bool:
        """Failed without a regression while this run has runs to judge: the baseline cannot judge them (other
        conditions, too few repeats, no run in common, an unusable calibration, no runs of its own)."""
        return bool(self.failures) and not self.regressed and not self.nothing_measured

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "failures": self.failures,
            "compared": self.compared,
            "regressed": self.regressed,
            "refused": self.refused,
            "not_comparable": self.not_comparable,
            "changes": self.changes,
            "rule": self.rule,
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


def _gpus(doc: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """GPU model and count a results document ran with; (None, None) when nothing was recorded."""
    env = doc.get("environment") or {}
    if "gpu_count" in env:
        return env.get("gpu_model"), int(env["gpu_count"])
    return None, None


def _hardware_differences(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[dict[str, Any]]:
    """GPU model and count, and each server's parallel layout and precision, where both sides recorded them."""
    found: list[dict[str, Any]] = []
    for what, mine, theirs in zip(("gpu_model", "gpu_count"), _gpus(here), _gpus(there), strict=True):
        if mine is not None and theirs is not None and mine != theirs:
            found.append({"what": what, "here": mine, "there": theirs})
    here_layout, there_layout = layouts(here.get("servers") or []), layouts(there.get("servers") or [])
    for mode in sorted(here_layout.keys() & there_layout.keys()):
        for key, mine_value in here_layout[mode].items():
            theirs_value = there_layout[mode].get(key)
            if mine_value is not None and theirs_value is not None and mine_value != theirs_value:
                found.append({"what": f"{key} ({mode})", "here": mine_value, "there": theirs_value})
    return found


def differences(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What makes the numbers of results document ``here`` (this run) incomparable with those of ``there``
    (the baseline), one entry per difference. Each document needs ``profile``, ``model``, ``settings`` and
    ``servers`` as results.json holds them; ``environment`` where it has one."""
    found: list[dict[str, Any]] = []
    if here.get("profile") != there.get("profile"):
        found.append({"what": "profile", "here": here.get("profile"), "there": there.get("profile")})
    model_difference = _model_difference(str(here.get("model") or ""), str(there.get("model") or ""))
    if model_difference:
        found.append(model_difference)
    here_settings, there_settings = here.get("settings") or {}, there.get("settings") or {}
    for name in COMPARED_SETTINGS:
        value = here_settings.get(name)
        if name not in there_settings:
            found.append({"what": name, "here": value, "there": None, "note": "not recorded in the baseline"})
            continue
        other = there_settings[name]
        if value != other:
            found.append({"what": name, "here": value, "there": other})
    here_blocks = _apc_on_block_sizes(here.get("servers") or [])
    there_blocks = _apc_on_block_sizes(there.get("servers") or [])
    for mode in sorted(here_blocks.keys() & there_blocks.keys()):
        if here_blocks[mode] != there_blocks[mode]:
            what = "block_size" if mode == "apc-on" else f"block_size ({mode})"
            found.append({"what": what, "here": here_blocks[mode], "there": there_blocks[mode]})
    return found + _hardware_differences(here, there)


def version_changes(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The versions of vLLM and torch that differ (where both sides recorded them): compared, and named; a vLLM
    change across a release whose benchmark measures differently carries that as its note."""
    here_env, there_env = here.get("environment") or {}, there.get("environment") or {}
    changes = []
    for name in VERSIONS:
        mine, theirs = here_env.get(name), there_env.get(name)
        if mine and theirs and mine != theirs:
            change = {"what": name, "here": mine, "there": theirs}
            notes = benchmark_changes(str(mine), str(theirs)) if name == "vllm" else []
            if notes:
                change["note"] = "; ".join(notes)
            changes.append(change)
    return changes


def benchmark_changes(here: str, there: str) -> list[str]:
    """What vLLM's benchmark measures differently between two vLLM versions (``BENCHMARK_CHANGES``)."""
    releases = [tuple(int(part) for part in found.groups()) for v in (here, there) if (found := _RELEASE.match(v))]
    if len(releases) != 2:
        return []
    low, high = sorted(releases)
    return [what for release, what in BENCHMARK_CHANGES if low < release <= high]


_RELEASE = re.compile(r"(\d+)\.(\d+)")


def difference_text(differences_: list[dict[str, Any]]) -> str:
    """``num_prompts 30 here vs 10 there; block_size 16 vs 128``: the first names the sides, the rest follow."""
    parts = []
    for i, d in enumerate(differences_):
        here, there = ("-" if d["here"] in (None, "") else d["here"]), ("-" if d["there"] in (None, "") else d["there"])
        text = f"{d['what']} {here} here vs {there} there" if i == 0 else f"{d['what']} {here} vs {there}"
        if d.get("note"):
            text += f" ({d['note']})"
        parts.append(text)
    return "; ".join(parts)


def not_comparable(baseline: str, found: list[dict[str, Any]]) -> str:
    """The refusal of a baseline measured under other conditions (:func:`differences`)."""
    return f"not comparable with baseline {baseline}: {difference_text(found)}"


def unusable_calibration(baseline: str, why: str) -> str:
    """The refusal of a baseline whose stored calibration cannot give a limit (:meth:`noise.Calibration.unusable`)."""
    return (
        f"baseline {baseline} holds a calibration the gate cannot use: {why} (calibrate it again: "
        f"python -m pytest_apc calibrate RESULTS... --write {baseline})"
    )


def too_few_repeats(baseline: str, run_ids: str, repeats: int | None, min_repeats: int) -> str:
    """The refusal of baseline runs with fewer cold repeats than the rule needs (None: no per-repeat TTFT)."""
    return (
        f"baseline {baseline} has {_repeats_text(repeats)} of {run_ids}; the gate needs {min_repeats} or more "
        f"(measure the baseline with --apc-repeats {min_repeats})"
    )


def no_shared_run(baseline: str, here: Any, there: Any) -> str:
    """The refusal of a baseline that has none of this run's runs (run ids ``here`` and ``there``)."""
    return (
        f"no run of this run is in baseline {baseline}: this run has {_run_names(here)}; "
        f"the baseline has {_run_names(there)}"
    )


def _run_names(ids: Any) -> str:
    return ", ".join(sorted(ids)) or "none"


def _hits(run: RunRecord) -> list[int] | None:
    """The prefix-cache hits of every repeat of an APC-on run; None for an OFF run or missing counters."""
    if not run.key.apc:
        return None
    hits = [rep.delta.prefix_cache_hits if rep.delta else None for rep in run.repeats]
    known = [int(h) for h in hits if h is not None]
    if hits and len(known) == len(hits):
        return known
    first = run.delta.prefix_cache_hits if run.delta else None  # files that kept only the first repeat's counters
    return None if first is None else [int(first)]


def calibration_of(doc: Results) -> noise.Calibration | None:
    """The calibration ``calibrate --write`` stored in a results file, if any."""
    stored = doc.data.get("calibration")
    return noise.Calibration.from_json(stored) if isinstance(stored, Mapping) else None


def noise_for(run_id: str, baseline_doc: Results, baseline: str) -> noise.Noise:
    """The noise the gate assumes for one run: the baseline's calibration where it measured the run, else
    the default of the baseline's profile."""
    default = noise.PROFILE_NOISE.get(str(baseline_doc.data.get("profile")), noise.PROFILE_NOISE["gpu"])
    calibration = calibration_of(baseline_doc)
    if calibration is None:
        return default
    within_df = min((row.within_df for row in calibration.rows.values()), default=0)
    source = (
        f"the calibration in {baseline} ({len(calibration.files)} results files; {_freedom(calibration.between_df)} "
        f"between runs, {within_df} or more within a run)"
    )
    return calibration.noise(run_id, default, source)


def _freedom(df: int) -> str:
    return f"{df} degree{'s' * (df != 1)} of freedom"


def _ttft_metric(before: list[float], now: list[float], spread: noise.Noise, alpha: float) -> dict[str, Any]:
    was, current = noise.k_center(before), noise.k_center(now)
    limit = spread.limit(len(before), len(now), alpha)
    regressed = current / was > limit
    return {
        "metric": "ttft",
        "label": noise.STATISTIC_LABEL,
        "was": was,
        "now": current,
        "change": current / was,
        "limit": was * limit,
        "allowed": limit,
        "detectable": spread.detectable(len(before), len(now), alpha),
        "within": spread.within,
        "between": spread.between,
        "noise": spread.source,
        "result": "REGRESSED" if regressed else "ok",
    }


def _observed_spread_warning(run_id: str, before: list[float], now: list[float], assumed: noise.Noise) -> str | None:
    """A warning when the repeats of the two runs spread far more than the noise the limit assumes (twice
    the assumed within-run spread, with at least 4 degrees of freedom): the node is noisier than measured."""
    observed = noise.spread([before, now])
    if observed.within is None or observed.within_df < 4 or observed.within <= 2 * assumed.within:
        return None
    return (
        f"{run_id}: its repeats spread {observed.within:.1%} (within a run), more than twice the "
        f"{assumed.within:.1%} the limit assumes ({assumed.source}): the gate's false-alarm rate is not what it "
        "says on this node; calibrate it (python -m pytest_apc calibrate)"
    )


def _count(values: list[float] | None) -> int | None:
    return None if values is None else len(values)


def _repeats_text(repeats: int | None) -> str:
    return "no per-repeat TTFT" if repeats is None else f"{repeats} cold repeat{'s' * (repeats != 1)}"


def compare_runs(
    new_runs: Mapping[str, RunRecord],
    old_runs: Mapping[str, RunRecord],
    baseline_doc: Results,
    baseline: str,
    false_alarm: float,
    min_repeats: int,
) -> tuple[list[dict[str, Any]], list[str], list[str], dict[str, Any]]:
    """Every run of ``new_runs`` that the baseline has: (rows, failures, warnings, rule)."""
    shared = [run_id for run_id in sorted(new_runs) if run_id in old_runs]
    values = {
        run_id: (noise.repeat_values(old_runs[run_id]), noise.repeat_values(new_runs[run_id])) for run_id in shared
    }
    failures: list[str] = []
    judged = []
    for run_id, (before, now) in values.items():
        if before is None or len(before) < min_repeats:
            failures.append(too_few_repeats(baseline, run_id, _count(before), min_repeats))
        elif now is None or len(now) < min_repeats:
            failures.append(
                f"this run has {_repeats_text(_count(now))} of {run_id}; the gate needs {min_repeats} or more against "
                f"baseline {baseline}"
            )
        else:
            judged.append(run_id)
    alpha = false_alarm / max(1, len(judged))
    # What the repeats cost: every judged run's benchmark time here, and how much of it one repeat each would save.
    seconds = {
        run_id: [float(rep.bench.get("duration") or 0.0) for rep in new_runs[run_id].repeats] for run_id in judged
    }
    rule = {
        "benchmark_s": sum(sum(d) for d in seconds.values()),
        "extra_s": sum(sum(d) - sum(d) / len(d) for d in seconds.values() if d),
        "statistic": noise.STATISTIC,
        "label": noise.STATISTIC_LABEL,
        "false_alarm": false_alarm,
        "runs_judged": len(judged),
        "alpha_per_run": alpha,
        "min_repeats": min_repeats,
    }
    rows, warnings = [], []
    for run_id in shared:
        metrics = []
        before, now = values[run_id]
        if run_id in judged and before and now:
            spread = noise_for(run_id, baseline_doc, baseline)
            metric = _ttft_metric(before, now, spread, alpha)
            metrics.append(metric)
            if metric["result"] != "ok":
                failures.append(
                    f"{run_id}: {noise.STATISTIC_LABEL} {num(metric['was'])} -> {num(metric['now'])} ms "
                    f"({percent(metric['change'])}) is above the limit {num(metric['limit'])} ms "
                    f"({percent(metric['allowed'])} at {len(before)}/{len(now)} repeats; false alarm {alpha:.2%}) "
                    f"against {baseline}"
                )
            warning = _observed_spread_warning(run_id, before, now, spread)
            if warning:
                warnings.append(warning)
        old_hits, new_hits = _hits(old_runs[run_id]), _hits(new_runs[run_id])
        if old_hits is not None and new_hits is not None:
            regressed = min(new_hits) < min(old_hits)
            metrics.append(
                {
                    "metric": "cached_tokens",
                    "label": "cached tokens",
                    "was": min(old_hits),
                    "now": min(new_hits),
                    "limit": min(old_hits),
                    "result": "REGRESSED" if regressed else "ok",
                }
            )
            if regressed:
                failures.append(
                    f"{run_id}: cached tokens {num(min(old_hits))} -> {num(min(new_hits))} (fewest of any repeat) "
                    f"fell by {num(min(old_hits) - min(new_hits))} against {baseline}"
                )
        result = REGRESSED if any(m["result"] == REGRESSED for m in metrics) else "ok" if run_id in judged else REFUSED
        repeats = [len(before or []), len(now or [])]
        rows.append({"run": run_id, "repeats": repeats, "metrics": metrics, "result": result})
    return rows, failures, warnings, rule


def compare_documents(old: Document, new: Document, baseline: str, false_alarm: float, min_repeats: int) -> Gate:
    """The gate's rules: results document ``new`` against the baseline document ``old`` (read from
    ``baseline``, which the messages name). Refused (a failure) when the baseline has no runs, ``new`` has
    none, they were measured under other conditions, or they share no run; a run of ``new`` the baseline
    lacks, while others overlap, is a warning (``Gate.warnings``). Fleet runs (case R) and the offload and
    multi-turn runs are not gated; a refusal for want of runs names those a document has instead."""
    old, new = Results.of(old), Results.of(new)
    gate = Gate(baseline=baseline)
    old_runs, new_runs = noise.gated_runs(old), noise.gated_runs(new)
    if not old_runs:
        why = _not_gated(old, "its") or " (an incomplete run?)"
        gate.failures.append(f"baseline {baseline} has no measured runs to compare with{why}")
        return gate
    if not new_runs:
        gate.nothing_measured = True
        gate.failures.append(f"nothing was measured to compare with baseline {baseline}{_not_gated(new, 'the')}")
        return gate
    gate.not_comparable = differences(new.data, old.data)
    if gate.not_comparable:
        gate.failures.append(not_comparable(baseline, gate.not_comparable))
        return gate
    calibration = calibration_of(old)
    unusable = calibration.unusable() if calibration is not None else None
    if unusable:
        gate.failures.append(unusable_calibration(baseline, unusable))
        return gate
    gate.changes = version_changes(new.data, old.data)
    gate.rows, gate.failures, gate.warnings, gate.rule = compare_runs(
        new_runs, old_runs, old, baseline, false_alarm, min_repeats
    )
    if not gate.rows:
        gate.failures.append(no_shared_run(baseline, new_runs, old_runs))
        return gate
    gate.warnings += [
        f"baseline {baseline} has no run {run_id}: not compared"
        for run_id in sorted(new_runs)
        if run_id not in old_runs
    ]
    return gate


def _not_gated(doc: Results, whose: str) -> str:
    """``: the fleet runs (R-c8-round_robin) are not gated ...`` for a document with runs the gate does not
    judge (fleet runs; offload and multi-turn runs), naming them; else ""."""
    fleet = [run.key.id for run in doc.runs if run.key.route]
    tiers = [run.key.id for run in doc.runs if not run.key.route and run.key.family in noise.NOT_GATED_FAMILIES]
    parts = []
    if fleet:
        parts.append(
            f"{whose} fleet runs ({', '.join(fleet)}) are not gated (the gate compares single-server runs only)"
        )
    if tiers:
        parts.append(
            f"{whose} offload and multi-turn runs ({', '.join(tiers)}) are not gated "
            "(the gate compares cases A to F only)"
        )
    return ": " + "; ".join(parts) if parts else ""
