"""One measured cold repeat (measure/repeat.py), as the single-server run and every multi-turn round call
it: the steps in order, against a recording deployment and benchmark runner (no server, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_apc.measure import multiturn
from pytest_apc.measure.bench import BenchOutcome
from pytest_apc.measure.repeat import Bencher
from pytest_apc.measure.run import Measurer
from pytest_apc.serving import metrics
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload.cases import RunKey, ServerMode, workload_for
from pytest_apc.workload.plan import PlannedRun
from tests.conftest import default_settings


def snapshot(hits: int) -> metrics.Snapshot:
    return metrics.parse(
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {hits * 2}\n'
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
    )


class Recording:
    """A deployment that records each step; its counters grow by 10 hits a benchmark. ``url`` is the
    router's only once ``route`` started it, as a launched router's is."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.mode = ServerMode(True)
        self.info = ServerInfo(mode="apc-on", command=[], url="", log="", block_size=4, num_gpu_blocks=1000)
        self.info.chat_header_tokens = 2
        self.log_path = Path("server.log")
        self.launched = True
        self.served_model_name = "m"
        self.routed = False
        self.hits = 0

    @property
    def url(self) -> str:
        return "http://router" if self.routed else "http://not-routed-yet"

    def route(self, route: str) -> str:
        self.steps.append(f"route {route}")
        self.routed = True
        return "vllm-router"

    def reset_prefix_cache(self) -> str:
        self.steps.append("reset")
        return "reset"

    def check_alive(self, doing: str) -> None:
        self.steps.append(f"alive {doing}")

    def wait_idle(self) -> metrics.Snapshot:
        self.steps.append("idle")
        return snapshot(self.hits)

    def watch(self) -> str | None:
        return None

    def tokenize(self, messages: list[dict[str, str]]) -> list[int]:
        return [ord(c) for m in messages for c in m["content"]][:40]


class Runner:
    """A benchmark runner that records the URL each benchmark targets and writes nothing but its result."""

    def __init__(self, steps: list[str], deployment: Recording) -> None:
        self.steps, self.deployment = steps, deployment

    def run(self, argv: list[str], result_path: Path, num_prompts: int, *args: Any, **kwargs: Any) -> BenchOutcome:
        self.steps.append(f"bench {result_path.stem} {argv[argv.index('--base-url') + 1]}")
        self.deployment.hits += 10
        result = {"completed": num_prompts, "failed": 0, "total_input_tokens": 100 * num_prompts, "duration": 1.0,
                  "median_ttft_ms": 5.0, "ttfts": [0.005] * num_prompts}  # fmt: skip
        if kwargs.get("prompts_path"):
            kwargs["prompts_path"].write_text(json.dumps([]))
        return BenchOutcome(result, "bench", result_path, result_path.with_suffix(".log"), 1.0)


def test_one_server_repeat_routes_resets_and_counts_one_benchmark_between_idle_scrapes(tmp_path: Path) -> None:
    steps: list[str] = []
    deployment = Recording(steps)
    settings = default_settings(answers_probes=0)
    measurer = Measurer(settings, Runner(steps, deployment), "m", tmp_path)  # type: ignore[arg-type]
    key = RunKey("R", 8, route="round_robin")
    record = measurer.run(PlannedRun(key, workload_for(key.family, settings)), deployment)  # type: ignore[arg-type]
    assert steps[:7] == [
        "route round_robin", "reset", "alive before the run", "idle", "bench R-c8-round_robin http://router",
        "alive after the benchmark", "idle",
    ]  # fmt: skip
    repeat = record.repeats[0]
    assert repeat.delta is not None
    assert repeat.delta.prefix_cache_hits == 10
    assert (repeat.reset, repeat.router_command) == ("reset", "vllm-router")


def test_every_multi_turn_round_is_counted_between_idle_scrapes_after_one_reset(tmp_path: Path) -> None:
    steps: list[str] = []
    deployment = Recording(steps)
    settings = default_settings(multiturn_conversations=2, multiturn_turns=2)
    key = RunKey("M", 2)
    bencher = Bencher(Runner(steps, deployment), tmp_path, 60.0)  # type: ignore[arg-type]
    record = multiturn.measure(key, workload_for("multiturn", settings), deployment, settings, bencher, "m")  # type: ignore[arg-type]
    assert steps == [
        "reset",
        "alive before turn 0", "idle", "bench M-c2-t0-1 http://not-routed-yet", "alive after turn 0", "idle",
        "alive before turn 0", "idle", "bench M-c2-t0-2 http://not-routed-yet", "alive after turn 0", "idle",
        "alive before turn 1", "idle", "bench M-c2-t1 http://not-routed-yet", "alive after turn 1", "idle",
    ]  # fmt: skip
    assert [t.hits for t in record.turns] == [20, 10]  # the first round's two benchmarks summed
    assert record.repeats[0].delta is not None
    assert record.repeats[0].delta.prefix_cache_hits == 30
