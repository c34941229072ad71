"""How much a run's TTFT moves when nothing changed, and the limit of the baseline gate that follows.

The gate judges each run on its **mean TTFT over the run's requests, one value per cold repeat**: the
repeat is the unit of noise, because the requests of one repeat move together (they arrive in waves and
share the server's state). A run's value is the **median of its repeats' values**, so that one repeat
slowed by something outside the build (a noisy neighbour, a hiccup of the machine) does not decide it
(with 3 repeats or more). Two sources of noise are modelled, both relative (on a log scale):

* ``within``: between the cold repeats of one run;
* ``between``: between runs of the same build (another pytest run, another server start, the machine's
  state that day), which more repeats cannot average away.

A run's value (the median of its K repeats' logs) then has variance ``between^2 + within^2*m(K)``, with
``m(K)`` the variance of the median of K standard normal values (1/K for K <= 2, about pi/(2K) for large
K), and the difference between a baseline of ``K_b`` repeats and a new run of ``K_n`` has standard
deviation ``sd = sqrt(2*between^2 + within^2*(m(K_b) + m(K_n)))``. The gate fails a run whose value rose
by more than ``exp(z*sd)``, with ``z`` the normal quantile of ``1 - alpha/n``: ``alpha`` is the false-alarm
probability of the whole gate, split over the ``n`` runs it judges, so an unchanged build fails it with
probability at most alpha.

The two spreads come from ``python -m pytest_apc calibrate`` over several results files of one build,
stored in the baseline; without a calibration, from the profile's default (:data:`PROFILE_NOISE`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from statistics import NormalDist
from typing import Any

import numpy as np

from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.results.reader import Document, Results

# The per-repeat value the gate judges (runs[].repeat_counters[].mean_ttft_ms).
STATISTIC = "mean_ttft_ms"
STATISTIC_LABEL = "mean TTFT (median of the cold repeats)"
# The power at which "the smallest regression the gate catches" is stated.
POWER = 0.95


@dataclass(frozen=True)
class Noise:
    """Relative spreads (standard deviations of the log) of a run's per-repeat value, and where they come from."""

    within: float
    between: float
    source: str

    def sd(self, k_base: int, k_new: int) -> float:
        """Standard deviation of log(new value) - log(baseline value) for two runs of one build."""
        return math.sqrt(2 * self.between**2 + self.within**2 * (median_variance(k_base) + median_variance(k_new)))

    def limit(self, k_base: int, k_new: int, alpha: float) -> float:
        """The highest ratio new/baseline that is not a regression, at false-alarm probability ``alpha``."""
        return math.exp(z(alpha) * self.sd(k_base, k_new))

    def detectable(self, k_base: int, k_new: int, alpha: float, power: float = POWER) -> float:
        """The smallest slowdown (a ratio) that the gate fails with probability ``power``."""
        return math.exp((z(alpha) + NormalDist().inv_cdf(power)) * self.sd(k_base, k_new))


def z(alpha: float) -> float:
    """The one-sided normal quantile of 1 - alpha."""
    return NormalDist().inv_cdf(1 - alpha)


@functools.cache
def median_variance(k: int) -> float:
    """The variance of the median of ``k`` independent standard normal values (numerical integration of
    the order statistics' density; for even ``k`` the mean of the middle two)."""
    x = np.linspace(-8.0, 8.0, 1601)
    dx = float(x[1] - x[0])
    cdf = np.array([NormalDist().cdf(float(v)) for v in x])
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    m = k // 2
    if k % 2:
        density = math.comb(k, m) * (m + 1) * cdf**m * (1 - cdf) ** m * pdf
        return float((x * x * density).sum() * dx)
    if k == 2:
        return 0.5
    # X_(m) at x below X_(m+1) at y: m-1 values under x, m-1 above y.
    weight = k * (k - 1) * math.comb(k - 2, m - 1)
    joint = weight * np.outer(cdf ** (m - 1) * pdf, (1 - cdf) ** (m - 1) * pdf)
    joint = np.triu(joint, 1) + np.diag(np.diag(joint)) / 2
    middle = (x[:, None] + x[None, :]) / 2
    return float((middle * middle * joint).sum() * dx * dx)


# Measured with the suite's own workload and read back by ``calibrate`` from committed results files
# (tests/test_docs.py checks that these are what those files give): same-build runs on one H200 (vLLM
# 0.26.0, an 8B-shaped model) and on the 2-core CPU machine CI runs on.
PROFILE_NOISE = {
    "gpu": Noise(within=0.028, between=0.024, source="the gpu profile's default (measured on one H200)"),
    "cpu": Noise(within=0.178, between=0.136, source="the cpu profile's default (measured on a 2-core CPU machine)"),
}


