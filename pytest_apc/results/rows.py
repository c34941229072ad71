"""The rows of the report's tables, computed once per session after the tests ran: OFF/ON pairs, hash
algorithms against the default, fleet runs (case R, one row per route; no OFF partner), and the offload
case (one row per run of N and O: what each tier served).

Each row is typed and declares its columns once (:mod:`pytest_apc.results.columns`): its stored fields
are results.json's ``pairs``, ``hash_algos``, ``fleet`` and ``offload`` rows and summary.md's columns; its
``TERMINAL`` columns are the terminal table's. Every output (terminal tables, summary.md, plots, the
baseline gate, results.json) reads the same :class:`ReportData`, so the bootstrap behind each row runs
once, and ``python -m pytest_apc report`` re-reads a file's rows through :meth:`Row.from_json`.

Every kind of row is judged by one rule (:meth:`Outcomes.verdict_label`); a pair row's verdict cell also
says what its timing verdict held it to and found (:meth:`Outcomes.timing`: ``PASS faster``, ``PASS not
slower``, ``FAIL slower``). A number that a verdict also
judges (the TTFT gain and ratio with their intervals, the cached tokens, where a fleet's requests landed,
the answers) is read from :mod:`pytest_apc.verdicts.figures` and :func:`pytest_apc.verdicts.answers.compared`,
which compute it once on every repeat for the verdict and the row alike.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from pytest_apc.config import Settings
from pytest_apc.measure.records import MeasurementError, RunRecord, tier_hits
from pytest_apc.results.columns import Column, Row, present, stored
from pytest_apc.results.formatting import ARROW, MISSING, compact, num, two
from pytest_apc.verdicts import affinity, answers, figures, locality
from pytest_apc.verdicts.stats import Interval, median_interval
from pytest_apc.verdicts.verdict import FASTER, NOT_SLOWER, found, held_to
from pytest_apc.workload.cases import PAIRS, RunKey


@dataclass
class Outcomes:
    """What the tests said, gathered from every test report by the controller."""

    verdicts: list[dict[str, Any]] = field(default_factory=list)  # Verdict.to_json() + "test" and "outcome"
    failed_runs: set[str] = field(default_factory=set)  # ids of runs whose test failed before any verdict

    def verdict_label(self, runs: Collection[str], compared_with: Collection[str] = ()) -> str:
        """The verdict of a row about ``runs`` (the runs it shows beside them for comparison, whose own
        verdicts belong to their own rows, are ``compared_with``): FAIL when a verdict about its runs failed
        or its test did, or a test about its runs failed before any verdict; PASS when verdicts judged them
        and none failed; "-" when nothing judged them. A verdict is about the row when it names one of
        ``runs`` and no run beyond ``runs`` and ``compared_with``."""
        allowed = set(runs) | set(compared_with)
        results = [
            bool(v["passed"]) and v.get("outcome") == "passed"
            for v in self.verdicts
            if set(v["runs"]) <= allowed and not set(v["runs"]).isdisjoint(runs)
        ]
        results += [False for run_id in self.failed_runs if run_id in runs]  # failed before any verdict
        return "-" if not results else ("PASS" if all(results) else "FAIL")

    def timing(self, runs: Collection[str]) -> str | None:
        """What the timing verdicts that compare ``runs`` found against the rule they held them to
        (:func:`~pytest_apc.verdicts.verdict.found`): a failed one's finding; else "faster" where one was held
        to a gain, else "not slower"; None when no timing verdict compared them."""
        judged = [
            (rule, bool(v["passed"]))
            for v in self.verdicts
            if set(v["runs"]) <= set(runs) and (rule := held_to(v)) is not None
        ]
        failed = [j for j in judged if not j[1]]
        if not judged:
            return None
        return found(*(failed[0] if failed else max(judged, key=lambda j: j[0] == FASTER)))


R = TypeVar("R", bound=Row)


@dataclass(frozen=True, kw_only=True)
class MeasuredRow(Row):
    """A row about measured runs: the runs behind it when a session built it (none when it was read back
    from a results file), in the order its name gives them."""

    runs: tuple[RunRecord, ...] = field(default=(), compare=False, repr=False)


def _interval(low: float | None, high: float | None) -> str:
    """A ratio's interval: ``[4.90,17.94]``."""
    return MISSING if low is None and high is None else f"[{num(low, '.2f')},{num(high, '.2f')}]"


