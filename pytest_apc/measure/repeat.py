"""One measured cold repeat, for every case (one server, a fleet, every round of a multi-turn run):

    route (a fleet: the router's policy) -> reset the prefix cache (APC on; every replica; verified)
    -> then for each benchmark of the repeat (one; a multi-turn run: one or two per round):
       alive? -> wait until idle, scrape /metrics -> vLLM's benchmark -> alive?
       -> wait until idle, scrape again -> the counter deltas (the sum and each replica's)

A failed scrape is not a failed run: the repeat keeps its benchmark and says why it has no counters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_apc.measure.bench import BenchOutcome, BenchRunner
from pytest_apc.serving import metrics
from pytest_apc.serving.interface import Deployment, ServerInfo
from pytest_apc.workload.cases import RunKey
from pytest_apc.workload.offload import OffloadSizes


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of a repeat: its arguments, the name of its files under the benchmark folder (result
    ``<name>.json``, log ``<name>.log``), the prompts it sends, and what a failure calls the moments
    before and after it."""

    argv: list[str]
    name: str
    num_prompts: int
    before: str = "before the run"
    after: str = "after the benchmark"
    keep_prompts: bool = False  # write the prompts it sent to <name>.prompts.json (the answers probe)


@dataclass(frozen=True)
class Counted:
    """One benchmark between two idle scrapes: its outcome and counter deltas (None where not read; the
    parts: each replica's or data-parallel engine's, None where not read)."""

    outcome: BenchOutcome
    delta: metrics.Delta | None
    parts: dict[str, metrics.Delta] | None


@dataclass(frozen=True)
class RepeatRun:
    """One cold repeat: how it was routed and reset, each benchmark counted, and why a scrape failed."""

    router_command: str
    reset: str | None
    counted: list[Counted]
    metrics_error: str | None


@dataclass(frozen=True)
class Bencher:
    """What runs the benchmarks of a run: the worker, where their files go and how long one may take."""

    runner: BenchRunner
    bench_dir: Path
    timeout: float

    def measure_repeat(
        self, key: RunKey, deployment: Deployment, benchmarks: Callable[[], Sequence[Benchmark]]
    ) -> RepeatRun:
        """Route, reset, then each benchmark between two idle scrapes (the module's docstring). The
        benchmarks are made once the repeat is routed: a launched router's URL is known only then."""
        router_command = deployment.route(key.route) if key.route else ""
        reset = deployment.reset_prefix_cache() if key.apc else None
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        errors: list[str] = []
        counted = [self._count(deployment, benchmark, errors) for benchmark in benchmarks()]
        return RepeatRun(router_command, reset, counted, errors[-1] if errors else None)

    def _count(self, deployment: Deployment, benchmark: Benchmark, errors: list[str]) -> Counted:
        deployment.check_alive(benchmark.before)
        before: metrics.Snapshot | None
        try:
            before = deployment.wait_idle()
        except metrics.MetricsError as err:
            before = None
            errors.append(str(err))
        name = benchmark.name
        outcome = self.runner.run(
            benchmark.argv,
            self.bench_dir / f"{name}.json",
            benchmark.num_prompts,
            self.bench_dir / f"{name}.log",
            self.timeout,
            watch=deployment.watch,
            prompts_path=self.bench_dir / f"{name}.prompts.json" if benchmark.keep_prompts else None,
        )
        deployment.check_alive(benchmark.after)
        delta, parts = None, None
        if before is not None:
            try:
                after = deployment.wait_idle()
                # The parts first: a replica that restarted is named, not only the fleet's sum.
                parts = metrics.part_deltas(before, after)
                delta = metrics.delta(before, after)
                note_tier(deployment.info, after)
            except metrics.MetricsError as err:
                errors.append(str(err))
        return Counted(outcome, delta, parts)


def note_tier(info: ServerInfo, after: metrics.Snapshot) -> None:
    """The tier's capacity as the server reports it, once it does (after its first request): the runs, the
    results and the diagnoses then read what the tier really holds, not what its GiB were worked out to hold."""
    if info.offload and after.offload_config and info.offload.get("reported_tier_tokens") is None:
        info.offload = OffloadSizes.of(info.offload).reported(after.offload_config, info.block_size).as_dict()