# What each statistic calibrate reads is, per repeat.
_PER_REPEAT: dict[str, Callable[[Repeat], Any]] = {
    STATISTIC: lambda rep: rep.ttft_ms("mean"),
    "median_ttft_ms": lambda rep: rep.ttft_ms("median"),
    "duration_s": lambda rep: rep.bench.get("duration"),
}


def repeat_values(run: RunRecord, statistic: str = STATISTIC) -> list[float] | None:
    """One value per cold repeat of a run; None when not every repeat has one. Files before
    schema_version 4 kept no per-repeat TTFT: their mean TTFT per repeat is read from the pooled
    per-request TTFTs when they split evenly (:meth:`RunRecord.from_json`)."""
    values = [_PER_REPEAT[statistic](rep) for rep in run.repeats]
    if values and all(isinstance(v, (int, float)) and v > 0 for v in values):
        return [float(v) for v in values]
    return None


def geometric_mean(values: Sequence[float]) -> float:
    """Many repeats pooled (a slowdown over whole files, a calibration row's level), in the values' unit."""
    return float(np.exp(np.mean(np.log(values))))


def k_center(values: Sequence[float]) -> float:
    """The run's value over its repeats: the median of their logs, in the values' unit (ms)."""
    return float(np.exp(np.median(np.log(values))))


@dataclass(frozen=True)
class Spread:
    """Within- and between-run spread of one run id, from several runs of one build (one-way random effects)."""

    runs: int
    repeats: int
    mean: float  # geometric mean of every repeat, in the statistic's unit
    within: float | None  # pooled SD of the log between repeats of one run; None without two repeats in a run
    within_df: int
    between_var: float | None  # (MSB - MSW)/n0: may be negative; None with fewer than two runs
    between_df: int

    @property
    def between(self) -> float | None:
        return None if self.between_var is None else math.sqrt(max(0.0, self.between_var))


def spread(groups: Sequence[Sequence[float]]) -> Spread:
    """The spread of per-repeat values grouped by run (each group one run's repeats)."""
    logs = [np.log(np.asarray(g, dtype=float)) for g in groups if len(g)]
    n_total, n_runs = sum(len(g) for g in logs), len(logs)
    within_df = n_total - n_runs
    ss_within = sum(float(((g - g.mean()) ** 2).sum()) for g in logs)
    within = math.sqrt(ss_within / within_df) if within_df > 0 else None
    everything = np.concatenate(logs) if logs else np.array([])
    between_var = None
    if n_runs >= 2 and within is not None:
        grand = float(everything.mean())
        msb = sum(len(g) * (float(g.mean()) - grand) ** 2 for g in logs) / (n_runs - 1)
        n0 = (n_total - sum(len(g) ** 2 for g in logs) / n_total) / (n_runs - 1)
        between_var = (msb - within**2) / n0
    mean = float(np.exp(everything.mean())) if everything.size else float("nan")
    return Spread(n_runs, n_total, mean, within, within_df, between_var, n_runs - 1 if between_var is not None else 0)


_SPREAD_FIELDS = tuple(f.name for f in fields(Spread))


