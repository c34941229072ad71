"""One measured run on a ready deployment: ``--apc-repeats`` cold repeats (each one benchmark, measured by
``repeat.Bencher.measure_repeat``: route, reset, idle scrape, benchmark, idle scrape, deltas; a multi-turn
run: one benchmark per round, ``multiturn.measure``), then the answers probe (a few prompts sent again,
with and without the cache: measure/answers.py; not where every request is judged exactly), the salted
reference where the answers are judged against it (the run once more, each request with a cache_salt of
its own), and the hit prediction for the run, made from the server's block size and chat-template header.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pytest_apc.config import Settings
from pytest_apc.measure import multiturn
from pytest_apc.measure.answers import Probe, ProbeError, exact_server, run_probe
from pytest_apc.measure.bench import LOGPROBS_OPTION, SALT_OPTION, BenchRunner, bench_args
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.measure.repeat import Bencher, Benchmark
from pytest_apc.serving.client import http_session
from pytest_apc.serving.deployment import Deployment
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload import eviction
from pytest_apc.workload.cases import RunKey, Workload, predict
from pytest_apc.workload.plan import PlannedRun


class Measurer:
    """Measures runs with one benchmark worker; results and benchmark logs go to ``bench_dir``."""

    def __init__(self, settings: Settings, bench: BenchRunner, model: str, bench_dir: Path) -> None:
        self.settings = settings
        self.model = model
        self.bench_dir = bench_dir
        self.bencher = Bencher(bench, bench_dir, settings.bench_timeout)

    def run(self, run: PlannedRun, deployment: Deployment) -> RunRecord:
        key, workload = run.key, run.workload
        if key.family == "multiturn":
            return multiturn.measure(key, workload, deployment, self.settings, self.bencher, self.model)
        started = time.monotonic()
        repeats = self.settings.repeats
        names = [f"{key.id}-r{i + 1}" if repeats > 1 else key.id for i in range(repeats)]
        results = [self._once(key, workload, deployment, name, last=name == names[-1]) for name in names]
        salting = wants_salted(key, self.settings, deployment.info)
        probes: list[Probe] = []
        probe_error: str | None = None
        if wants_probe(key, self.settings, deployment.info, salting):
            probes, probe_error = self._probe(key, deployment, self.bench_dir / f"{names[-1]}.prompts.json")
        salted = self._salted(key, workload, deployment) if salting else None
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
            salted=salted,
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

    def _salted(self, key: RunKey, workload: Workload, deployment: Deployment) -> Repeat:
        """The answers' same-server reference: the run sent once more after its repeats (and the probe), each
        request with a cache_salt of its own, so that every request is computed without the cache at the
        run's concurrency; counted like a repeat, so the verdict can check that it hit nothing."""
        salt = f"pytest-apc-{key.id}-{time.time_ns()}"
        return self._once(key, workload, deployment, f"{key.id}-salted", last=False, salt=salt)

    def _once(
        self, key: RunKey, workload: Workload, deployment: Deployment, name: str, last: bool, salt: str = ""
    ) -> Repeat:
        """One cold repeat of one benchmark (the last one also keeps the prompts it sent, for the answers
        probe; ``salt``: every request with a cache_salt of its own, the salted reference)."""

        def benchmark() -> list[Benchmark]:
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
            if salt:
                argv += [SALT_OPTION, salt]
            if wants_logprobs(key, self.settings, deployment.info):
                argv += [LOGPROBS_OPTION, str(self.settings.answers_top_k)]
            return [Benchmark(argv, name, workload.num_prompts, keep_prompts=last)]

        done = self.bencher.measure_repeat(key, deployment, benchmark)
        counted = done.counted[0]
        outcome = counted.outcome
        # Two correct computations drift further apart the longer they generate, while a wrong cache shows
        # within the first tokens: each answer is judged on its first answers_tokens, as a probe's is.
        answers = [a.first(self.settings.answers_tokens) for a in outcome.answers] if outcome.answers else None
        return Repeat(
            outcome.result, counted.delta, done.metrics_error, done.reset, str(outcome.result_path), outcome.command,
            counted.parts or {}, done.router_command, list(outcome.prompt_groups), answers=answers,
        )  # fmt: skip


def wants_salted(key: RunKey, settings: Settings, server: ServerInfo) -> bool:
    """Whether an APC-on run gets the salted reference run (``answers_reference``; multi-turn runs are
    probed only): always for ``salted``; for ``auto`` where the twin is no reference that a request can be
    judged against: vLLM's batch-invariant mode (exact with itself, not with its twin; not eager, which is
    not exact with itself), a run without a twin (a fleet route, a hash-algorithm server) on an exact build,
    and any run whose requests keep their logprobs on a build not exact (two servers' uncached answers were
    measured to part outside each other's top-k there, one server's salted and cached ones not)."""
    if not key.apc or key.family == "multiturn" or settings.answers_reference == "twin":
        return False
    if settings.answers_reference == "salted":
        return True
    has_twin = not key.route and not key.hash_algo
    if exact_server(server) is None:
        return wants_logprobs(key, settings, server)
    return server.batch_invariant or not has_twin


def wants_logprobs(key: RunKey, settings: Settings, server: ServerInfo) -> bool:
    """Whether a run's requests ask for their tokens with top-k logprobs, so that every request under load
    can be judged by the near-tie rule (``answers_logprobs``): for ``auto``, where the server is not known to
    be exact (on an exact build the texts must be identical, and need none). Both runs of a pair alike, so
    that their timing compares the same work, and the salted run. Multi-turn runs (probed only) never."""
    if key.family == "multiturn" or settings.answers_logprobs == "off":
        return False
    return settings.answers_logprobs == "on" or exact_server(server) is None


def wants_probe(key: RunKey, settings: Settings, server: ServerInfo, salted: bool) -> bool:
    """Whether the answers probe follows the run: not where every request under load is judged against a
    reference that the build computes exactly (its salted reference; or its twin, on a build exact across
    two servers: vLLM's CPU build in float32), as the prompts sent alone again could only agree; unless
    ``answers_probes`` is given. Multi-turn runs (measured elsewhere) always have it."""
    if settings.given("answers_probes"):
        return True
    if not key.apc:  # its probes serve only its APC-on twin's comparisons: probed where that run is
        on = key.pair()[1]
        return wants_probe(on, settings, server, wants_salted(on, settings, server))
    has_twin = not key.route and not key.hash_algo
    if salted:
        return exact_server(server) is None
    return not (has_twin and exact_server(server, alone=False) is not None)


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
