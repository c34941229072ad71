"""The gate's noise model: spreads recovered from data whose spreads are known, the false-alarm probability
the rule promises checked by simulation, and per-repeat values read from results files of every version."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pytest_apc.gate import noise
from pytest_apc.measure.records import RunRecord


def _runs(rng: np.random.Generator, runs: int, k: int, within: float, between: float, mean: float = 800.0):
    """Per-repeat values of ``runs`` runs of one build under the model: a shift per run, noise per repeat."""
    return [list(mean * np.exp(rng.normal(0, between) + rng.normal(0, within, k))) for _ in range(runs)]


def test_spread_recovers_the_within_and_between_run_spreads() -> None:
    rng = np.random.default_rng(1)
    found = noise.spread(_runs(rng, 400, 5, within=0.03, between=0.02))
    assert found.within == pytest.approx(0.03, rel=0.05)
    assert found.between == pytest.approx(0.02, rel=0.15)
    assert (found.runs, found.repeats, found.within_df, found.between_df) == (400, 2000, 1600, 399)
    alone = noise.spread(_runs(rng, 400, 5, within=0.03, between=0.0))
    assert alone.between is not None
    assert alone.between < 0.005


def test_one_run_measures_no_between_run_spread() -> None:
    found = noise.spread([[800.0, 810.0, 790.0]])
    assert found.between is None
    assert found.between_df == 0
    assert found.within == pytest.approx(float(np.std(np.log([800, 810, 790]), ddof=1)))


@pytest.mark.parametrize(("k", "alpha"), [(3, 0.01), (5, 0.005), (1, 0.05)])
def test_the_rule_fails_an_unchanged_build_as_often_as_it_promises(k: int, alpha: float) -> None:
    """Baseline and new run drawn from the same build (each its own run effect): the share the rule fails
    is alpha, within the simulation's own error (20,000 pairs)."""
    rng = np.random.default_rng(7)
    spread = noise.Noise(within=0.03, between=0.02, source="test")
    pairs = 20_000
    failed = sum(noise.fails(*(_runs(rng, 2, k, spread.within, spread.between)), spread, alpha) for _ in range(pairs))
    error = 4 * math.sqrt(alpha * (1 - alpha) / pairs)
    assert abs(failed / pairs - alpha) < error, (failed / pairs, alpha)


def test_the_rule_catches_the_slowdown_it_says_it_detects() -> None:
    rng = np.random.default_rng(3)
    spread = noise.Noise(within=0.03, between=0.02, source="test")
    slowdown = spread.detectable(3, 3, 0.005)
    caught = 0
    for _ in range(4000):
        before, now = _runs(rng, 2, 3, spread.within, spread.between)
        caught += noise.fails(before, [v * slowdown for v in now], spread, 0.005)
    assert caught / 4000 == pytest.approx(noise.POWER, abs=0.02)


def test_limit_and_detectable_follow_the_formula() -> None:
    spread = noise.Noise(within=0.028, between=0.024, source="test")
    sd = math.sqrt(2 * 0.024**2 + 0.028**2 * (0.448671 + 0.286834))  # the median of 3 and of 5 values
    assert spread.sd(3, 5) == pytest.approx(sd, rel=1e-5)
    assert spread.limit(3, 5, 0.005) == pytest.approx(math.exp(2.5758293 * sd), rel=1e-5)
    assert spread.detectable(3, 5, 0.005) == pytest.approx(math.exp((2.5758293 + 1.6448536) * sd), rel=1e-5)
    # More repeats narrow the limit, but never below what the between-run spread leaves.
    assert spread.limit(3, 3, 0.01) > spread.limit(10, 10, 0.01) > math.exp(noise.z(0.01) * math.sqrt(2) * 0.024)


def test_the_variance_of_a_median_of_k_values() -> None:
    """Known values of the variance of the median of k standard normal values, and its limit pi/(2k)."""
    assert noise.median_variance(1) == pytest.approx(1.0, abs=1e-6)
    assert noise.median_variance(2) == 0.5
    assert noise.median_variance(3) == pytest.approx(0.448671, abs=1e-5)
    assert noise.median_variance(5) == pytest.approx(0.286834, abs=1e-5)
    rng = np.random.default_rng(11)
    for k in (4, 6):  # even: the mean of the middle two, checked against a simulation
        simulated = float(np.var(np.median(rng.normal(size=(400_000, k)), axis=1)))
        assert noise.median_variance(k) == pytest.approx(simulated, rel=0.01)
    assert noise.median_variance(41) * 41 == pytest.approx(math.pi / 2, rel=0.03)


