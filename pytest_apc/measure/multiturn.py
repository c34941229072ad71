"""One multi-turn run (cases M/L): per cold repeat, reset the cache once, then one benchmark run per round
(turn t of every conversation), each between two idle scrapes, so that the counters give the hits of
every turn index on their own.

Every request is tokenized by the server it goes to (``/tokenize`` with its messages, as the chat endpoint
renders them), and written to a ``custom`` dataset file of vLLM's benchmark as a message list (see
``bench.chat_samples``). The round is the barrier that makes the prediction exact: a conversation's next
turn is sent only after every request of the previous round finished; the first round sends its first
request on its own (``round_parts``), so that the global prefix is cached before the others look it up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_apc.config import Settings
from pytest_apc.measure.bench import BenchRunner, bench_args
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.serving import metrics
from pytest_apc.serving.deployment import Deployment
from pytest_apc.serving.server import http_session
from pytest_apc.workload.cases import COMPACT, Prediction, RunKey, workload_for
from pytest_apc.workload.multiturn import Conversations, Message, TurnRecord, common_prefix, predict_rounds, replay


def conversations_for(key: RunKey, settings: Settings) -> Conversations:
    """The run's conversations under these settings (lengths scaled like every other length)."""
    s = settings.scaled
    return Conversations(
        conversations=settings.multiturn_conversations,
        turns=settings.multiturn_turns,
        prefix_len=s(settings.multiturn_prefix_len),
        user_len=s(settings.multiturn_user_len),
        reply_len=s(settings.multiturn_reply_len),
        summary_len=s(settings.multiturn_summary_len),
        seed=settings.seed,
        compact_after=settings.multiturn_compact_after if key.variant == COMPACT else 0,
    )


def round_parts(turn: int, requests: int) -> list[tuple[int, int]]:
    """The benchmark runs of one round, as request index ranges. The first round sends its first request
    alone, then the rest: the rest then find the global prefix cached whatever the server's step budget.
    Sent together, a request that arrives while the first one's prefix is still being prefilled in chunks
    (a prefix longer than one step's --max-num-batched-tokens) finds only the chunks computed so far and
    computes the rest again, so its hits would depend on timing."""
    if turn == 0 and requests > 1:
        return [(0, 1), (1, requests)]
    return [(0, requests)]


def tokenize(deployment: Deployment, settings: Settings, messages: list[Message]) -> list[int]:
    """The prompt token ids the server prefills for these messages (its chat template applied)."""
    http = http_session(settings.api_key, settings.ca_bundle)
    body = {"model": deployment.served_model_name, "messages": messages}
    response = http.post(f"{deployment.url}/tokenize", json=body, timeout=60)
    response.raise_for_status()
    return [int(t) for t in response.json()["tokens"]]


def sum_deltas(deltas: Sequence[metrics.Delta | None]) -> metrics.Delta | None:
    """The counters of several runs together (a counter missing from any is None)."""
    if not deltas or any(d is None for d in deltas):
        return None
    known = [d for d in deltas if d is not None]

    def total(name: str) -> int | None:
        values = [getattr(d, name) for d in known]
        return None if any(v is None for v in values) else int(sum(values))

    names = ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "computed_tokens", "cached_tokens",
             "external_tokens", "preemptions")  # fmt: skip
    return metrics.Delta(**{n: total(n) for n in names}, metric_names=known[0].metric_names, requests=total("requests"))


