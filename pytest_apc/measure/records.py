"""The measured data that verdicts and reports read: run records, their repeats, counter deltas, the
identity of the server each ran on, and the error of a run that could not be measured.

Plain data only (no servers, no benchmark): it crosses between xdist workers as JSON through the run's
store (``Measured.to_state`` / ``from_state``) and is what the results file is written from
(``RunRecord.to_json``) and read back as (``RunRecord.from_json``, the current schema version): the verdicts, the
report's rows and the baseline gate all read runs as :class:`RunRecord`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_apc.measure.answers import Answer, Probe
from pytest_apc.serving import metrics
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload.cases import Prediction, RunKey, ServerMode, Workload
from pytest_apc.workload.fit import Fitted
from pytest_apc.workload.multiturn import TurnRecord


class MeasurementError(AssertionError):
    """A run that could not be measured; the message says what happened and how to reproduce it."""


class RunSkipped(Exception):
    """A run not measured because it does not fit the model's context at the length scale the user set: the
    tests that use it skip with this reason (``fit.Fitted.skipped``)."""


@dataclass
class Repeat:
    """One cold benchmark run: its result, the counter deltas around it and how the cache was reset."""

    bench: dict[str, Any]
    delta: metrics.Delta | None
    metrics_error: str | None
    reset: str | None
    result_file: str
    command: str
    # Per replica (fleet) or data-parallel engine: name -> counter deltas; {} for one server.
    parts: dict[str, metrics.Delta] = field(default_factory=dict)
    router_command: str = ""  # the router that routed this repeat (a fleet behind a launched router)
    prompt_groups: list[int] = field(default_factory=list)  # each request's prefix group, in sending order
    # A repeat read back from a results file: the mean and median TTFT (ms) the file stored for it (None
    # where the run did not measure it). They are what the gate judges, not recomputed from the file's
    # per-request TTFTs, which it rounds.
    stored_ttft_ms: dict[str, float | None] | None = None
    # Each request's answer (token ids, text, top-k logprobs) where the benchmark asked for them
    # (``answers_logprobs``), decoded once where it is read (the benchmark's file, the store); kept in the
    # store, not in the results file (its verdict holds the outcomes).
    answers: list[Answer] | None = None

    def ttft_ms(self, statistic: str) -> float | None:
        """This repeat's ``mean`` or ``median`` TTFT (ms) over its requests: the per-repeat values the
        baseline gate and ``calibrate`` judge (a repeat is the unit of noise); the benchmark's own number
        when it saved no per-request values; what a results file stored, for a repeat read back from one."""
        if self.stored_ttft_ms is not None:
            return self.stored_ttft_ms.get(statistic)
        ttfts = self.bench.get("ttfts") or []
        if ttfts:
            values = np.asarray(ttfts, dtype=float) * 1000.0
            return float(np.mean(values) if statistic == "mean" else np.median(values))
        own = self.bench.get(f"{statistic}_ttft_ms")
        return float(own) if own is not None else None

    def require_counters(self, run_id: str, server_mode: str) -> metrics.Delta:
        """The counter deltas, or a "cannot verify" failure naming what is missing."""
        if self.metrics_error:
            raise MeasurementError(f"cannot verify the prefix cache of run {run_id}: {self.metrics_error}")
        if self.delta is None:
            raise MeasurementError(f"cannot verify the prefix cache of run {run_id}: no counters were read around it")
        missing = self.delta.missing()
        if missing:
            raise MeasurementError(
                f"cannot verify the prefix cache of run {run_id}: /metrics of the {server_mode} server "
                f"has no {', '.join(missing)} counter (looked for "
                f"{', '.join(n for m in missing for n in metrics.COUNTER_NAMES[m])}); "
                "metrics disabled or a vLLM too old for per-run deltas"
            )
        return self.delta


@dataclass
class RunRecord:
    """One measured run (``--apc-repeats`` cold repeats of it), as tests see it and the results file stores it."""

    key: RunKey
    workload: Workload
    server: ServerInfo
    repeats: list[Repeat]
    header_tokens: int
    wall_s: float
    prediction: Prediction | None = None
    # The offload case: local hits of a replay of vLLM's block pool over the requests as sent (eviction.py);
    # exact at concurrency 1.
    local_hits_predicted: int | None = None
    # The answers probe after the last repeat (answers.py): a few prompts' answers with and without the
    # cache; ``probe_error`` says why there are none.
    probes: list[Probe] = field(default_factory=list)
    probe_error: str | None = None
    # The salted reference (an APC-on run whose answers are judged against it, run.py): the run sent once
    # more after its repeats, each request with a cache_salt of its own, counted like a repeat.
    salted: Repeat | None = None
    # The multi-turn case: every round of every repeat, measured and predicted (each repeat holds its rounds
    # merged: totals summed, per-request values in sending order).
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def bench(self) -> dict[str, Any]:
        """The first repeat's benchmark result (every repeat has the same prompts and arguments)."""
        return self.repeats[0].bench

    @property
    def delta(self) -> metrics.Delta | None:
        return self.repeats[0].delta

    @property
    def metrics_error(self) -> str | None:
        return self.repeats[0].metrics_error

    @property
    def bench_command(self) -> str:
        return self.repeats[0].command

    def samples_ms(self, metric: str = "ttfts") -> np.ndarray:
        """Per-request samples of every repeat, pooled, in milliseconds (``ttfts`` or ``latencies``)."""
        values = [v for r in self.repeats for v in (r.bench.get(metric) or [])]
        return np.asarray(values, dtype=float) * 1000.0

    def percentile_ms(self, metric: str, q: float, own: str) -> float | None:
        """A percentile of every repeat's per-request values, as vLLM's bench computes its own (numpy); the
        first repeat's own number ``own`` (e.g. ``p99_ttft_ms``) when the benchmark saved no per-request values."""
        samples = self.samples_ms(metric)
        return float(np.percentile(samples, q)) if samples.size else self.bench.get(own)

    def median_ms(self, metric: str = "ttfts") -> float:
        samples = self.samples_ms(metric)
        return float(np.median(samples)) if samples.size else float(self.bench["median_ttft_ms"])

    @property
    def duration_s(self) -> float:
        return float(np.mean([float(r.bench["duration"]) for r in self.repeats]))

    def per_second(self, total: str) -> float | None:
        """A benchmark total (``total_input_tokens``, ``total_output_tokens``, ``completed``) per second,
        summed over every repeat and divided by their summed durations."""
        values: list[float] = [float(r.bench[total]) for r in self.repeats if r.bench.get(total) is not None]
        seconds = float(np.sum([float(r.bench["duration"]) for r in self.repeats]))
        if seconds <= 0 or len(values) < len(self.repeats):
            return None
        return float(np.sum(values)) / seconds

    @property
    def block_size(self) -> int | None:
        return self.server.block_size

    def require_counters(self) -> list[tuple[Repeat, metrics.Delta]]:
        """Every repeat with its counter deltas, or a "cannot verify" failure naming what is missing."""
        return [(r, r.require_counters(self.key.id, self.server.mode)) for r in self.repeats]

    def to_json(self) -> dict[str, Any]:
        b = self.bench
        duration = self.duration_s
        d = self.delta
        ttfts = self.samples_ms("ttfts")
        return {
            "id": self.key.id,
            "case": self.key.case,
            "family": self.key.family,
            "apc": self.key.apc,
            "hash_algo": (self.key.hash_algo or self.server.prefix_caching_hash_algo) if self.key.apc else None,
            "concurrency": self.key.concurrency,
            "num_prompts": self.workload.num_prompts,
            "dataset": self.workload.dataset,
            "prefix_len": self.workload.prefix_len,
            "suffix_len": self.workload.suffix_len,
            "output_len": self.workload.output_len,
            "seed": self.workload.seed,
            "completed": b["completed"],
            "failed": b["failed"],
            "total_input_tokens": b["total_input_tokens"],
            "total_output_tokens": b.get("total_output_tokens"),
            # Latencies and throughputs over every repeat.
            "median_ttft_ms": self.median_ms("ttfts"),
            "mean_ttft_ms": float(np.mean(ttfts)) if ttfts.size else b.get("mean_ttft_ms"),
            "p90_ttft_ms": self.percentile_ms("ttfts", 90, "p90_ttft_ms"),
            "p99_ttft_ms": self.percentile_ms("ttfts", 99, "p99_ttft_ms"),
            "median_tpot_ms": _median([r.bench.get("median_tpot_ms") for r in self.repeats]),
            "median_e2el_ms": self.percentile_ms("latencies", 50, "median_e2el_ms"),
            "p99_e2el_ms": self.percentile_ms("latencies", 99, "p99_e2el_ms"),
            "input_throughput": self.per_second("total_input_tokens"),
            "output_throughput": self.per_second("total_output_tokens"),
            "request_throughput": self.per_second("completed"),
            "repeats": len(self.repeats),
            "ttfts_ms": [round(float(t), 3) for t in ttfts],
            "prefix_cache_queries": d.prefix_cache_queries if d else None,
            "prefix_cache_hits": d.prefix_cache_hits if d else None,
            "hit_ratio": d.hit_ratio if d else None,
            "prompt_tokens": d.prompt_tokens if d else None,
            "computed_tokens": d.computed_tokens if d else None,
            "cached_tokens": d.cached_tokens if d else None,
            "external_tokens": d.external_tokens if d else None,
            "hits_all_tiers": tier_hits(d) if d else None,
            "local_hits_predicted": self.local_hits_predicted,
            "preemptions": d.preemptions if d else None,
            "metric_names": d.metric_names if d else {},
            "metrics_error": self.metrics_error,
            "block_size": self.block_size,
            "header_tokens": self.header_tokens,
            "prediction": self.prediction.as_dict() if self.prediction else None,
            "server": self.server.mode,
            "reset": self.repeats[0].reset,
            "bench_command": self.bench_command,
            "bench_result_file": self.repeats[0].result_file,
            "bench_duration_s": duration,
            "repeat_counters": [
                {
                    "file": r.result_file,
                    "duration_s": r.bench["duration"],
                    "mean_ttft_ms": r.ttft_ms("mean"),
                    "median_ttft_ms": r.ttft_ms("median"),
                    "delta": r.delta.as_dict() if r.delta else None,
                    **({"parts": {name: d.as_dict() for name, d in r.parts.items()}} if r.parts else {}),
                    **({"router_command": r.router_command} if r.router_command else {}),
                    **({"prompt_groups": r.prompt_groups} if r.prompt_groups else {}),
                }
                for r in self.repeats
            ],
            **({"route": self.key.route, "prefix_groups": self.workload.prefix_groups} if self.key.route else {}),
            "answers": {
                "probes": [p.to_json() for p in self.probes],
                "error": self.probe_error,
                **({"salted": _salted_json(self.salted)} if self.salted else {}),
            },
            "wall_s": self.wall_s,
            **({"turns": [t.to_json() for t in self.turns]} if self.turns else {}),
        }

    @classmethod
    def from_json(cls, run: Mapping[str, Any], server: ServerInfo | None = None) -> RunRecord:
        """A ``runs[]`` entry of a results file (what :meth:`to_json` wrote), read back; ``server`` is the
        ``servers[]`` entry it ran on (a bare one of its mode when the file has none). The key is the run's id.

        A file keeps less than the run had. Each repeat gets the run's benchmark totals, its own duration,
        counters and stored TTFTs, and its share of the pooled per-request TTFTs (``ttfts_ms``, in repeat
        order) where they split evenly. Optional fields the file lacks read as absent (None, 0 or empty)."""
        key = RunKey.parse(str(run["id"]))
        counters = list(run["repeat_counters"])
        shares = _shares([float(t) for t in run.get("ttfts_ms") or []], len(counters))
        repeats = [
            _repeat_from_json(run, counter, shares[i] if shares else [], first=i == 0)
            for i, counter in enumerate(counters)
        ]
        workload = Workload(
            family=key.family,
            prefix_len=int(run.get("prefix_len") or 0),
            suffix_len=int(run.get("suffix_len") or 0),
            output_len=int(run.get("output_len") or 0),
            num_prompts=int(run.get("num_prompts") or 0),
            seed=int(run.get("seed") or 0),
            prefix_groups=int(run.get("prefix_groups") or 1),
        )
        mode = str(run.get("server") or key.mode.name)
        answers = run.get("answers") or {}
        return cls(
            key=key,
            workload=workload,
            server=server or ServerInfo(mode, [], "", "", block_size=run.get("block_size")),
            repeats=repeats,
            header_tokens=int(run.get("header_tokens") or 0),
            wall_s=float(run.get("wall_s") or 0.0),
            prediction=_prediction(run.get("prediction")),
            local_hits_predicted=run.get("local_hits_predicted"),
            probes=[Probe.from_json(p) for p in answers.get("probes") or []],
            probe_error=answers.get("error"),
            turns=[TurnRecord.from_json(t) for t in run.get("turns") or []],
        )


