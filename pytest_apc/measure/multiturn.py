"""One multi-turn run (cases M/L): per cold repeat (``repeat.Bencher.measure_repeat``), reset the cache once,
then one benchmark run per round (turn t of every conversation), each between two idle scrapes, so that
the counters give the hits of every turn index on their own.

Every request is tokenized by the deployment (``Deployment.tokenize``: ``/tokenize`` with its messages, as
the chat endpoint renders them; a fleet's first replica), and written to a ``custom`` dataset file of
vLLM's benchmark as a message list (see ``bench_worker.chat_samples``). The round is the barrier that
makes the prediction exact: a conversation's next turn is sent only after every request of the previous
round finished; the first round sends its first request on its own (``round_parts``), so that the global
prefix is cached before the others look it up.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytest_apc.config import Settings
from pytest_apc.measure.bench import bench_args
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.measure.repeat import Bencher, Benchmark
from pytest_apc.serving import metrics
from pytest_apc.serving.deployment import Deployment
from pytest_apc.workload import affinity
from pytest_apc.workload.cases import COMPACT, Prediction, RunKey, Workload
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


def round_parts(turn: int, requests: int, routed: bool = False) -> list[tuple[int, int]]:
    """The benchmark runs of one round, as request index ranges. The first round sends its first request
    alone, then the rest: the rest then find the global prefix cached whatever the server's step budget.
    Sent together, a request that arrives while the first one's prefix is still being prefilled in chunks
    (a prefix longer than one step's --max-num-batched-tokens) finds only the chunks computed so far and
    computes the rest again, so its hits would depend on timing. Behind a router (``routed``) the first
    round is one run at concurrency 1 instead (``round_concurrency``): the first conversation on *each*
    replica computes the global prefix there, and which one that is the router decides."""
    if turn == 0 and requests > 1 and not routed:
        return [(0, 1), (1, requests)]
    return [(0, requests)]


def round_concurrency(key: RunKey, turn: int) -> int:
    """The --max-concurrency of round ``turn``: the run's, but 1 for the first round behind a router (each
    request finishes before the next is sent, so that every replica's first conversation computes the global
    prefix before another conversation there looks it up)."""
    return 1 if key.route and turn == 0 else key.concurrency


def conversation_id(key: RunKey, conversation: int) -> str:
    """The request id every turn of a conversation is sent with behind a router (x-request-id): the routing
    key of a session-affinity policy (vllm-router's consistent_hash reads X-Session-ID first, then
    X-Request-ID). A conversation's turns never overlap, so vLLM sees the id once at a time."""
    return f"pytest-apc-{key.id}-conversation-{conversation}"


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
    for name in ("ttfts", "latencies", "input_lens", "output_lens", "start_times"):
        merged[name] = [v for r in results for v in (r.get(name) or [])]
    ttfts = np.asarray(merged["ttfts"], dtype=float) * 1000.0
    merged["median_ttft_ms"] = float(np.median(ttfts)) if ttfts.size else results[0].get("median_ttft_ms")
    merged["mean_ttft_ms"] = float(np.mean(ttfts)) if ttfts.size else results[0].get("mean_ttft_ms")
    tpots = [float(r["median_tpot_ms"]) for r in results if r.get("median_tpot_ms") is not None]
    merged["median_tpot_ms"] = float(np.median(tpots)) if tpots else None
    return merged


def request_times(result: dict[str, Any], first: dict[str, Any]) -> tuple[list[float] | None, list[float] | None]:
    """When each request of a round was sent and got its first token, in seconds since the repeat's first
    request was sent (the benchmark's own send times, one clock for every run of its worker, and TTFTs);
    None where the benchmark did not save its send times."""
    starts, ttfts, origin = result.get("start_times"), result.get("ttfts"), first.get("start_times")
    if not starts or not origin or len(starts) != len(ttfts or []):
        return None, None
    sent = [float(s) - float(origin[0]) for s in starts]
    return [round(s, 4) for s in sent], [round(s + float(t), 4) for s, t in zip(sent, ttfts or [], strict=True)]


@dataclasses.dataclass(frozen=True)
class Rounds:
    """A multi-turn run's rounds before any is sent: each request's messages and the token ids the server
    prefills for them, the hits predicted per request, and the hits a replay of vLLM's block pool at the
    server's KV size gives per round (None without a block size or KV size)."""

    messages: list[list[list[Message]]]
    tokens: list[list[list[int]]]
    predicted: list[list[int]]
    replayed: list[int | None]
    block: int  # the server's block size (0: unknown, nothing predicted)