def _times(value: float | None, spec: str) -> str:
    """A ratio: ``3.26x``."""
    return MISSING if value is None else f"{value:{spec}}x"


def _gain_bound(gain: float | None, bound: float | None) -> str:
    """A pair's TTFT gain next to its prefill bound: ``3.26x/13.2x``."""
    return MISSING if gain is None and bound is None else f"{_times(gain, '.2f')}/{_times(bound, '.3g')}"


_TIMING_PASSED = {found(FASTER, True), found(NOT_SLOWER, True)}


def verdict_cell(row: Any) -> str:
    """A row's verdict as its tables show it: PASS or FAIL, with what its timing verdict found where one
    judged it: ``PASS faster``, ``PASS not slower``, ``FAIL not faster``, ``FAIL slower`` (a row that failed
    on something else reads ``FAIL``); n/a where nothing judged it."""
    verdict = row.verdict
    if verdict not in ("PASS", "FAIL"):
        return MISSING
    timing = getattr(row, "timing", None)
    shown = timing and (verdict == "PASS") == (timing in _TIMING_PASSED)
    return f"{verdict} {timing}" if shown else verdict


_pair_p90 = present("p90_ttft_off_ms", "p90_ttft_on_ms")  # written since p90 was stored


@dataclass(frozen=True, kw_only=True)
class PairRow(MeasuredRow):
    """One ON/OFF pair at one concurrency, with everything the validation table shows."""

    pair: str = stored("pair")
    concurrency: int = stored("conc")
    cache_hit_observed: bool = stored("hit?")
    cached_tokens: int | None = stored("cached tokens")
    expected_cached_tokens: int | None = stored("expected")
    hit_ratio: float | None = stored("hit ratio", ".1%")
    median_ttft_off_ms: float | None = stored("TTFT OFF ms")
    median_ttft_on_ms: float | None = stored("TTFT ON ms")
    p90_ttft_off_ms: float | None = stored("p90 TTFT OFF ms", sparse=True)
    p90_ttft_on_ms: float | None = stored("p90 TTFT ON ms", sparse=True)
    ttft_speedup: float | None = stored("gain")
    ttft_speedup_low: float | None = stored("gain CI low")
    ttft_speedup_high: float | None = stored("gain CI high")
    prefill_bound: float | None = stored("prefill bound")
    input_throughput_off: float | None = stored("in tok/s OFF")
    input_throughput_on: float | None = stored("in tok/s ON")
    output_throughput_off: float | None = stored("out tok/s OFF")
    output_throughput_on: float | None = stored("out tok/s ON")
    median_e2el_off_ms: float | None = stored("E2E OFF ms")
    median_e2el_on_ms: float | None = stored("E2E ON ms")
    answers: str | None = stored("answers", sparse=True)  # probed cached answers that agree: 4/4, 1 DIFFER
    # What the pair's timing verdict found against its rule: faster / not faster / not slower / slower.
    timing: str | None = stored(None, sparse=True)
    verdict: str = stored("verdict", default="-", cell=verdict_cell)  # PASS / FAIL / -

    # Fits 150 columns; -v adds the p90 TTFT (where the runs have one) and the gain's interval.
    TERMINAL: ClassVar[tuple[Column[Any], ...]] = (
        Column("pair", lambda r: r.pair),
        Column("c", lambda r: r.concurrency),
        Column("hit", lambda r: "yes" if r.cache_hit_observed else ("NO" if r.expected_cached_tokens else "no")),
        Column("cached/expected", lambda r: two(r.cached_tokens, r.expected_cached_tokens, "/")),
        Column("ratio", lambda r: num(r.hit_ratio, ".0%")),
        Column("TTFT ms", lambda r: two(r.median_ttft_off_ms, r.median_ttft_on_ms)),
        Column("p90 TTFT ms", lambda r: two(r.p90_ttft_off_ms, r.p90_ttft_on_ms), verbose=True, shown=_pair_p90),
        Column("gain/bound", lambda r: _gain_bound(r.ttft_speedup, r.prefill_bound)),
        Column("gain CI", lambda r: _interval(r.ttft_speedup_low, r.ttft_speedup_high), verbose=True),
        Column("in tok/s", lambda r: two(r.input_throughput_off, r.input_throughput_on, fmt=compact)),
        Column("out tok/s", lambda r: two(r.output_throughput_off, r.output_throughput_on, fmt=compact)),
        Column("E2E ms", lambda r: two(r.median_e2el_off_ms, r.median_e2el_on_ms)),
        Column("answers", lambda r: r.answers or MISSING, shown=present("answers")),
        Column("verdict", verdict_cell),
    )  # fmt: skip

    @property
    def run_ids(self) -> tuple[str, str]:
        """The ids of its OFF and ON runs: ``C-c8``, ``D-c8`` (``D-c8-xxhash`` for a schema_version 1 row
        ``C/D xxhash``)."""
        cases, _, algo = str(self.pair).partition(" ")
        off, _, on = cases.partition("/")
        return RunKey(off, self.concurrency).id, RunKey(on, self.concurrency, algo).id

    @property
    def name(self) -> str:
        return self.pair

    @classmethod
    def build(cls, off: RunRecord, on: RunRecord, outcomes: Outcomes, settings: Settings) -> PairRow:
        speedup: float | None
        low: float | None
        high: float | None
        try:
            gain = figures.ttft_gain(off, on, settings)
            speedup, low, high = gain.estimate, gain.low, gain.high
        except ValueError:
            speedup = low = high = None
        hits, hit_ratio = _hits(on)
        on_json, off_json = on.to_json(), off.to_json()
        return cls(
            pair=f"{off.key.case}/{on.key.case}", concurrency=on.key.concurrency,
            cache_hit_observed=bool(hits), cached_tokens=hits,
            expected_cached_tokens=on.prediction.expected_hits if on.prediction else None,
            hit_ratio=hit_ratio, median_ttft_off_ms=off_json["median_ttft_ms"],
            median_ttft_on_ms=on_json["median_ttft_ms"], p90_ttft_off_ms=off_json["p90_ttft_ms"],
            p90_ttft_on_ms=on_json["p90_ttft_ms"], ttft_speedup=speedup, ttft_speedup_low=low,
            ttft_speedup_high=high, prefill_bound=on.prediction.prefill_bound if on.prediction else None,
            input_throughput_off=off_json["input_throughput"], input_throughput_on=on_json["input_throughput"],
            output_throughput_off=off_json["output_throughput"], output_throughput_on=on_json["output_throughput"],
            median_e2el_off_ms=off_json["median_e2el_ms"], median_e2el_on_ms=on_json["median_e2el_ms"],
            answers=answers.compared(on, off).cell, timing=outcomes.timing({off.key.id, on.key.id}),
            verdict=outcomes.verdict_label({off.key.id, on.key.id}), runs=(off, on),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class AlgoRow(MeasuredRow):
    """One run on a --apc-hash-algos server next to the same run on the default APC-on server."""

    case: str = stored("case")
    concurrency: int = stored("conc")
    hash_algo: str = stored("hash")
    default_hash_algo: str | None = stored("default hash")
    cached_tokens: int | None = stored("cached tokens")
    default_cached_tokens: int | None = stored("default cached tokens")
    median_ttft_default_ms: float | None = stored("TTFT default ms")
    median_ttft_ms: float | None = stored("TTFT ms")
    ttft_ratio: float | None = stored("ratio")
    ttft_ratio_low: float | None = stored("ratio CI low")
    ttft_ratio_high: float | None = stored("ratio CI high")
    duration_default_s: float | None = stored("duration default s")
    duration_s: float | None = stored("duration s")
    answers: str | None = stored("answers", sparse=True)
    verdict: str = stored("verdict", default="-", cell=verdict_cell)

    # Same cached tokens, TTFT and duration within tolerance.
    TERMINAL: ClassVar[tuple[Column[Any], ...]] = (
        Column("case algorithm", lambda r: f"{r.case} {r.hash_algo}"),
        Column("c", lambda r: r.concurrency),
        Column("cached/default", lambda r: two(r.cached_tokens, r.default_cached_tokens, "/")),
        Column(f"TTFT ms default{ARROW.strip()}algo", lambda r: two(r.median_ttft_default_ms, r.median_ttft_ms)),
        Column(
            "TTFT algo/default",
            lambda r: MISSING if r.ttft_ratio is None
            else f"{_times(r.ttft_ratio, '.2f')} {_interval(r.ttft_ratio_low, r.ttft_ratio_high)}",
        ),
        Column("duration s", lambda r: two(r.duration_default_s, r.duration_s)),
        Column("answers", lambda r: r.answers or MISSING, shown=present("answers")),
        Column("verdict", verdict_cell),
    )  # fmt: skip

    @property
    def run(self) -> RunRecord:
        """The run on the algorithm's server (a row a session built)."""
        return self.runs[0]

    @classmethod
    def build(cls, default: RunRecord, run: RunRecord, outcomes: Outcomes, settings: Settings) -> AlgoRow:
        try:
            ratio: Interval | None = figures.ttft_ratio(run, default, settings)
        except ValueError:  # no per-request samples: the row shows n/a
            ratio = None
        hits, default_hits = figures.hash_hits(run, default)
        return cls(
            case=run.key.case, concurrency=run.key.concurrency,
            hash_algo=str(run.key.hash_algo), default_hash_algo=default.server.prefix_caching_hash_algo,
            cached_tokens=hits, default_cached_tokens=default_hits,
            median_ttft_default_ms=default.median_ms(), median_ttft_ms=run.median_ms(),
            ttft_ratio=ratio.estimate if ratio else None, ttft_ratio_low=ratio.low if ratio else None,
            ttft_ratio_high=ratio.high if ratio else None,
            duration_default_s=default.duration_s, duration_s=run.duration_s, answers=answers.compared(run).cell,
            # The algorithm's own verdicts and the comparison; the default run's own belong to its pair.
            verdict=outcomes.verdict_label({run.key.id}, compared_with={default.key.id}), runs=(run, default),
        )  # fmt: skip


def _hits(run: RunRecord) -> tuple[int | None, float | None]:
    """The cached tokens and hit ratio a pair row shows: the repeat ``cached_tokens_match`` shows; the first
    repeat's counters where it cannot judge the run (no prediction or no counters)."""
    shown = figures.hits_shown(run)
    if shown is not None:
        return shown.hits, shown.hit_ratio
    d = run.delta
    if d is None or d.prefix_cache_queries is None:
        return None, None
    hits = figures.counted_hits(d)
    return hits, hits / d.prefix_cache_queries if d.prefix_cache_queries else None


def _passed(verdict: str) -> bool | None:
    return {"PASS": True, "FAIL": False}.get(verdict)


def fleet_requests(counts: Sequence[int] | None) -> str:
    """Requests per replica, in replica order: ``15+15``."""
    return "+".join(num(c) for c in counts) if counts else MISSING


def _verdict_of(passed: bool | None) -> str:
    return "-" if passed is None else ("PASS" if passed else "FAIL")


def several_levels(rows: Sequence[Any]) -> bool:
    """Whether these rows have more than one concurrency (then a fleet row's label names its own)."""
    return len({row.concurrency for row in rows}) > 1


@dataclass(frozen=True, kw_only=True)
class FleetRow(MeasuredRow):
    """One fleet run (case R on one route): where its requests landed, its cold prefills against one per
        prefix group, the routing cost, and its latency and throughput. Its locality is the repeat that
    ``prefix_locality`` shows (the first that failed, else the first; ``figures.locality_shown``).
        Case M behind the router has a row too: its conversations stand for the prefix groups."""

    id: str = stored(None)
    route: str = stored("route")
    concurrency: int = stored("conc")
    replicas: int | None = stored("replicas")
    prefix_groups: int = stored(None)
    requests_per_replica: Sequence[int] | None = stored("requests per replica", fleet_requests)
    cold_prefills: int | None = stored("cold prefills")
    ideal_cold_prefills: int | None = stored("ideal")
    hits: int | None = stored("hits")
    ideal_hits: int | None = stored("ideal hits")
    extra_prefill_tokens: int | None = stored("extra prefill tokens")
    routing_cost: float | None = stored("routing cost", ".1%")
    median_ttft_ms: float | None = stored("TTFT ms")
    median_ttft_low_ms: float | None = stored("TTFT CI low")
    median_ttft_high_ms: float | None = stored("TTFT CI high")
    p90_ttft_ms: float | None = stored("p90 TTFT ms", sparse=True)
    p99_ttft_ms: float | None = stored("p99 TTFT ms")
    output_throughput: float | None = stored("out tok/s")
    request_throughput: float | None = stored("req/s")
    answers: str | None = stored("answers", sparse=True)
    passed: bool | None = stored("verdict", cell=verdict_cell)  # the row's verdict as true / false / null
    error: str | None = stored(None)  # why the run's locality could not be told

    # The concurrency is in the line above the table, and in a row's route where the runs have several.
    TERMINAL: ClassVar[tuple[Column[Any], ...]] = (
        Column("route", lambda r: f"{r.label} c{r.concurrency}", shown=several_levels),
        Column("route", lambda r: r.label, shown=lambda rows: not several_levels(rows)),
        Column("replicas", lambda r: num(r.replicas)),
        Column("requests", lambda r: fleet_requests(r.requests_per_replica)),
        Column("cold/ideal", lambda r: two(r.cold_prefills, r.ideal_cold_prefills, "/")),
        Column("hits/ideal", lambda r: two(r.hits, r.ideal_hits, "/")),
        Column("cost", lambda r: num(r.routing_cost, ".1%")),
        Column("TTFT ms [CI]", lambda r: r.ttft_text),
        Column("p90 TTFT ms", lambda r: num(r.p90_ttft_ms), verbose=True, shown=present("p90_ttft_ms")),
        Column("out tok/s", lambda r: compact(r.output_throughput)),
        Column("answers", lambda r: r.answers or MISSING, shown=present("answers")),
        Column("verdict", verdict_cell),
    )

    @property
    def verdict(self) -> str:
        return _verdict_of(self.passed)

    @property
    def case(self) -> str:
        """R, or M for case M behind the router (a row read from a file has its id)."""
        return (self.id or "R").split("-", 1)[0]

    @property
    def label(self) -> str:
        """The route, and the case where it is M's: ``consistent_hash`` (case R), ``M consistent_hash``."""
        return self.route if self.case == "R" else f"{self.case} {self.route}"

    @property
    def ttft_text(self) -> str:
        """Median TTFT with its bootstrap interval: ``195 [150..240]`` (``..``: the numbers have thousands
        commas)."""
        text = num(self.median_ttft_ms)
        if self.median_ttft_low_ms is not None:
            text += f" [{num(self.median_ttft_low_ms)}..{num(self.median_ttft_high_ms)}]"
        return text

    @classmethod
    def build(cls, run: RunRecord, outcomes: Outcomes, settings: Settings) -> FleetRow:
        first = run.repeats[0]
        found: locality.Locality | None = None
        error: str | None = None
        if run.key.family == "multiturn":
            return cls._conversations(run, outcomes, settings)
        try:
            found = figures.locality_shown(run, settings)
        except MeasurementError as err:
            error = str(err)
        ttft = cls._ttft(run, settings)
        replicas = len(found.replicas) if found else (len(first.parts) or len(run.server.members) or None)
        return cls(
            id=run.key.id, route=str(run.key.route), concurrency=run.key.concurrency, replicas=replicas,
            prefix_groups=run.workload.prefix_groups,
            requests_per_replica=[r.requests for r in found.replicas] if found else None,
            cold_prefills=found.cold_prefills if found else None,
            ideal_cold_prefills=found.ideal if found else None,
            hits=found.hits if found else None,
            ideal_hits=found.prediction.expected_hits if found else None,
            extra_prefill_tokens=found.extra_prefill_tokens if found else None,
            routing_cost=found.routing_cost if found else None,
            **cls._timing(run, ttft), answers=answers.compared(run).cell,
            passed=_passed(outcomes.verdict_label({run.key.id})), error=error, runs=(run,),
        )  # fmt: skip

    @classmethod
    def _conversations(cls, run: RunRecord, outcomes: Outcomes, settings: Settings) -> FleetRow:
        """Case M behind the router: its prefix groups are its conversations, a cold prefill one that computes a
        conversation's history (its first turn, or a turn away from its history), the ideal one per
        conversation and one server's hits; the routing cost what the routing left to compute again."""
        routed = affinity.routing_of_repeat(run, 0)
        extra = routed.ideal_hits - routed.hits if routed and routed.hits is not None else None
        cost = extra / routed.ideal_hits if routed and extra is not None and routed.ideal_hits > 0 else None
        return cls(
            id=run.key.id, route=str(run.key.route), concurrency=run.key.concurrency,
            replicas=len(routed.replicas) if routed else (len(run.server.members) or None),
            prefix_groups=run.workload.num_prompts,
            requests_per_replica=list(routed.requests.values()) if routed else None,
            cold_prefills=routed.cold_prefills if routed else None,
            ideal_cold_prefills=routed.conversations if routed else None,
            hits=routed.hits if routed else None, ideal_hits=routed.ideal_hits if routed else None,
            extra_prefill_tokens=extra, routing_cost=cost, **cls._timing(run, cls._ttft(run, settings)),
            answers=None, passed=_passed(outcomes.verdict_label({run.key.id})),
            error=None if routed else "no per-replica counters around the rounds", runs=(run,),
        )  # fmt: skip

    @staticmethod
    def _ttft(run: RunRecord, settings: Settings) -> Interval | None:
        try:
            return median_interval(
                run.samples_ms("ttfts"), samples=settings.bootstrap_samples, confidence=settings.confidence
            )
        except ValueError:  # no per-request samples: the median the benchmark printed, no interval
            return None

    @staticmethod
    def _timing(run: RunRecord, ttft: Interval | None) -> dict[str, Any]:
        return {
            "median_ttft_ms": ttft.estimate if ttft else run.median_ms("ttfts"),
            "median_ttft_low_ms": ttft.low if ttft else None, "median_ttft_high_ms": ttft.high if ttft else None,
            "p90_ttft_ms": run.percentile_ms("ttfts", 90, "p90_ttft_ms"),
            "p99_ttft_ms": run.percentile_ms("ttfts", 99, "p99_ttft_ms"),
            "output_throughput": run.per_second("total_output_tokens"),
            "request_throughput": run.per_second("completed"),
        }  # fmt: skip


def _tier(row: TierRow) -> str:
    if not RunKey.parse(row.id).mode.tier:
        return "none"
    return f"CPU {row.tier_gib:g} GiB" if row.tier_gib is not None else "CPU"


@dataclass(frozen=True, kw_only=True)
class TierRow(MeasuredRow):
    """One run of the offload case (N: a small GPU cache alone, O: the same with a CPU tier), or of the
    multi-turn case on such caches (M-c1-small-cache, M-c1-offload-tier): the prompt tokens each tier served
    and what was computed (the first repeat's by-source counters, every turn together), against the
    prediction across tiers and the replay of vLLM's block pool for the GPU cache alone."""

    id: str = stored(None)
    case: str = stored("case", str)
    concurrency: int = stored("conc")
    tier_gib: float | None = stored("tier GiB")
    gpu_blocks: int | None = stored("GPU blocks")
    prefix_groups: int = stored(None)
    input_tokens: int | None = stored("prompt tokens")
    gpu_cache_hits: int | None = stored("GPU cache hits")
    tier_hits: int | None = stored("tier hits")
    computed_tokens: int | None = stored("computed")
    hits_all_tiers: int | None = stored("hits, all tiers")
    expected_hits: int | None = stored("predicted")
    gpu_cache_hits_replayed: int | None = stored("GPU hits replayed")
    prefix_cache_queries: int | None = stored("queries counted")
    median_ttft_ms: float | None = stored("TTFT ms")
    p90_ttft_ms: float | None = stored("p90 TTFT ms", sparse=True)
    p99_ttft_ms: float | None = stored("p99 TTFT ms")
    answers: str | None = stored("answers", sparse=True)
    verdict: str = stored("verdict", default="-", cell=verdict_cell)

    TERMINAL: ClassVar[tuple[Column[Any], ...]] = (
        Column("case", lambda r: r.case if r.case != "M" else "M turns"),
        Column("c", lambda r: r.concurrency),
        Column("tier", _tier),
        Column("GPU blocks", lambda r: num(r.gpu_blocks)),
        Column("GPU hits", lambda r: num(r.gpu_cache_hits)),
        Column("tier hits", lambda r: num(r.tier_hits)),
        Column("computed", lambda r: num(r.computed_tokens)),
        Column("all tiers/predicted", lambda r: two(r.hits_all_tiers, r.expected_hits, "/")),
        Column("GPU replayed", lambda r: num(r.gpu_cache_hits_replayed)),
        Column("TTFT ms", lambda r: num(r.median_ttft_ms)),
        Column("p90 TTFT ms", lambda r: num(r.p90_ttft_ms), verbose=True, shown=present("p90_ttft_ms")),
        Column("answers", lambda r: r.answers or MISSING, shown=present("answers")),
        Column("verdict", verdict_cell),
    )

    @classmethod
    def build(
        cls,
        run: RunRecord,
        outcomes: Outcomes,
        compared_with: Collection[str] = (),
        reference: RunRecord | None = None,
    ) -> TierRow:
        """``reference``: the run without the tier that the tier's run is compared with (its answers too)."""
        d = run.repeats[0].delta
        sizes = run.server.offload
        replayed = run.local_hits_predicted
        if run.turns:  # the multi-turn case: its turns' replays together (the first repeat's, as the counters)
            first = [t.replayed for t in run.turns if t.repeat == 0]
            replayed = None if None in first else sum(t or 0 for t in first)
        return cls(
            id=run.key.id, case=run.key.case, concurrency=run.key.concurrency,
            tier_gib=sizes.get("tier_gib") if run.key.mode.tier else None,
            gpu_blocks=run.server.num_gpu_blocks, prefix_groups=run.workload.prefix_groups,
            input_tokens=run.bench.get("total_input_tokens"),
            gpu_cache_hits=d.cached_tokens if d else None, tier_hits=d.external_tokens if d else None,
            computed_tokens=d.computed_tokens if d else None, hits_all_tiers=tier_hits(d) if d else None,
            expected_hits=run.prediction.expected_hits if run.prediction else None,
            gpu_cache_hits_replayed=replayed,
            prefix_cache_queries=d.prefix_cache_queries if d else None,
            median_ttft_ms=run.median_ms("ttfts"), p90_ttft_ms=run.percentile_ms("ttfts", 90, "p90_ttft_ms"),
            p99_ttft_ms=run.percentile_ms("ttfts", 99, "p99_ttft_ms"), answers=answers.compared(run, reference).cell,
            verdict=outcomes.verdict_label({run.key.id}, compared_with), runs=(run,),
        )  # fmt: skip


def pair_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[PairRow]:
    """Every ON run of the default APC server with its OFF partner, in matrix order, with the verdicts'
    outcome (runs on --apc-hash-algos servers are compared with the default's in ``algo_rows``)."""
    rows = []
    for key in sorted(records, key=lambda k: (k.case, k.concurrency)):
        # The tiers have rows of their own; a variant (M-c8-compact) has no OFF twin.
        if key.case not in PAIRS or key.hash_algo or key.variant or key.family == "offload":
            continue
        off = records.get(RunKey(PAIRS[key.case], key.concurrency))
        if off is None:
            continue
        rows.append(PairRow.build(off, records[key], outcomes, settings))
    return rows


def algo_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[AlgoRow]:
    """Every run measured on a --apc-hash-algos server with its default-algorithm twin."""
    rows = []
    for key in sorted(records, key=lambda k: (k.hash_algo, k.case, k.concurrency)):
        default = records.get(RunKey(key.case, key.concurrency))
        if not key.hash_algo or default is None:
            continue
        rows.append(AlgoRow.build(default, records[key], outcomes, settings))
    return rows


def fleet_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes, settings: Settings) -> list[FleetRow]:
    """Every fleet run (a route is set), by concurrency and route. Never a pair: case R has no OFF run."""
    keys = sorted((k for k in records if k.route), key=lambda k: (k.concurrency, k.route))
    return [FleetRow.build(records[key], outcomes, settings) for key in keys]