def test_one_bad_repeat_of_three_does_not_decide_a_run() -> None:
    spread = noise.Noise(within=0.03, between=0.02, source="test")
    base = [800.0, 810.0, 795.0]
    assert not noise.fails(base, [805.0, 2400.0, 790.0], spread, 0.005)  # one repeat hit by something else
    assert noise.fails(base, [2400.0, 2410.0, 790.0], spread, 0.005)  # most repeats slower: the build


def test_repeat_values_are_what_the_file_stored_per_repeat() -> None:
    def run(**stored: Any) -> RunRecord:  # a runs[] entry of a results file, read back
        return RunRecord.from_json({"id": "D-c8", **stored})

    stored = {"repeat_counters": [{"mean_ttft_ms": 700.0}, {"mean_ttft_ms": 720.0}], "ttfts_ms": [1.0] * 4}
    assert noise.repeat_values(run(**stored)) == [700.0, 720.0]
    # Not measured: unknown, not recomputed from the file's rounded per-request TTFTs.
    unknown = {"repeat_counters": [{"mean_ttft_ms": None}, {"mean_ttft_ms": None}], "ttfts_ms": [1.0, 3.0, 5.0, 7.0]}
    assert noise.repeat_values(run(**unknown)) is None
    assert noise.repeat_values(run(repeat_counters=[], ttfts_ms=[])) is None
    assert noise.repeat_values(run(**unknown), "median_ttft_ms") is None


def test_ksets_pair_every_choice_of_repeats_across_runs_never_a_run_with_itself() -> None:
    runs = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    same = list(noise.kset_pairs(runs, runs, 2, same_build=True))
    assert len(same) == 3 * 2 * 3 * 3  # ordered pairs of different runs x C(3,2)^2
    assert not any(set(a) & set(b) for a, b in same)
    assert len(list(noise.kset_pairs(runs, runs[:1], 3, same_build=False))) == 3
    many = [float(v) for v in range(40)]  # C(40, 5) sets: a seeded sample of them, each a real choice
    sample = noise.ksets(many, 5)
    assert len(sample) == noise.MAX_KSETS
    assert sample == noise.ksets(many, 5)
    assert all(len(set(s)) == 5 and set(s) <= set(many) for s in sample)


def test_calibration_pools_the_between_run_spread_over_every_run_id() -> None:
    def doc(c: list[float], d: list[float]) -> dict:
        return {"runs": [{"id": "C-c8", "repeat_counters": [{"mean_ttft_ms": v} for v in c]},
                         {"id": "D-c8", "repeat_counters": [{"mean_ttft_ms": v} for v in d]},
                         {"id": "R-c8-round_robin", "route": "round_robin",
                          "repeat_counters": [{"mean_ttft_ms": 1.0}] * 3}]}  # fmt: skip

    rng = np.random.default_rng(5)
    c_runs, d_runs = _runs(rng, 100, 4, 0.03, 0.05, 4000.0), _runs(rng, 100, 4, 0.02, 0.05, 800.0)
    found = noise.calibrate([(f"r{i}", doc(c, d)) for i, (c, d) in enumerate(zip(c_runs, d_runs, strict=True))])
    assert set(found.rows) == {"C-c8", "D-c8"}  # fleet runs are not gated
    assert found.rows["C-c8"].within == pytest.approx(0.03, rel=0.15)
    assert found.rows["D-c8"].within == pytest.approx(0.02, rel=0.15)
    assert found.between == pytest.approx(0.05, rel=0.25)
    assert found.between_df == 198
    restored = noise.Calibration.from_json(found.to_json())
    assert restored.rows == found.rows
    assert restored.between == found.between
    default = noise.Noise(0.5, 0.5, "the default")
    assert restored.noise("D-c8", default, "cal") == noise.Noise(found.rows["D-c8"].within or 0, found.between, "cal")
    partly = restored.noise("A-c8", default, "cal")  # a run it did not measure: its within-run spread defaults
    assert (partly.within, partly.between) == (0.5, found.between)
    assert partly.source == "cal (between-run spread only), the rest from the default"