def _salted_json(salted: Repeat) -> dict[str, Any]:
    """What a results file keeps of a run's salted reference: its benchmark and what it hit (each request's
    answer is compared in the ``same_answers`` verdict's numbers)."""
    d = salted.delta
    return {
        "file": salted.result_file,
        "command": salted.command,
        "duration_s": salted.bench.get("duration"),
        "mean_ttft_ms": salted.ttft_ms("mean"),
        "prefix_cache_queries": d.prefix_cache_queries if d else None,
        "prefix_cache_hits": d.prefix_cache_hits if d else None,
        "metrics_error": salted.metrics_error,
    }


# The run's figures over every repeat that a results file keeps without their per-request samples.
_POOLED_WITHOUT_SAMPLES = ("p90_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_e2el_ms", "p99_e2el_ms")


def _repeat_from_json(run: Mapping[str, Any], counter: Mapping[str, Any], share: list[float], *, first: bool) -> Repeat:
    """One repeat of a stored run: its ``repeat_counters[]`` entry, with the run's totals (every repeat sends
    the same prompts) and its share of the pooled per-request TTFTs."""
    totals = {name: run.get(name) for name in ("completed", "failed", "total_input_tokens", "total_output_tokens")}
    mean, median = counter.get("mean_ttft_ms"), counter.get("median_ttft_ms")
    bench = {**totals, "duration": counter.get("duration_s"), "ttfts": [t / 1000.0 for t in share],
             "mean_ttft_ms": mean, "median_ttft_ms": median}  # fmt: skip
    if first:
        # The file keeps no per-request latencies: the first repeat carries the run's stored figures, which
        # the record reports when it has no samples, so a run adopted by a resumed session keeps them.
        bench |= {name: run.get(name) for name in _POOLED_WITHOUT_SAMPLES}
    return Repeat(
        bench=bench,
        delta=_delta(counter.get("delta")),
        metrics_error=run.get("metrics_error") if first else None,
        reset=run.get("reset"),
        result_file=str(counter.get("file") or run.get("bench_result_file") or ""),
        command=str(run.get("bench_command") or ""),
        parts={name: d for name, part in (counter.get("parts") or {}).items() if (d := _delta(part)) is not None},
        router_command=str(counter.get("router_command") or ""),
        prompt_groups=list(counter.get("prompt_groups") or []),
        stored_ttft_ms={"mean": mean, "median": median},
    )


