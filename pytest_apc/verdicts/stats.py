"""Statistics behind the timing verdicts and the report: bootstrap intervals of a ratio of medians and of
one median (numpy, seeded)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float

    def __str__(self) -> str:
        return f"{self.estimate:.2f}x [{self.low:.2f}, {self.high:.2f}] ({self.confidence:.0%} CI)"


def ratio_of_medians(
    numerator: np.ndarray, denominator: np.ndarray, *, samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """median(numerator) / median(denominator), with a percentile bootstrap over both sample sets.

    Used as OFF/ON for a speedup (a gain is significant when ``low > 1``) and ON/OFF for an overhead.
    """
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.size == 0 or den.size == 0:
        raise ValueError("no samples to compare (was the benchmark run with --save-detailed?)")
    rng = np.random.default_rng(seed)
    num_idx = rng.integers(0, num.size, size=(samples, num.size))
    den_idx = rng.integers(0, den.size, size=(samples, den.size))
    ratios = np.median(num[num_idx], axis=1) / np.median(den[den_idx], axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1 - alpha])
    return Interval(float(np.median(num) / np.median(den)), float(low), float(high), confidence)


def median_interval(values: np.ndarray, *, samples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """median(values), with a percentile bootstrap interval: ``values`` resampled with replacement
    ``samples`` times, the central ``confidence`` share of their medians (the fleet table's TTFT)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no samples (was the benchmark run with --save-detailed?)")
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, data.size, size=(samples, data.size))], axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(medians, [alpha, 1 - alpha])
    return Interval(float(np.median(data)), float(low), float(high), confidence)


def fit_prefill_cost(lengths: list[float], seconds: list[float]) -> tuple[float, float] | None:
    """Fit T(L) = a*L + b*L^2 (projection + attention) through measured prefill times; None if unusable.

    Non-negative least squares without intercept (a cost cannot be negative), solved exactly for two
    coefficients: the unconstrained fit when both are >= 0; otherwise the optimum lies on a boundary
    (a = 0 or b = 0), so the better of the two one-coefficient fits, each clamped at 0.
    """
    if len(lengths) < 2 or len(set(lengths)) < 2:
        return None
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(seconds, dtype=float)
    design = np.stack([x, x * x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    if a < 0 or b < 0:
        # Clipping the unconstrained fit is not the constrained optimum: refit each coefficient alone.
        linear, square = design[:, 0], design[:, 1]
        only_a = (max(float(linear @ y / (linear @ linear)), 0.0), 0.0)
        only_b = (0.0, max(float(square @ y / (square @ square)), 0.0))
        a, b = min((only_a, only_b), key=lambda c: prefill_cost_residual(c, lengths, seconds))
    a, b = float(a), float(b)
    if a == 0 and b == 0:
        return None
    return a, b


def prefill_cost_residual(cost: tuple[float, float], lengths: list[float], seconds: list[float]) -> float:
    """Sum of squared errors of T(L) = a*L + b*L^2 against measured prefill times."""
    a, b = cost
    x = np.asarray(lengths, dtype=float)
    return float(np.sum((np.asarray(seconds, dtype=float) - a * x - b * x * x) ** 2))


def prefill_speedup_bound(cost: tuple[float, float], prompt_len: float, cached_len: float) -> float:
    """Most a prefix cache can speed up one request's prefill under cost T(L)=aL+bL^2.

    Computing tokens cached..L over a context of L costs T(L) - T(cached) in a causal prefill.
    """
    a, b = cost

    def t(length: float) -> float:
        return a * length + b * length * length

    remaining = t(prompt_len) - t(cached_len)
    return t(prompt_len) / remaining if remaining > 0 else float("inf")