def measure(
    key: RunKey, workload: Workload, deployment: Deployment, settings: Settings, bencher: Bencher, model: str
) -> RunRecord:
    """Every cold repeat of a multi-turn run, round by round, and the run's prediction."""
    started = time.monotonic()
    conv = conversations_for(key, settings)
    rounds = tokenized_rounds(conv, deployment, workload, key)
    run = TurnRun(key, workload, deployment, bencher, model, settings.tokenizer, conv, rounds)
    repeats: list[Repeat] = []
    turns: list[TurnRecord] = []
    for r in range(settings.repeats):
        repeat, repeat_turns = run.measure_repeat(r, f"{key.id}-r{r + 1}" if settings.repeats > 1 else key.id)
        repeats.append(repeat)
        turns += repeat_turns
    header = deployment.info.chat_header_tokens
    record = RunRecord(
        key=key,
        workload=workload,
        server=deployment.info,
        repeats=repeats,
        header_tokens=header if header is not None else -1,
        wall_s=round(time.monotonic() - started, 3),
    )
    record.turns = turns
    if rounds.block:
        record.prediction = prediction(rounds.tokens, rounds.predicted, rounds.block, shared_tokens(conv, deployment))
    return record


def tokenized_rounds(conv: Conversations, deployment: Deployment, workload: Workload, key: RunKey) -> Rounds:
    """Every round's requests, tokenized by the server, with what they predict on it."""
    messages = [conv.round(t) for t in range(conv.turns)]
    tokens = [[deployment.tokenize(m) for m in requests] for requests in messages]
    info = deployment.info
    block = info.block_size or 0
    predicted = predict_rounds(tokens, block) if block else [[0] * len(r) for r in tokens]
    replayed: list[int | None] = [None] * conv.turns
    if block and info.num_gpu_blocks:
        hits, _ = replay(tokens, workload.output_len, block, info.num_gpu_blocks, key.concurrency)
        replayed = [sum(h) for h in hits]
    return Rounds(messages, tokens, predicted, replayed, block)


def shared_tokens(conv: Conversations, deployment: Deployment) -> int:
    """The global prefix as the server renders it: what two requests that differ from their first user
    character on share."""
    probes = [[{"role": "system", "content": conv.system()}, {"role": "user", "content": w}] for w in ("Apc", "Zebra")]
    return common_prefix(*(deployment.tokenize(m) for m in probes))


