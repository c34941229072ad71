"""``/metrics`` snapshots and per-run deltas, parsed with ``prometheus_client``.

vLLM counts prefix-cache lookups in tokens: ``vllm:prefix_cache_queries_total`` (every admitted
request's prompt) and ``vllm:prefix_cache_hits_total`` (whole blocks served from the cache). The
counters are monotonic (``/reset_prefix_cache`` does not reset them), so a run's numbers are the
difference of two snapshots. Every series is summed over the ``engine`` label (one per data-parallel
rank); with more than one engine each rank's own series are kept too (``Snapshot.parts``), as are each
replica's in a fleet (``merge``). Older vLLM names (``vllm:gpu_prefix_cache_*``) are used when the current
ones are absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Logical counter -> exposed names, newest first.
COUNTER_NAMES: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "external_prefix_cache_hits": ("vllm:external_prefix_cache_hits_total",),
    "requests": ("vllm:request_success_total",),  # finished requests, every finished_reason
}
# prompt_tokens_by_source{source=...} -> logical name.
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
SOURCES = {
    "local_compute": "computed_tokens",
    "local_cache_hit": "cached_tokens",
    "external_kv_transfer": "external_tokens",
}
GAUGES: dict[str, tuple[str, ...]] = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# vLLM 0.33+, with a CPU offload tier, from its first request on: what the tier allocated (cpu_num_chunks...).
OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
# prometheus_client's process collector: when it changes between two scrapes, the server restarted.
PROCESS_START = "process_start_time_seconds"
# The counters a verdict on cached tokens cannot do without.
REQUIRED = ("prefix_cache_queries", "prefix_cache_hits")


class MetricsError(RuntimeError):
    """``/metrics`` could not be parsed or lacks what a check needs."""


@dataclass(frozen=True)
class Snapshot:
    """One scrape: samples keyed by (name, sorted labels without ``engine``), summed over engines."""

    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]
    cache_config: Mapping[str, str] = field(default_factory=dict)
    offload_config: Mapping[str, str] = field(default_factory=dict)
    # Where the counters come from when there is more than one source: "engine 0", "engine 1" (one vLLM
    # server with data-parallel ranks) or one name per replica of a fleet (``merge``).
    parts: Mapping[str, Snapshot] = field(default_factory=dict)

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of every series of ``name`` whose labels include ``labels``; None when absent."""
        found = [v for (n, lab), v in self.samples.items() if n == name and set(labels.items()) <= set(lab)]
        return sum(found) if found else None

    def first_of(self, names: tuple[str, ...]) -> tuple[str, float] | None:
        for name in names:
            value = self.total(name)
            if value is not None:
                return name, value
        return None

    def counter(self, logical: str) -> float | None:
        found = self.first_of(COUNTER_NAMES[logical])
        return None if found is None else found[1]

    def gauge(self, logical: str) -> float | None:
        found = self.first_of(GAUGES[logical])
        return None if found is None else found[1]


def parse(text: str) -> Snapshot:
    """Parse Prometheus text exposition into a :class:`Snapshot`; raises :class:`MetricsError`."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    by_engine: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    cache_config: dict[str, str] = {}
    offload_config: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # prometheus_client's creation-time gauge for every counter
                if sample.name == CACHE_CONFIG_INFO and not cache_config:
                    cache_config = dict(sample.labels)
                if sample.name == OFFLOAD_CONFIG_INFO and not offload_config:
                    offload_config = dict(sample.labels)
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "engine"))
                key = (sample.name, labels)
                samples[key] = samples.get(key, 0.0) + float(sample.value)
                if "engine" in sample.labels:
                    engine = by_engine.setdefault(sample.labels["engine"], {})
                    engine[key] = engine.get(key, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError) as err:
        raise MetricsError(f"/metrics is not valid Prometheus text: {err}; first line: {text[:120]!r}") from err
    if not samples:
        raise MetricsError(f"/metrics has no samples; first line: {text[:120]!r}")
    ranks = sorted(by_engine, key=lambda rank: int(rank) if rank.isdigit() else -1)
    parts = (
        {f"engine {rank}": Snapshot(by_engine[rank], cache_config, offload_config) for rank in ranks}
        if len(by_engine) > 1
        else {}
    )
    return Snapshot(samples, cache_config, offload_config, parts)


def merge(parts: Mapping[str, Snapshot]) -> Snapshot:
    """One snapshot of several servers (the replicas of a fleet): every series summed, each kept as a part.
    The cache configuration is the first part's (the fleet checks that its replicas agree)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for snapshot in parts.values():
        for key, value in snapshot.samples.items():
            samples[key] = samples.get(key, 0.0) + value
    first = next(iter(parts.values()), None)
    return Snapshot(samples, first.cache_config if first else {}, first.offload_config if first else {}, dict(parts))


