"""The rows of the validation tables, computed once per session after the tests ran.

Every output (terminal table, Markdown, plots, baseline gate, results.json) reads the same
:class:`ReportData`, so the bootstrap behind each row runs once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.cases import PAIRS, RunKey
from pytest_apc.config import Settings
from pytest_apc.records import RunRecord
from pytest_apc.stats import Interval, ratio_of_medians
from pytest_apc.verdict import Pair


@dataclass
class Outcomes:
    """What the tests said, gathered from every test report by the controller."""

    verdicts: list[dict[str, Any]] = field(default_factory=list)  # Verdict.to_json() + "test" and "outcome"
    failed_runs: set[str] = field(default_factory=set)  # ids of runs whose test failed before any verdict


@dataclass(frozen=True)
class PairRow:
    """One ON/OFF pair at one concurrency, with everything the validation table shows."""

    off: RunRecord
    on: RunRecord
    verdict: str  # PASS / FAIL / -
    numbers: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.off.key.case}/{self.on.key.case}"

    @classmethod
    def build(cls, off: RunRecord, on: RunRecord, verdict: str, settings: Settings) -> PairRow:
        speedup: float | None
        low: float | None
        high: float | None
        try:
            gain = Pair(off, on, settings).ttft_speedup()
            speedup, low, high = gain.estimate, gain.low, gain.high
        except ValueError:
            speedup = low = high = None
        on_json, off_json = on.to_json(), off.to_json()
        numbers = {
            "pair": f"{off.key.case}/{on.key.case}", "concurrency": on.key.concurrency,
            "cache_hit_observed": bool(on_json["prefix_cache_hits"]), "cached_tokens": on_json["prefix_cache_hits"],
            "expected_cached_tokens": on.prediction.expected_hits if on.prediction else None,
            "hit_ratio": on_json["hit_ratio"], "median_ttft_off_ms": off_json["median_ttft_ms"],
            "median_ttft_on_ms": on_json["median_ttft_ms"], "ttft_speedup": speedup, "ttft_speedup_low": low,
            "ttft_speedup_high": high,
            "prefill_bound": on.prediction.prefill_bound if on.prediction else None,
            "input_throughput_off": off_json["input_throughput"], "input_throughput_on": on_json["input_throughput"],
            "output_throughput_off": off_json["output_throughput"],
            "output_throughput_on": on_json["output_throughput"],
            "median_e2el_off_ms": off_json["median_e2el_ms"], "median_e2el_on_ms": on_json["median_e2el_ms"],
            "verdict": verdict,
        }  # fmt: skip
        return cls(off, on, verdict, numbers)


@dataclass(frozen=True)
class AlgoRow:
    """One run on a --apc-hash-algos server next to the same run on the default APC-on server."""

    default: RunRecord
    run: RunRecord
    verdict: str
    numbers: dict[str, Any]

    @classmethod
    def build(cls, default: RunRecord, run: RunRecord, verdict: str, settings: Settings) -> AlgoRow:
        try:
            ratio: Interval | None = ratio_of_medians(
                run.samples_ms(), default.samples_ms(),
                samples=settings.bootstrap_samples, confidence=settings.confidence,
            )  # fmt: skip
        except ValueError:  # no per-request samples: the row shows "-"
            ratio = None
        numbers = {
            "case": run.key.case, "concurrency": run.key.concurrency,
            "hash_algo": run.key.hash_algo, "default_hash_algo": default.server.prefix_caching_hash_algo,
            "cached_tokens": run.to_json()["prefix_cache_hits"],
            "default_cached_tokens": default.to_json()["prefix_cache_hits"],
            "median_ttft_default_ms": default.median_ms(), "median_ttft_ms": run.median_ms(),
            "ttft_ratio": ratio and ratio.estimate, "ttft_ratio_low": ratio and ratio.low,
            "ttft_ratio_high": ratio and ratio.high,
            "duration_default_s": default.duration_s, "duration_s": run.duration_s,
            "verdict": verdict,
        }  # fmt: skip
        return cls(default, run, verdict, numbers)


def _row_verdict(outcomes: Outcomes, runs: set[str], about: str | None = None) -> str:
    """PASS/FAIL from the verdicts about these runs only (every run they name among ``runs``), or about one
    run (every verdict naming ``about``); FAIL when one of ``runs`` failed before any verdict; "-" when
    nothing judged them."""
    results = [
        v["passed"] and v.get("outcome") == "passed"
        for v in outcomes.verdicts
        if (about in v["runs"] if about else set(v["runs"]) <= runs)
    ]
    results += [False for run_id in outcomes.failed_runs if run_id in runs]  # failed before any verdict
    return "-" if not results else ("PASS" if all(results) else "FAIL")


def pair_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[PairRow]:
    """Every ON run of the default APC server with its OFF partner, in matrix order, with the verdicts'
    outcome (runs on --apc-hash-algos servers are compared with the default's in ``algo_rows``)."""
    rows = []
    for key in sorted(records, key=lambda k: (k.case, k.concurrency)):
        if key.case not in PAIRS or key.hash_algo:
            continue
        off = records.get(RunKey(PAIRS[key.case], key.concurrency))
        if off is None:
            continue
        verdict = _row_verdict(outcomes, {key.id, off.key.id})
        rows.append(PairRow.build(off, records[key], verdict, settings))
    return rows


def algo_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[AlgoRow]:
    """Every run measured on a --apc-hash-algos server with its default-algorithm twin."""
    rows = []
    for key in sorted(records, key=lambda k: (k.hash_algo, k.case, k.concurrency)):
        default = records.get(RunKey(key.case, key.concurrency))
        if not key.hash_algo or default is None:
            continue
        # The algorithm's own verdicts and the comparison; the default run's own verdicts belong to its pair.
        verdict = _row_verdict(outcomes, {key.id}, about=key.id)
        rows.append(AlgoRow.build(default, records[key], verdict, settings))
    return rows


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows about this session's runs, computed once."""

    pairs: list[PairRow]
    algos: list[AlgoRow]
    verdicts: list[dict[str, Any]]

    @classmethod
    def build(cls, records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> ReportData:
        return cls(
            pair_rows(records, outcomes, settings), algo_rows(records, outcomes, settings), list(outcomes.verdicts)
        )

    def pair_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.pairs]

    def algo_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.algos]
