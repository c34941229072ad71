"""The rows of the validation tables, computed once per session after the tests ran: OFF/ON pairs,
hash algorithms against the default, fleet runs (case R, one row per route; no OFF partner), and the
offload case (one row per run of N and O: what each tier served).

Every output (terminal table, Markdown, plots, baseline gate, results.json) reads the same
:class:`ReportData`, so the bootstrap behind each row runs once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.measure.records import MeasurementError, RunRecord, tier_hits
from pytest_apc.verdicts import locality
from pytest_apc.verdicts.stats import Interval, median_interval, ratio_of_medians
from pytest_apc.verdicts.verdict import Pair
from pytest_apc.workload.cases import PAIRS, RunKey


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


# The verdicts that judge a fleet run (tests_apc/test_fleet.py): its row's ``passed``.
FLEET_VERDICTS = ("fleet_accounting", "prefix_locality")


@dataclass(frozen=True)
class FleetRow:
    """One fleet run (case R on one route): where its requests landed, its cold prefills against one per
    prefix group, the routing cost, and its latency and throughput. Its locality is the first repeat's."""

    run: RunRecord
    numbers: dict[str, Any]

    @classmethod
    def build(cls, run: RunRecord, outcomes: Outcomes, settings: Settings) -> FleetRow:
        first = run.repeats[0]
        found: locality.Locality | None = None
        error: str | None = None
        try:
            found = locality.of_repeat(run, first)
        except MeasurementError as err:
            error = str(err)
        try:
            ttft: Interval | None = median_interval(
                run.samples_ms("ttfts"), samples=settings.bootstrap_samples, confidence=settings.confidence
            )
        except ValueError:  # no per-request samples: the median the benchmark printed, no interval
            ttft = None
        replicas = len(found.replicas) if found else (len(first.parts) or len(run.server.members) or None)
        numbers: dict[str, Any] = {
            "id": run.key.id, "route": run.key.route, "concurrency": run.key.concurrency, "replicas": replicas,
            "prefix_groups": run.workload.prefix_groups,
            "requests_per_replica": [r.requests for r in found.replicas] if found else None,
            "cold_prefills": found.cold_prefills if found else None,
            "ideal_cold_prefills": found.ideal if found else None,
            "hits": found.hits if found else None,
            "ideal_hits": found.prediction.expected_hits if found else None,
            "extra_prefill_tokens": found.extra_prefill_tokens if found else None,
            "routing_cost": found.routing_cost if found else None,
            "median_ttft_ms": ttft.estimate if ttft else run.median_ms("ttfts"),
            "median_ttft_low_ms": ttft and ttft.low, "median_ttft_high_ms": ttft and ttft.high,
            "p99_ttft_ms": run.percentile_ms("ttfts", 99, "p99_ttft_ms"),
            "output_throughput": run.per_second("total_output_tokens"),
            "request_throughput": run.per_second("completed"),
            "passed": _fleet_passed(outcomes, run.key.id),
            "error": error,
        }  # fmt: skip
        return cls(run, numbers)


@dataclass(frozen=True)
class TierRow:
    """One run of the offload case (N: a small GPU cache alone, O: the same with a CPU tier): the prompt
    tokens each tier served and what was computed (the first repeat's by-source counters), against the
    prediction across tiers and the replay of vLLM's block pool for the GPU cache alone."""

    run: RunRecord
    numbers: dict[str, Any]

    @classmethod
    def build(cls, run: RunRecord, outcomes: Outcomes) -> TierRow:
        d = run.repeats[0].delta
        sizes = run.server.offload
        numbers: dict[str, Any] = {
            "id": run.key.id, "case": run.key.case, "concurrency": run.key.concurrency,
            "tier_gib": sizes.get("tier_gib") if run.key.case == "O" else None,
            "gpu_blocks": run.server.num_gpu_blocks, "prefix_groups": run.workload.prefix_groups,
            "input_tokens": run.bench.get("total_input_tokens"),
            "gpu_cache_hits": d.cached_tokens if d else None, "tier_hits": d.external_tokens if d else None,
            "computed_tokens": d.computed_tokens if d else None, "hits_all_tiers": tier_hits(d) if d else None,
            "expected_hits": run.prediction.expected_hits if run.prediction else None,
            "gpu_cache_hits_replayed": run.local_hits_predicted,
            "prefix_cache_queries": d.prefix_cache_queries if d else None,
            "median_ttft_ms": run.median_ms("ttfts"), "p99_ttft_ms": run.percentile_ms("ttfts", 99, "p99_ttft_ms"),
            "verdict": _row_verdict(outcomes, {run.key.id}, about=run.key.id),
        }  # fmt: skip
        return cls(run, numbers)


def _fleet_passed(outcomes: Outcomes, run_id: str) -> bool | None:
    """Whether the fleet verdicts on this run passed; False too when a test of the run failed before it
    recorded one (e.g. counters missing); None when nothing judged it."""
    results = [bool(v["passed"]) for v in outcomes.verdicts if v["name"] in FLEET_VERDICTS and run_id in v["runs"]]
    if run_id in outcomes.failed_runs:
        results.append(False)
    return None if not results else all(results)


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
        if key.case not in PAIRS or key.hash_algo or key.family == "offload":  # the tiers have rows of their own
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


def fleet_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[FleetRow]:
    """Every fleet run (a route is set), by concurrency and route. Never a pair: case R has no OFF run."""
    keys = sorted((k for k in records if k.route), key=lambda k: (k.concurrency, k.route))
    return [FleetRow.build(records[key], outcomes, settings) for key in keys]


def tier_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes) -> list[TierRow]:
    """Every run of the offload case, by concurrency, without the tier first."""
    keys = sorted((k for k in records if k.family == "offload"), key=lambda k: (k.concurrency, k.case))
    return [TierRow.build(records[key], outcomes) for key in keys]


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows about this session's runs, computed once."""

    pairs: list[PairRow]
    algos: list[AlgoRow]
    verdicts: list[dict[str, Any]]
    fleet: list[FleetRow] = field(default_factory=list)
    offload: list[TierRow] = field(default_factory=list)

    @classmethod
    def build(cls, records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> ReportData:
        return cls(
            pair_rows(records, outcomes, settings),
            algo_rows(records, outcomes, settings),
            list(outcomes.verdicts),
            fleet_rows(records, outcomes, settings),
            tier_rows(records, outcomes),
        )

    def pair_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.pairs]

    def algo_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.algos]

    def fleet_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.fleet]

    def offload_numbers(self) -> list[dict[str, Any]]:
        return [row.numbers for row in self.offload]