@dataclass(frozen=True)
class Delta:
    """What one run changed on the server."""

    prefix_cache_queries: int | None
    prefix_cache_hits: int | None
    prompt_tokens: int | None
    computed_tokens: int | None  # prompt_tokens_by_source{local_compute}
    cached_tokens: int | None  # prompt_tokens_by_source{local_cache_hit}
    external_tokens: int | None
    preemptions: int | None
    metric_names: dict[str, str]  # which exposed name each logical counter came from
    requests: int | None = None  # finished requests (request_success_total)

    @property
    def hit_ratio(self) -> float | None:
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    @property
    def prefill_computed(self) -> int | None:
        """Prompt tokens computed, not served from a cache: the by-source counter, else prompt - hits."""
        if self.computed_tokens is not None:
            return self.computed_tokens
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens - (self.prefix_cache_hits or 0)

    def missing(self) -> list[str]:
        return [name for name in REQUIRED if getattr(self, name) is None]

    def as_dict(self) -> dict[str, object]:
        data = dict(self.__dict__)
        data["hit_ratio"] = self.hit_ratio
        return data


def delta(before: Snapshot, after: Snapshot, where: str = "the server") -> Delta:
    """Counters after minus before; a counter absent from either scrape is None (never 0).

    Raises :class:`MetricsError` when ``where`` restarted between the scrapes (its process start time
    changed, or a counter went backwards): its counters began again from zero, so the difference is not
    what the run did."""
    started = before.total(PROCESS_START), after.total(PROCESS_START)
    if None not in started and started[0] != started[1]:
        raise MetricsError(
            f"{where} restarted during the run ({PROCESS_START} {started[0]:.2f} -> {started[1]:.2f}): its "
            "counters began again from zero, so this run's cached tokens cannot be known; run it again once "
            "the server stays up (or, when the metrics URL is a load balancer, point it at one server)"
        )
    names: dict[str, str] = {}
    values: dict[str, int | None] = {}
    for logical, candidates in COUNTER_NAMES.items():
        a, b = after.first_of(candidates), before.first_of(candidates)
        if a is None or b is None or a[0] != b[0]:
            values[logical] = None
            continue
        names[logical] = a[0]
        values[logical] = round(a[1] - b[1])
    for source, logical in SOURCES.items():
        a_val, b_val = after.total(BY_SOURCE, source=source), before.total(BY_SOURCE, source=source)
        values[logical] = None if a_val is None or b_val is None else round(a_val - b_val)
        if values[logical] is not None:
            names[logical] = f'{BY_SOURCE}{{source="{source}"}}'
    backwards = {logical: value for logical, value in values.items() if value is not None and value < 0}
    if backwards:
        fell = ", ".join(f"{logical} by {-value:,}" for logical, value in backwards.items())
        raise MetricsError(
            f"{where} restarted during the run (counters went backwards: {fell}): they began again from zero, "
            "so this run's cached tokens cannot be known; run it again once the server stays up"
        )
    return Delta(
        prefix_cache_queries=values["prefix_cache_queries"],
        prefix_cache_hits=values["prefix_cache_hits"],
        prompt_tokens=values["prompt_tokens"],
        computed_tokens=values["computed_tokens"],
        cached_tokens=values["cached_tokens"],
        external_tokens=values["external_tokens"],
        preemptions=values["preemptions"],
        metric_names=names,
        requests=values["requests"],
    )


def part_deltas(before: Snapshot, after: Snapshot) -> dict[str, Delta]:
    """The deltas of every part (engine or replica) present in both snapshots; {} for a single server."""
    return {
        name: delta(part, after.parts[name], where=name) for name, part in before.parts.items() if name in after.parts
    }
