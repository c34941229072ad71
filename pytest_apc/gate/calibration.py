"""``python -m pytest_apc calibrate``: the run-to-run noise of several results files of one build, what it
means for the baseline gate, and a check of the gate's rule on those very files.

The noise itself is :mod:`pytest_apc.gate.noise`; this module reads the files, prints the table and the checks,
and stores a calibration in a baseline results file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from pytest_apc.gate import compare, noise
from pytest_apc.results import document
from pytest_apc.results.formatting import num, percent
from pytest_apc.results.reader import Results


class NotCalibratable(ValueError):
    """Files that cannot measure a run-to-run spread; the message says what is missing."""


@dataclass(frozen=True)
class Check:
    """How often the rule failed pairs of K-sets: same-build pairs (false alarms) or slowed ones (detection)."""

    run_id: str
    pairs: int
    failed: int
    noise: str  # which noise the rule assumed

    @property
    def rate(self) -> float:
        return self.failed / self.pairs if self.pairs else 0.0


@dataclass(frozen=True)
class Found:
    calibration: noise.Calibration
    lines: list[str]
    failed: bool  # the same-build check failed more often than the false-alarm probability allows


def check(
    run_id: str,
    base: Sequence[Sequence[float]],
    new: Sequence[Sequence[float]],
    k: int,
    spread: noise.Noise,
    alpha: float,
    *,
    same_build: bool,
) -> Check:
    """The rule applied to every (baseline K-set, new K-set) pair (:func:`noise.kset_pairs`)."""
    pairs = failed = 0
    for before, now in noise.kset_pairs(base, new, k, same_build=same_build):
        pairs += 1
        failed += noise.fails(before, now, spread, alpha)
    return Check(run_id, pairs, failed, spread.source)


def _spread_cell(row: noise.Spread | None, between: float | None) -> str:
    if row is None or row.within is None:
        return "-"
    return f"{row.within:.1%} / {'-' if between is None else f'{between:.1%}'}"


def report(
    files: Sequence[Results],
    k: int,
    false_alarm: float,
    slower: Sequence[Results] = (),
    baseline: Results | None = None,
) -> Found:
    """Calibrate on ``files`` (results files of one build) for gated runs of ``k`` repeats; check the rule
    on them, and on ``slower`` (the same runs with a known slowdown) for what it detects. :class:`NotCalibratable`
    before anything is computed when they (with ``baseline``, where the calibration is to be stored) were
    not measured alike, or when the noise cannot be measured from them."""
    docs = [(doc.name, doc) for doc in files]
    comparable(files, [*slower, *([baseline] if baseline is not None else [])])
    groups = noise.repeat_groups(docs)
    calibration = noise.Calibration.of(groups, [name for name, _ in docs], noise.STATISTIC)
    if not any(len(g) >= 2 for g in groups.values()):
        raise NotCalibratable(
            "calibrate needs at least two results files that measured the same run (each file one pytest run, "
            f"with per-repeat TTFT); got {len(docs)} file(s) with runs "
            f"{', '.join(f'{r} x{len(g)}' for r, g in sorted(groups.items())) or 'none'}"
        )
    unusable = calibration.unusable()
    if unusable:  # what --write would store, and the gate refuse
        raise NotCalibratable(
            f"calibrate cannot measure the noise of these files: {unusable}; it needs 2 or more cold repeats of "
            "each run in each file, and a run in 2 or more files (measure them with --apc-repeats 3)"
        )
    profile = str(files[0].data.get("profile"))
    default = noise.PROFILE_NOISE.get(profile, noise.PROFILE_NOISE["gpu"])
    alpha = false_alarm / len(groups)
    measured_source = f"this calibration ({len(docs)} files)"
    medians, durations = noise.calibrate(docs, "median_ttft_ms"), noise.calibrate(docs, "duration_s")
    body = []
    for run_id in sorted(groups):
        row = calibration.rows[run_id]
        spread = calibration.noise(run_id, default, measured_source)
        body.append([
            run_id, row.runs, row.repeats, num(row.mean),
            _spread_cell(row, calibration.between), percent(spread.limit(k, k, alpha)),
            percent(spread.detectable(k, k, alpha)),
            _spread_cell(medians.rows.get(run_id), medians.between),
            _spread_cell(durations.rows.get(run_id), durations.between),
        ])  # fmt: skip
    headers = ["run", "files", "repeats", "mean TTFT ms", "spread within / between", f"limit at K={k}",
               "catches (95%)", "median TTFT: within / between", "duration: within / between"]  # fmt: skip
    between = "-" if calibration.between is None else f"{calibration.between:.1%}"
    lines = [
        f"calibrate: {len(docs)} results files of one build; the gate judges {noise.STATISTIC_LABEL}; "
        f"K = {k} repeats on each side; false alarm {false_alarm:.0%} over {len(groups)} runs ({alpha:.2%} each)",
        tabulate(body, headers=headers, disable_numparse=True),
        f"between-run spread, pooled over every run: {between} ({calibration.between_df} degrees of freedom); "
        f"the profile's default assumes {default.within:.1%} within / {default.between:.1%} between",
    ]
    false_alarms: list[Check] = []
    for spread_of in (lambda run_id: calibration.noise(run_id, default, measured_source), lambda _: default):
        for run_id in sorted(groups):
            if len(groups[run_id]) >= 2 and all(len(g) >= k for g in groups[run_id]):
                found = check(run_id, groups[run_id], groups[run_id], k, spread_of(run_id), alpha, same_build=True)
                false_alarms.append(found)
    lines += [
        f"same build, {c.run_id}: {c.failed} of {c.pairs} pairs of {k}-repeat sets from two different files "
        f"failed ({c.rate:.1%}), noise from {c.noise}"
        for c in false_alarms
    ]
    for doc in slower:  # each file its own slowdown
        name = doc.name
        for run_id, slow in sorted(noise.repeat_groups([(name, doc)]).items()):
            if run_id not in groups:
                continue
            slowdown = noise.geometric_mean([v for g in slow for v in g]) / calibration.rows[run_id].mean
            for spread in (calibration.noise(run_id, default, measured_source), default):
                found = check(run_id, groups[run_id], slow, k, spread, alpha, same_build=False)
                lines.append(
                    f"slower build, {run_id} in {name} ({percent(slowdown)}): caught in {found.failed} of "
                    f"{found.pairs} pairs ({found.rate:.1%}), noise from {found.noise}"
                )
    # The rule checked on its own data: the gate's false alarms are the sum over the runs it judges.
    failed = sum(c.rate for c in false_alarms if c.noise == measured_source) > false_alarm
    return Found(calibration, lines, failed)


def comparable(files: Sequence[Results], others: Sequence[Results]) -> None:
    """:class:`NotCalibratable` unless every file, and each of ``others`` (``--slower``, the ``--write``
    baseline), was measured under the conditions of the first, by the gate's own rule
    (:func:`compare.differences`): the noise of a CPU run against a GPU run is no noise of either."""
    first = files[0]
    for doc in [*files[1:], *others]:
        found = compare.differences(doc.data, first.data)
        if found:
            raise NotCalibratable(
                f"{doc.name} is not comparable with {first.name} (the gate's rule): {compare.difference_text(found)}; "
                "calibrate runs of one build, measured alike on one kind of node"
            )


def store(path: Path, doc: Results, calibration: noise.Calibration) -> None:
    """Write results document ``doc`` to ``path`` with ``calibration`` in it (atomically)."""
    document.write(path, document.with_blocks(doc.data, {"calibration": calibration.to_json()}))
