"""Verdicts: true statements about APC, each a check that can fail, with a diagnosis when it does.

A verdict function takes measured runs and returns a :class:`Verdict` (passed or not, a message that
carries the numbers, and the numbers themselves for the results file). Tests hand it to the
``apc_assert`` fixture, which records it and fails the test when it did not pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.session import MeasurementError, RunRecord


@dataclass
class Verdict:
    name: str
    runs: list[str]
    passed: bool
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "passed": self.passed,
            "message": self.message,
            "numbers": self.numbers,
        }


@dataclass
class Pair:
    """The OFF and ON run of one pair (A/B, C/D or E/F) at one concurrency."""

    off: RunRecord
    on: RunRecord
    settings: Settings

    @property
    def id(self) -> str:
        return f"{self.off.key.id}/{self.on.key.id}"


def bench_clean(run: RunRecord) -> Verdict:
    """Every request of the run completed (the benchmark's exit code says nothing about this)."""
    b = run.bench
    ok = int(b["completed"]) == run.workload.num_prompts and int(b["failed"]) == 0
    return Verdict(
        "bench_clean", [run.key.id], ok,
        f"{run.key.id}: completed {b['completed']} of {run.workload.num_prompts} requests, failed {b['failed']}",
        {"completed": b["completed"], "failed": b["failed"]},
    )  # fmt: skip


def apc_really_off(run: RunRecord) -> Verdict:
    """An APC-off server looks nothing up and hits nothing, while it still counts the prompt tokens."""
    d = run.require_counters()
    tokens = int(run.bench["total_input_tokens"])
    computed = d.computed_tokens if d.computed_tokens is not None else d.prompt_tokens
    ok = d.prefix_cache_queries == 0 and d.prefix_cache_hits == 0 and computed == tokens
    message = (
        f"{run.key.id} (APC off): prefix-cache queries {d.prefix_cache_queries}, hits {d.prefix_cache_hits} "
        f"(both must be 0); prompt tokens computed {computed} (must equal the benchmark's {tokens})"
    )
    if not ok and (d.prefix_cache_queries or d.prefix_cache_hits):
        message += "\ndiagnosis: the OFF server looked up the prefix cache, so it is not really off"
    elif not ok:
        message += "\ndiagnosis: the server did not count every prompt token (requests lost or still running)"
    return Verdict(
        "apc_really_off",
        [run.key.id],
        ok,
        message,
        {"queries": d.prefix_cache_queries, "hits": d.prefix_cache_hits, "computed_tokens": computed},
    )


def cached_tokens_match(run: RunRecord) -> Verdict:
    """Hits equal the prediction (N-1)*floor(S/B)*B within one block per request; the books balance."""
    d = run.require_counters()
    p = run.prediction
    if p is None:
        raise MeasurementError(
            f"cannot predict the hits of run {run.key.id}: block size {run.block_size}, chat header tokens "
            f"{run.header_tokens} (the server's cache_config_info or /tokenize was unavailable)"
        )
    tokens = int(run.bench["total_input_tokens"])
    hits, queries = int(d.prefix_cache_hits or 0), int(d.prefix_cache_queries or 0)
    problems = []
    if abs(hits - p.expected_hits) > p.tolerance:
        problems.append(f"hits {hits:,} are not within {p.tolerance:,} of the predicted {p.expected_hits:,}")
    if queries != tokens:
        problems.append(f"queries {queries:,} != the benchmark's total input tokens {tokens:,}")
    if d.cached_tokens is not None and d.cached_tokens != hits:
        problems.append(f"prompt_tokens_by_source{{local_cache_hit}} {d.cached_tokens:,} != hits {hits:,}")
    if d.computed_tokens is not None and d.computed_tokens != tokens - hits:
        problems.append(f"computed prefill {d.computed_tokens:,} != input tokens - hits = {tokens - hits:,}")
    message = (
        f"{run.key.id}: cached tokens {hits:,} of {queries:,} queried (hit ratio "
        f"{(hits / queries if queries else 0):.1%}); predicted {p.expected_hits:,} = "
        f"({run.workload.num_prompts}-1) x floor({p.shared_prefix_tokens}/{p.block_size}) x {p.block_size} "
        f"(shared prefix S = {run.header_tokens} template + {run.workload.prefix_len} prefix tokens) "
        f"+/- {p.tolerance:,}"
    )
    if problems:
        message += "\n" + "\n".join(f"- {problem}" for problem in problems)
        if hits < p.expected_hits - p.tolerance:
            message += "\ndiagnosis: " + diagnose_short_hits(run)
    numbers = {
        "hits": hits,
        "queries": queries,
        "expected_hits": p.expected_hits,
        "tolerance": p.tolerance,
        "computed_tokens": d.computed_tokens,
        "cached_tokens": d.cached_tokens,
    }
    return Verdict("cached_tokens_match", [run.key.id], not problems, message, numbers)


def diagnose_short_hits(run: RunRecord) -> str:
    """The likeliest cause of too few hits, from what was measured (checked in the review's order)."""
    d = run.delta
    info = run.server
    p = run.prediction
    causes = []
    if d is not None and d.prefix_cache_queries == 0:
        causes.append(
            f"APC is off on the server: it made no prefix-cache lookups "
            f"(cache_config_info enable_prefix_caching={info.cache_config.get('enable_prefix_caching')!r})"
        )
    if d is not None and d.preemptions:
        causes.append(f"{d.preemptions} preemptions during the run: blocks were freed and recomputed")
    if p is not None and info.num_gpu_blocks is not None and info.block_size:
        prompt_blocks = -(-(run.workload.prompt_len + run.workload.output_len + run.header_tokens) // info.block_size)
        working_set = run.key.concurrency * prompt_blocks
        if working_set > info.num_gpu_blocks:
            causes.append(
                f"KV-cache capacity: concurrency {run.key.concurrency} x {prompt_blocks} blocks per request = "
                f"{working_set} blocks > the server's {info.num_gpu_blocks} (evictions)"
            )
    if p is not None and p.shared_blocks == 0:
        causes.append(
            f"block size {p.block_size} is larger than the shared prefix of {p.shared_prefix_tokens} tokens: "
            "no whole block can be shared"
        )
    if not causes:
        causes.append(
            "the prompts did not share the predicted prefix: check that the benchmark generated identical "
            "prefixes (dataset, seed, tokenizer) and that the server's tokenizer matches the client's"
        )
    return "; ".join(causes)