def tier_rows(records: Mapping[RunKey, RunRecord], outcomes: Outcomes) -> list[TierRow]:
    """Every run on a small GPU cache (the offload case, then the multi-turn case's), by concurrency, without
    the tier first. Each row is compared with the other tier's run at its concurrency (a verdict comparing the
    two judges both rows)."""
    keys = sorted((k for k in records if k.mode.cache), key=lambda k: (k.family, k.concurrency, k.mode.tier))
    return [
        TierRow.build(
            records[key],
            outcomes,
            {k.id for k in keys if (k.family, k.concurrency) == (key.family, key.concurrency) and k != key},
            records.get(RunKey(PAIRS[key.case], key.concurrency))
            if key.case in PAIRS and key.family == "offload"
            else None,
        )
        for key in keys
    ]


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
        """results.json's ``pairs``."""
        return [row.to_json() for row in self.pairs]

    def algo_numbers(self) -> list[dict[str, Any]]:
        """results.json's ``hash_algos``."""
        return [row.to_json() for row in self.algos]

    def fleet_numbers(self) -> list[dict[str, Any]]:
        """results.json's ``fleet``."""
        return [row.to_json() for row in self.fleet]

    def offload_numbers(self) -> list[dict[str, Any]]:
        """results.json's ``offload``."""
        return [row.to_json() for row in self.offload]