def server_from_json(info: Mapping[str, Any]) -> ServerInfo:
    """A ``servers[]`` entry of a results file, read back (fields it lacks take their defaults; ones this
    version does not know are left out)."""
    known = {f.name for f in dataclasses.fields(ServerInfo)}
    given = {name: value for name, value in info.items() if name in known}
    return ServerInfo(**{"mode": "", "command": [], "url": "", "log": "", **given})


def _shares(values: list[float], k: int) -> list[list[float]] | None:
    """``values`` (pooled over ``k`` repeats, in repeat order) split into each repeat's; None when they do
    not split evenly."""
    if not k or not values or len(values) % k:
        return None
    n = len(values) // k
    return [values[i * n : (i + 1) * n] for i in range(k)]


def _delta(data: Mapping[str, Any] | None) -> metrics.Delta | None:
    """Counter deltas as a results file stores them (``Delta.as_dict``; a counter the server lacked is None)."""
    if data is None:
        return None
    values: dict[str, Any] = {f.name: data.get(f.name) for f in dataclasses.fields(metrics.Delta)}
    return metrics.Delta(**{**values, "metric_names": data.get("metric_names") or {}})


def _prediction(data: Mapping[str, Any] | None) -> Prediction | None:
    """A stored prediction; None where the file has none."""
    if data is None:
        return None
    names = {f.name for f in dataclasses.fields(Prediction)}
    return Prediction(**{name: value for name, value in data.items() if name in names})