@dataclass
class Calibration:
    """What ``calibrate`` measured: each run id's within-run spread, and the between-run spread pooled over
    every run id (a property of the node and its server starts, so every row lends its runs to it)."""

    rows: dict[str, Spread]
    between: float | None
    between_df: int
    files: list[str] = field(default_factory=list)
    statistic: str = STATISTIC

    def noise(self, run_id: str, default: Noise, source: str) -> Noise:
        """The noise the gate assumes for ``run_id``: each spread this calibration (named ``source``)
        measured, the other from ``default``."""
        row = self.rows.get(run_id)
        within = row.within if row is not None else None
        between = self.between if self.between_df > 0 else None
        if within is None and between is None:
            return default
        if within is not None and between is not None:
            where = source
        else:
            measured = "within-run" if within is not None else "between-run"
            where = f"{source} ({measured} spread only), the rest from {default.source}"
        return Noise(
            within=default.within if within is None else within,
            between=default.between if between is None else between,
            source=where,
        )

    def unusable(self) -> str | None:
        """Why no limit can come from this calibration: a spread it did not measure (files with one cold
        repeat of a run, or no run in two files) or one that is not a positive finite number; None for one
        the gate can use."""
        if self.statistic != STATISTIC:
            return f"it measured {self.statistic}, and the gate judges {STATISTIC}"
        if not self.rows:
            return "it measured no run"
        for run_id, row in sorted(self.rows.items()):
            if row.within is None or not row.within_df:
                return f"it measured no spread between the cold repeats of {run_id} (0 degrees of freedom)"
            if not math.isfinite(row.within) or row.within <= 0:
                return f"its spread between the cold repeats of {run_id} is {row.within}"
        if self.between is None or not self.between_df:
            return "it measured no spread between runs (0 degrees of freedom: no run is in two of its files)"
        if not math.isfinite(self.between) or self.between < 0:
            return f"its spread between runs is {self.between}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "statistic": self.statistic,
            "files": self.files,
            "between": self.between,
            "between_df": self.between_df,
            "rows": {run_id: asdict(row) for run_id, row in sorted(self.rows.items())},
        }

    @classmethod
    def of(cls, groups: Mapping[str, Sequence[Sequence[float]]], files: list[str], statistic: str) -> Calibration:
        """From each run id's per-repeat values, one list per file (:func:`repeat_groups`)."""
        rows = {run_id: spread(runs) for run_id, runs in groups.items()}
        pooled = [(row.between_df, row.between_var) for row in rows.values() if row.between_var is not None]
        df = sum(d for d, _ in pooled)
        between = math.sqrt(max(0.0, sum(d * v for d, v in pooled) / df)) if df else None
        return cls(rows, between, df, files, statistic)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(
            rows={
                run_id: Spread(**{name: row.get(name) for name in _SPREAD_FIELDS})
                for run_id, row in (data.get("rows") or {}).items()
            },
            between=data.get("between"),
            between_df=int(data.get("between_df") or 0),
            files=list(data.get("files") or []),
            statistic=str(data.get("statistic") or STATISTIC),
        )


# Case families the gate does not judge: the offload cases (N, O) and the conversations (L, M).
NOT_GATED_FAMILIES = ("offload", "multiturn")


def gated_runs(doc: Document) -> dict[str, RunRecord]:
    """The runs of a results document the gate can judge, by id: the six cases' runs (fleet runs and the
    families in ``NOT_GATED_FAMILIES`` are not gated)."""
    return {
        run.key.id: run
        for run in Results.of(doc).runs
        if not run.key.route and run.key.family not in NOT_GATED_FAMILIES
    }


def repeat_groups(docs: Sequence[tuple[str, Document]], statistic: str = STATISTIC) -> dict[str, list[list[float]]]:
    """Each gated run id's per-repeat values in results documents (``(name, document)`` pairs), one list
    per document."""
    by_run: dict[str, list[list[float]]] = {}
    for _, doc in docs:
        for run_id, run in gated_runs(doc).items():
            values = repeat_values(run, statistic)
            if values:
                by_run.setdefault(run_id, []).append(values)
    return by_run


def calibrate(docs: Sequence[tuple[str, Document]], statistic: str = STATISTIC) -> Calibration:
    """The spread of ``statistic`` over results documents of one build (``(name, document)`` pairs, each
    one run of each of its run ids)."""
    return Calibration.of(repeat_groups(docs, statistic), [name for name, _ in docs], statistic)


# Most K-sets taken from one run when checking the rule: beyond it a seeded sample, so that a check of
# many files with many repeats stays quick.
MAX_KSETS = 60


def ksets(values: Sequence[float], k: int) -> list[tuple[float, ...]]:
    """Every choice of ``k`` of one run's repeats (as a gated run of K repeats could have measured), or a
    seeded sample of :data:`MAX_KSETS` of them where there are more."""
    if math.comb(len(values), k) <= MAX_KSETS:
        return list(itertools.combinations(values, k))
    rng = np.random.default_rng(len(values) * 1000 + k)
    return [tuple(values[i] for i in sorted(rng.choice(len(values), k, replace=False))) for _ in range(MAX_KSETS)]


def kset_pairs(
    base_runs: Sequence[Sequence[float]], new_runs: Sequence[Sequence[float]], k: int, *, same_build: bool
) -> Iterator[tuple[tuple[float, ...], tuple[float, ...]]]:
    """(baseline K-set, new K-set) pairs: every K-set of every baseline run against every K-set of every new
    run. For two sets of runs of one build (``same_build``) a run is never paired with itself: the gate
    always compares two runs, so both kinds of noise must be in the pair."""
    for i, base in enumerate(base_runs):
        for j, new in enumerate(new_runs):
            if same_build and i == j:
                continue
            yield from itertools.product(ksets(base, k), ksets(new, k))


def fails(base: Sequence[float], new: Sequence[float], noise: Noise, alpha: float) -> bool:
    """The gate's rule on one run: the new value above the baseline's by more than the limit."""
    return k_center(new) / k_center(base) > noise.limit(len(base), len(new), alpha)