@dataclasses.dataclass(frozen=True)
class TurnRun:
    """One multi-turn run on its deployment: what every repeat of it needs."""

    key: RunKey
    workload: Workload
    deployment: Deployment
    bencher: Bencher
    model: str
    tokenizer: str
    conv: Conversations
    rounds: Rounds

    def measure_repeat(self, r: int, name: str) -> tuple[Repeat, list[TurnRecord]]:
        """One cold repeat (``Bencher.measure_repeat``: one reset, then every round's benchmarks), its rounds
        merged into one repeat and one ``TurnRecord`` each."""
        indices = range(self.conv.turns)
        routed = bool(self.key.route)
        spans = [len(round_parts(t, len(self.rounds.messages[t]), routed)) for t in indices]  # benchmarks per round
        done = self.bencher.measure_repeat(
            self.key, self.deployment, lambda: [b for t in indices for b in self.round_benchmarks(t, name)]
        )
        results: list[dict[str, Any]] = []
        deltas: list[metrics.Delta | None] = []
        replica_deltas: list[dict[str, metrics.Delta]] = []
        turns: list[TurnRecord] = []
        at = 0
        for t, span in enumerate(spans):
            counted = done.counted[at : at + span]
            at += span
            result, delta = merged_bench([c.outcome.result for c in counted]), sum_deltas([c.delta for c in counted])
            results.append(result)
            deltas.append(delta)
            read = [c.parts for c in counted if c.parts is not None]
            replica_deltas.append(_sum_parts(read) if len(read) == span else {})
            turns.append(self.turn_record(r, t, result, delta, results[0]))
        first = done.counted[0].outcome
        totals = _sum_parts(replica_deltas) if all(replica_deltas) else {}
        repeat = Repeat(
            merged_bench(results), sum_deltas(deltas), done.metrics_error, done.reset, str(first.result_path),
            first.command, totals, done.router_command,
        )  # fmt: skip
        if self.key.route:
            locate(turns, replica_deltas, self.rounds.tokens, self.rounds.block)
        return repeat, turns

    def round_benchmarks(self, t: int, name: str) -> list[Benchmark]:
        """Round ``t``'s benchmarks (``round_parts``), each with its ``custom`` dataset file written: one line
        per request, its messages, the server's token count and, behind a router, the conversation's id."""
        requests, tokens = self.rounds.messages[t], self.rounds.tokens[t]
        parts = round_parts(t, len(requests), bool(self.key.route))
        benchmarks = []
        for i, (lo, hi) in enumerate(parts):
            part = f"{name}-t{t}" + (f"-{i + 1}" if len(parts) > 1 else "")
            data = self.bencher.bench_dir / f"{part}.jsonl"
            lines = [
                json.dumps({"prompt": m, "prompt_len": len(ids), "output_tokens": self.workload.output_len,
                            **({"request_id": conversation_id(self.key, c)} if self.key.route else {})})
                for c, m, ids in zip(range(lo, hi), requests[lo:hi], tokens[lo:hi], strict=True)
            ]  # fmt: skip
            data.write_text("\n".join(lines) + "\n")
            argv = bench_args(
                self.workload,
                dataclasses.replace(self.key, concurrency=round_concurrency(self.key, t)),
                base_url=self.deployment.url,
                model=self.model,
                tokenizer=self.tokenizer,
                served_model_name=self.deployment.served_model_name,
                result_dir=self.bencher.bench_dir,
                result_filename=f"{part}.json",
            )
            argv += ["--dataset-path", str(data)]
            benchmarks.append(Benchmark(argv, part, hi - lo, before=f"before turn {t}", after=f"after turn {t}"))
        return benchmarks

    def turn_record(
        self, r: int, t: int, result: dict[str, Any], delta: metrics.Delta | None, first: dict[str, Any]
    ) -> TurnRecord:
        """Round ``t`` of repeat ``r`` as measured (its merged result and counters) and as predicted."""
        sent, first_token = request_times(result, first)
        return TurnRecord(
            repeat=r,
            turn=t,
            compacted=self.conv.compacted(t),
            prompt_tokens=[len(x) for x in self.rounds.tokens[t]],
            predicted=self.rounds.predicted[t],
            hits=delta.prefix_cache_hits if delta else None,
            queries=delta.prefix_cache_queries if delta else None,
            ttfts_ms=[round(float(v) * 1000.0, 3) for v in result.get("ttfts") or []],
            replayed=self.rounds.replayed[t],
            local_tokens=delta.cached_tokens if delta else None,
            tier_tokens=delta.external_tokens if delta else None,
            sent_s=sent,
            first_token_s=first_token,
        )


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


def _sum_parts(rounds: Sequence[dict[str, metrics.Delta]]) -> dict[str, metrics.Delta]:
    """Every replica's counters over several runs ({} where a run read none per replica)."""
    if not rounds or not all(rounds):
        return {}
    summed = {name: sum_deltas([r.get(name) for r in rounds]) for name in rounds[0]}
    return {name: d for name, d in summed.items() if d is not None}


def locate(
    turns: Sequence[TurnRecord],
    replica_deltas: Sequence[dict[str, metrics.Delta]],
    rounds: Sequence[Sequence[Sequence[int]]],
    block: int,
) -> None:
    """Fill one repeat's turns with every replica's requests and hits, and the routing that explains them
    (``affinity.explain``): the conversations each replica held and the hits that predicts."""
    if not all(replica_deltas) or not block or any(x.requests is None for d in replica_deltas for x in d.values()):
        return  # the verdict names what is missing
    names = list(replica_deltas[0])
    requests = [[int(d[n].requests or 0) if n in d else 0 for n in names] for d in replica_deltas]
    hits = [[int(d[n].prefix_cache_hits or 0) if n in d else 0 for n in names] for d in replica_deltas]
    found = affinity.explain(rounds, block, names, requests, hits)
    for t, record in enumerate(turns):
        record.replica_requests = dict(zip(names, requests[t], strict=True))
        record.replica_hits = dict(zip(names, hits[t], strict=True))
        record.searched_all = found.exhaustive
        record.alternatives = found.alternatives
        if found.found:
            record.held = found.held[t]
            record.replica_predicted = found.predicted[t]
            record.moved = found.moved[t]