def merged_bench(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One repeat's rounds as one benchmark result: totals summed, per-request lists concatenated."""
    merged: dict[str, Any] = {}
    for name in ("completed", "failed", "total_input_tokens", "total_output_tokens", "duration"):
        merged[name] = sum(r.get(name) or 0 for r in results)
    for name in ("ttfts", "latencies", "input_lens", "output_lens"):
        merged[name] = [v for r in results for v in (r.get(name) or [])]
    ttfts = np.asarray(merged["ttfts"], dtype=float) * 1000.0
    merged["median_ttft_ms"] = float(np.median(ttfts)) if ttfts.size else results[0].get("median_ttft_ms")
    merged["mean_ttft_ms"] = float(np.mean(ttfts)) if ttfts.size else results[0].get("mean_ttft_ms")
    tpots = [float(r["median_tpot_ms"]) for r in results if r.get("median_tpot_ms") is not None]
    merged["median_tpot_ms"] = float(np.median(tpots)) if tpots else None
    return merged


def measure(
    key: RunKey, deployment: Deployment, settings: Settings, bench: BenchRunner, model: str, bench_dir: Path
) -> RunRecord:
    started = time.monotonic()
    workload = workload_for(key.family, settings)
    conv = conversations_for(key, settings)
    rounds_messages = [conv.round(t) for t in range(conv.turns)]
    rounds = [[tokenize(deployment, settings, m) for m in requests] for requests in rounds_messages]
    info = deployment.info
    block = info.block_size or 0
    predicted = predict_rounds(rounds, block) if block else [[0] * len(r) for r in rounds]
    replayed: list[int | None] = [None] * conv.turns
    if block and info.num_gpu_blocks:
        hits, _ = replay(rounds, workload.output_len, block, info.num_gpu_blocks, key.concurrency)
        replayed = [sum(h) for h in hits]
    repeats: list[Repeat] = []
    turns: list[TurnRecord] = []
    bench_dir.mkdir(parents=True, exist_ok=True)
    for r in range(settings.repeats):
        name = f"{key.id}-r{r + 1}" if settings.repeats > 1 else key.id
        reset = deployment.reset_prefix_cache() if key.apc else None
        results, deltas, files, commands = [], [], [], []
        metrics_error: str | None = None
        for t, requests in enumerate(rounds_messages):
            parts, part_results, part_deltas = round_parts(t, len(requests)), [], []
            for i, (lo, hi) in enumerate(parts):
                part = f"{name}-t{t}" + (f"-{i + 1}" if len(parts) > 1 else "")
                deployment.check_alive(f"before turn {t}")
                data = bench_dir / f"{part}.jsonl"
                lines = [
                    json.dumps({"prompt": m, "prompt_len": len(tokens), "output_tokens": workload.output_len})
                    for m, tokens in zip(requests[lo:hi], rounds[t][lo:hi], strict=True)
                ]
                data.write_text("\n".join(lines) + "\n")
                try:
                    before: metrics.Snapshot | None = deployment.wait_idle()
                except metrics.MetricsError as err:
                    before, metrics_error = None, str(err)
                argv = bench_args(
                    workload,
                    key,
                    base_url=deployment.url,
                    model=model,
                    tokenizer=settings.tokenizer,
                    served_model_name=deployment.served_model_name,
                    result_dir=bench_dir,
                    result_filename=f"{part}.json",
                )
                argv += ["--dataset-path", str(data)]
                outcome = bench.run(
                    argv, bench_dir / f"{part}.json", hi - lo, bench_dir / f"{part}.log",
                    settings.bench_timeout, watch=deployment.watch,
                )  # fmt: skip
                deployment.check_alive(f"after turn {t}")
                part_delta = None
                if before is not None:
                    try:
                        part_delta = metrics.delta(before, deployment.wait_idle())
                    except metrics.MetricsError as err:
                        metrics_error = str(err)
                part_results.append(outcome.result)
                part_deltas.append(part_delta)
                files.append(str(outcome.result_path))
                commands.append(outcome.command)
            result, delta = merged_bench(part_results), sum_deltas(part_deltas)
            results.append(result)
            deltas.append(delta)
            turns.append(
                TurnRecord(
                    repeat=r,
                    turn=t,
                    compacted=conv.compacted(t),
                    prompt_tokens=[len(x) for x in rounds[t]],
                    predicted=predicted[t],
                    hits=delta.prefix_cache_hits if delta else None,
                    queries=delta.prefix_cache_queries if delta else None,
                    ttfts_ms=[round(float(v) * 1000.0, 3) for v in result.get("ttfts") or []],
                    replayed=replayed[t],
                    local_tokens=delta.cached_tokens if delta else None,
                    tier_tokens=delta.external_tokens if delta else None,
                )
            )
        repeats.append(Repeat(merged_bench(results), sum_deltas(deltas), metrics_error, reset, files[0], commands[0]))
    header = info.chat_header_tokens
    record = RunRecord(
        key=key,
        workload=workload,
        server=info,
        repeats=repeats,
        header_tokens=header if header is not None else -1,
        wall_s=round(time.monotonic() - started, 3),
    )
    record.turns = turns
    if block:
        probes = [
            [{"role": "system", "content": conv.system()}, {"role": "user", "content": w}] for w in ("Apc", "Zebra")
        ]
        shared = common_prefix(*(tokenize(deployment, settings, m) for m in probes))
        record.prediction = prediction(rounds, predicted, block, shared)
    return record


def prediction(
    rounds: Sequence[Sequence[Sequence[int]]], predicted: list[list[int]], block: int, shared: int
) -> Prediction:
    """The run's prediction in the shape every run has (the report's columns): every turn's hits summed,
    exact (no tolerance); the shared prefix is the global prefix as the server renders it (template header,
    system prompt, the next message's header: what two requests that differ from their first user
    character on share)."""
    expected = sum(sum(p) for p in predicted)
    total = sum(len(t) for requests in rounds for t in requests)
    return Prediction(
        expected_hits=expected, tolerance=0, tolerance_above=0, shared_prefix_tokens=shared, block_size=block,
        shared_blocks=shared // block, computed_tokens_off=total, computed_tokens_on=max(1, total - expected),
        prefill_bound=total / max(1, total - expected),
    )  # fmt: skip
