"""One measured run on a ready deployment: ``--apc-repeats`` cold repeats of

    route (a fleet: the router's policy) -> reset the prefix cache (APC on; every replica; verified)
    -> scrape /metrics -> vLLM's benchmark
    -> wait until the server is idle -> scrape again -> keep the counter deltas

then the answers probe (a few prompts sent again, with and without the cache: measure/answers.py), and
the hit prediction for the run, made from the server's block size and chat-template header.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_apc.config import Settings
from pytest_apc.measure import multiturn
from pytest_apc.measure.answers import Probe, ProbeError, run_probe
from pytest_apc.measure.bench import BenchRunner, bench_args
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.serving import metrics
from pytest_apc.serving.client import http_session
from pytest_apc.serving.deployment import Deployment
from pytest_apc.workload import eviction
from pytest_apc.workload.cases import RunKey, Workload, predict, workload_for


class Measurer:
    """Measures runs with one benchmark worker; results and benchmark logs go to ``bench_dir``."""

    def __init__(self, settings: Settings, bench: BenchRunner, model: str, bench_dir: Path) -> None:
        self.settings = settings
        self.bench = bench
        self.model = model
        self.bench_dir = bench_dir

    def run(self, key: RunKey, deployment: Deployment) -> RunRecord:
        if key.family == "multiturn":
            return multiturn.measure(key, deployment, self.settings, self.bench, self.model, self.bench_dir)
        started = time.monotonic()
        workload = workload_for(key.family, self.settings)
        repeats = self.settings.repeats
        names = [f"{key.id}-r{i + 1}" if repeats > 1 else key.id for i in range(repeats)]
        results = [self._once(key, workload, deployment, name, last=name == names[-1]) for name in names]
        probes, probe_error = self._probe(key, deployment, self.bench_dir / f"{names[-1]}.prompts.json")
        header = deployment.info.chat_header_tokens
        record = RunRecord(
            key=key,
            workload=workload,
            server=deployment.info,
            repeats=results,
            header_tokens=header if header is not None else -1,  # -1: not measured
            wall_s=round(time.monotonic() - started, 3),
            probes=probes,
            probe_error=probe_error,
        )
        if header is not None and deployment.info.block_size:
            record.prediction = predict(
                workload, header, deployment.info.block_size, int(results[0].bench["total_input_tokens"])
            )
            if key.family == "offload":
                record.local_hits_predicted = replay_local_hits(record)
        return record

    def _probe(self, key: RunKey, deployment: Deployment, prompts_path: Path) -> tuple[list[Probe], str | None]:
        """The answers probe after the run's last repeat (measure/answers.py): its probes, or why there are
        none (the answers verdict fails with it)."""
        s = self.settings
        try:
            prompts = json.loads(prompts_path.read_text())
        except (OSError, ValueError) as err:
            return [], f"the benchmark worker left no prompts to probe ({prompts_path}: {err})"
        headers = {"X-Session-ID": f"pytest-apc-{key.id}"} if key.route else {}
        try:
            probes = run_probe(
                http_session(s.api_key, s.ca_bundle), deployment.url, deployment.served_model_name, prompts,
                apc=key.apc, count=s.answers_probes, max_tokens=s.answers_tokens, top_k=s.answers_top_k,
                salt_prefix=f"pytest-apc-{key.id}-{time.time_ns()}", headers=headers, timeout=s.bench_timeout,
            )  # fmt: skip
        except ProbeError as err:
            return [], f"{err}\n{deployment.mode.name} server log: {deployment.log_path}"
        deployment.check_alive("after the answers probe")
        return probes, None

    def _once(self, key: RunKey, workload: Workload, deployment: Deployment, name: str, last: bool) -> Repeat:
        """One cold run (the last one also keeps the prompts it sent, for the answers probe)."""
        router_command = deployment.route(key.route) if key.route else ""
        reset = deployment.reset_prefix_cache() if key.apc else None
        deployment.check_alive("before the run")
        before: metrics.Snapshot | None
        metrics_error: str | None = None
        try:
            before = deployment.wait_idle()
        except metrics.MetricsError as err:
            before, metrics_error = None, str(err)
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        argv = bench_args(
            workload,
            key,
            base_url=deployment.url,
            model=self.model,
            tokenizer=self.settings.tokenizer,
            served_model_name=deployment.served_model_name,
            result_dir=self.bench_dir,
            result_filename=f"{name}.json",
        )
        outcome = self.bench.run(
            argv,
            self.bench_dir / f"{name}.json",
            workload.num_prompts,
            self.bench_dir / f"{name}.log",
            self.settings.bench_timeout,
            watch=deployment.watch,
            prompts_path=self.bench_dir / f"{name}.prompts.json" if last else None,
        )
        deployment.check_alive("after the benchmark")
        delta, parts = None, {}
        if before is not None:
            try:
                after = deployment.wait_idle()
                # The parts first: a replica that restarted is named, not only the fleet's sum.
                parts = metrics.part_deltas(before, after)
                delta = metrics.delta(before, after)
            except metrics.MetricsError as err:
                metrics_error = str(err)
        path = str(outcome.result_path)
        groups = list(outcome.prompt_groups)
        return Repeat(outcome.result, delta, metrics_error, reset, path, outcome.command, parts, router_command, groups)


def replay_local_hits(record: RunRecord) -> int | None:
    """The local hits vLLM's block pool gives the first repeat's requests, in the order they were sent and
    with the prompt lengths the server counted (eviction.py); None when the benchmark did not say them."""
    repeat, info, p = record.repeats[0], record.server, record.prediction
    lengths = repeat.bench.get("input_lens") or []
    outputs = repeat.bench.get("output_lens") or []
    groups = repeat.prompt_groups
    if p is None or not info.num_gpu_blocks or not (len(groups) == len(lengths) == len(outputs) > 0):
        return None
    requests = [eviction.Request(g, int(n), int(o)) for g, n, o in zip(groups, lengths, outputs, strict=True)]
    hits = eviction.local_hits(
        requests,
        header_tokens=record.header_tokens,
        shared_tokens=p.shared_prefix_tokens,
        block_size=p.block_size,
        gpu_blocks=info.num_gpu_blocks,
    )
    return sum(hits)