def tier_hits(d: metrics.Delta) -> int | None:
    """Prompt tokens served from a cache, both tiers: the by-source counters (exact, also where vLLM's
    query and hit counters over-count), else the hit counter plus any external hits."""
    if d.cached_tokens is not None:
        return d.cached_tokens + (d.external_tokens or 0)
    if d.prefix_cache_hits is None:
        return None
    return d.prefix_cache_hits + (d.external_tokens or 0)


def _median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return float(np.median(known)) if known else None


@dataclass
class Measured:
    """Everything one pytest run has measured so far: what the results file, the verdicts and the report
    read, and what xdist workers share through the store."""

    records: dict[RunKey, RunRecord] = field(default_factory=dict)
    errors: dict[RunKey, str] = field(default_factory=dict)  # runs that could not be measured, and why
    servers: dict[str, ServerInfo] = field(default_factory=dict)  # by mode name
    launches: dict[str, int] = field(default_factory=dict)  # servers started per mode name
    done_modes: set[ServerMode] = field(default_factory=set)  # measured (or failed): never launched again
    warnings: list[str] = field(default_factory=list)
    server_seconds: float = 0.0  # starting and stopping servers
    model: str | None = None  # what the launched servers loaded
    fit: Fitted | None = None  # how the selected runs were fitted to the model's context (None: they fit)

    def adopt(self, other: Measured) -> None:
        """Take in what another process of this run measured (it only ever adds)."""
        self.records.update(other.records)
        self.errors.update(other.errors)
        self.servers.update(other.servers)
        self.launches = {**self.launches, **other.launches}
        self.done_modes |= other.done_modes
        self.warnings = list(dict.fromkeys(self.warnings + other.warnings))
        self.server_seconds = max(self.server_seconds, other.server_seconds)
        self.model = self.model or other.model
        self.fit = other.fit or self.fit

    def to_state(self) -> dict[str, Any]:
        """JSON-ready data (``from_state`` reads it back)."""
        return {
            "records": [dataclasses.asdict(r) for r in self.records.values()],
            "errors": [[dataclasses.asdict(k), e] for k, e in self.errors.items()],
            "servers": {name: dataclasses.asdict(info) for name, info in self.servers.items()},
            "launches": self.launches,
            "done_modes": [dataclasses.asdict(m) for m in sorted(self.done_modes)],
            "warnings": self.warnings,
            "server_seconds": self.server_seconds,
            "model": self.model,
            "fit": self.fit.as_dict() if self.fit else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Measured:
        records = [_record_from_state(r) for r in state["records"]]
        return cls(
            records={r.key: r for r in records},
            errors={RunKey(**k): e for k, e in state["errors"]},
            servers={name: ServerInfo(**info) for name, info in state["servers"].items()},
            launches=dict(state["launches"]),
            done_modes={ServerMode(**m) for m in state["done_modes"]},
            warnings=list(state["warnings"]),
            server_seconds=float(state["server_seconds"]),
            model=state["model"],
            fit=Fitted.from_dict(state["fit"]) if state.get("fit") else None,
        )


def _repeat_from_state(r: dict[str, Any]) -> Repeat:
    answers = r.get("answers")
    return Repeat(
        **{
            **r,
            "delta": metrics.Delta(**r["delta"]) if r["delta"] is not None else None,
            "parts": {name: metrics.Delta(**d) for name, d in r.get("parts", {}).items()},
            "answers": [Answer.from_json(a) for a in answers] if answers is not None else None,
        }
    )


def _record_from_state(state: dict[str, Any]) -> RunRecord:
    repeats = [_repeat_from_state(r) for r in state["repeats"]]
    prediction = state["prediction"]
    return RunRecord(
        key=RunKey(**state["key"]),
        workload=Workload(**state["workload"]),
        server=ServerInfo(**state["server"]),
        repeats=repeats,
        header_tokens=state["header_tokens"],
        wall_s=state["wall_s"],
        prediction=Prediction(**prediction) if prediction is not None else None,
        local_hits_predicted=state.get("local_hits_predicted"),
        probes=[Probe.from_json(p) for p in state.get("probes") or []],
        probe_error=state.get("probe_error"),
        salted=_repeat_from_state(state["salted"]) if state.get("salted") else None,
        turns=[TurnRecord.from_json(t) for t in state.get("turns") or []],
    )
