"""The multi-turn verdicts (cases M/L): hits turn by turn exactly as predicted, the compacted turn's hits
falling to the global prefix, and late turns answered sooner with APC than without.

A turn whose hits fall short is told apart by cause, the most direct evidence first: counters not read, no
lookups (APC off), and eviction, when a replay of vLLM's block pool at the server's KV-cache size
(``workload.multiturn.replay``: free blocks reused in the order they were freed) loses blocks that an earlier
turn left for a later one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pytest_apc.config import gain_required
from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts.pairs import Pair
from pytest_apc.verdicts.stats import ratio_of_medians
from pytest_apc.verdicts.verdict import FASTER, NOT_SLOWER, Verdict
from pytest_apc.workload.multiturn import TurnRecord


def _turn_line(run: RunRecord, t: TurnRecord) -> str:
    replay = f", replay {t.replayed:,}" if t.replayed is not None and t.replayed != t.predicted_hits else ""
    mark = "" if t.hits == t.predicted_hits else "  <- differs"
    compact = " (compacted)" if t.compacted else ""
    return (
        f"  repeat {t.repeat + 1} turn {t.turn}{compact}: hits {t.hits if t.hits is not None else '?'} / predicted "
        f"{t.predicted_hits:,} of {sum(t.prompt_tokens):,} prompt tokens{replay}{mark}"
    )


def diagnose_turn(run: RunRecord, t: TurnRecord) -> str:
    """Why one turn's hits differ from the prediction."""
    info = run.server
    if t.hits is None:
        errors = [r.metrics_error for r in run.repeats if r.metrics_error]
        return "the server's prefix-cache counters were not read around this turn" + (
            f": {errors[0]}" if errors else ""
        )
    if t.queries == 0:
        return "APC is off on the server: it made no prefix-cache lookups"
    if t.hits is not None and t.hits > t.predicted_hits:
        return (
            "more hits than any earlier request of the run can explain: the cache was not cold (the reset before "
            "the repeat did not clear it) or the generated output matched the next turn's fixed reply"
        )
    held = _held_blocks(run, t)
    if info.num_gpu_blocks and info.block_size and held > info.num_gpu_blocks - 1:  # block 0 holds no KV
        return (
            f"eviction: the server's KV cache of {info.num_gpu_blocks:,} blocks of {info.block_size} tokens cannot "
            f"keep the conversations between turns: the turn before held {held:,} blocks "
            + (f"(a replay of vLLM's block pool at that size predicts {t.replayed:,} hits for turn {t.turn} "
               f"instead of {t.predicted_hits:,}; measured {t.hits})" if t.replayed is not None else "")
        )  # fmt: skip
    if t.replayed is not None and t.replayed < t.predicted_hits:
        return (
            f"eviction: the server's KV cache of {info.num_gpu_blocks:,} blocks of {info.block_size} tokens cannot "
            f"keep the conversations between turns; a replay of vLLM's block pool at that size predicts "
            f"{t.replayed:,} hits for turn {t.turn} instead of {t.predicted_hits:,} (measured {t.hits})"
        )
    return (
        "the server prefilled other tokens than /tokenize gave, or its cache lost blocks between turns without "
        "a block pool too small for them (preemptions, a reset during the run)"
    )


def _held_blocks(run: RunRecord, t: TurnRecord) -> int:
    """KV blocks the previous round's requests left for this one: each request's prompt and output blocks,
    the global prefix's counted once."""
    info, p = run.server, run.prediction
    before = next((u for u in run.turns if u.repeat == t.repeat and u.turn == t.turn - 1), None)
    if before is None or not info.block_size:
        return 0
    block = info.block_size
    own = sum(-(-(n + run.workload.output_len - 1) // block) for n in before.prompt_tokens)
    shared = p.shared_blocks if p is not None else 0
    return own - (len(before.prompt_tokens) - 1) * shared


def barrier(run: RunRecord) -> tuple[str, list[str]]:
    """The condition that makes the prediction exact at any concurrency, checked from the benchmark's own send
    times and TTFTs: every request was sent after the request whose blocks it is predicted to hit got its
    first token (its prefill was done): a conversation's previous turn, and in the first round the first
    request, which computes the global prefix. A line for the message, and the requests sent too early."""
    early: list[str] = []
    checked = 0
    unchecked = 0
    for repeat in sorted({t.repeat for t in run.turns}):
        turns = sorted((t for t in run.turns if t.repeat == repeat), key=lambda t: t.turn)
        for before, t in zip([None, *turns], turns, strict=False):
            if t.sent_s is None or t.first_token_s is None or (before is not None and before.first_token_s is None):
                unchecked += len(t.prompt_tokens)
                continue
            for c, sent in enumerate(t.sent_s):
                if before is None and c == 0:
                    continue
                ready = before.first_token_s[c] if before is not None and before.first_token_s else t.first_token_s[0]
                checked += 1
                if sent < ready:
                    what = f"turn {t.turn - 1}'s" if before is not None else "the first request's"
                    early.append(
                        f"repeat {repeat + 1} turn {t.turn} conversation {c}: sent at {sent:.3f} s, before {what} "
                        f"first token at {ready:.3f} s: its hits depend on how far that prefill had got"
                    )
    line = f"  barrier: {checked} requests sent after the prefill they hit, from the benchmark's send times and TTFTs"
    if unchecked:
        line += f"; {unchecked} not checked (the benchmark saved no send times)"
    return line, early


def turn_hits_match(run: RunRecord) -> Verdict:
    """Every turn of every repeat hits exactly what was predicted: each request's longest common prefix with
    a request prefilled before it since the reset, capped at its length - 1, in whole blocks."""
    lines = [f"{run.key.id}: prefix-cache hits per turn, measured / predicted:"]
    problems: list[str] = []
    if not run.turns:
        problems.append("the run has no turns (not a multi-turn run, or its prediction could not be made)")
    if run.prediction is None:
        problems.append(
            "no prediction: the server reported no KV block size (vllm:cache_config_info), so the hits a turn "
            "must get cannot be computed"
        )
    for t in run.turns:
        lines.append(_turn_line(run, t))
        if t.hits != t.predicted_hits:
            problems.append(f"repeat {t.repeat + 1} turn {t.turn}: {diagnose_turn(run, t)}")
    line, early = barrier(run)
    lines.append(line)
    problems += early
    numbers: dict[str, Any] = {
        "turns": [
            {"repeat": t.repeat, "turn": t.turn, "hits": t.hits, "predicted": t.predicted_hits, "replayed": t.replayed}
            for t in run.turns
        ],
    }
    message = "\n".join(lines + [f"- {p}" for p in dict.fromkeys(problems)])
    return Verdict("multiturn_hits", [run.key.id], not problems, message, numbers)


def compaction_hits(run: RunRecord) -> Verdict:
    """The first compacted turn's requests hit the global prefix (in whole blocks), measured as predicted, and
    fewer than the turn before. A summary's first words may match another conversation's by chance (the
    prediction counts them), so a request may hit up to one block beyond the global prefix, never more."""
    problems: list[str] = []
    lines = [f"{run.key.id}: compaction"]
    p = run.prediction
    first = [t for t in run.turns if t.compacted and t.turn == min(u.turn for u in run.turns if u.compacted)]
    if not first or p is None:
        problems.append("the run has no compacted turn or no prediction")
    global_hit = (p.shared_prefix_tokens // p.block_size * p.block_size) if p else 0
    for t in first:
        before = next((u for u in run.turns if u.repeat == t.repeat and u.turn == t.turn - 1), None)
        lines.append(_turn_line(run, t))
        if before is not None:
            lines.append(f"    turn {before.turn} before it hit {before.hits} (predicted {before.predicted_hits:,})")
        requests = len(t.prompt_tokens)
        lines.append(
            f"    predicted per request: {t.predicted} (the global prefix, {global_hit} tokens in whole blocks, "
            f"for {requests} requests)"
        )
        if p is not None and any(not global_hit <= h <= global_hit + p.block_size for h in t.predicted):
            problems.append(
                f"turn {t.turn}: the prediction per request {t.predicted} is not the global prefix "
                f"({global_hit} tokens, up to one block more): the summary did not replace the history"
            )
        if t.hits != t.predicted_hits:
            problems.append(f"repeat {t.repeat + 1} turn {t.turn}: {diagnose_turn(run, t)}")
        if before is not None and before.hits is not None and t.hits is not None and t.hits >= before.hits:
            problems.append(f"turn {t.turn}: hits did not fall after compaction ({before.hits} -> {t.hits})")
    message = "\n".join(lines + [f"- {x}" for x in dict.fromkeys(problems)])
    return Verdict("multiturn_compaction", [run.key.id], not problems, message, {"global_prefix_hit": global_hit})


def late_turns(run: RunRecord) -> list[TurnRecord]:
    """The second half of the turns (turn >= T // 2), where the history dominates the prompt."""
    last = max((t.turn for t in run.turns), default=0)
    return [t for t in run.turns if t.turn >= (last + 1) // 2]


def late_turn_ttft(pair: Pair) -> Verdict:
    """TTFT of the late turns, every cold repeat pooled, ON against OFF: up to --apc-set multiturn_gain_concurrency
    the bootstrap interval of median OFF / median ON lies above 1 (as ``ttft_gain``); above it (and at every
    level when it is 0) it is held to not being slower, within --apc-set overhead_tolerance. The message gives the
    gain of every turn index and the prefill bound the history share implies (prompt tokens over the tokens
    left to compute), which the gain should approach as the history grows."""
    ids = [pair.off.key.id, pair.on.key.id]
    off = np.asarray([v for t in late_turns(pair.off) for v in t.ttfts_ms], dtype=float)
    on = np.asarray([v for t in late_turns(pair.on) for v in t.ttfts_ms], dtype=float)
    if not off.size or not on.size:
        return Verdict("multiturn_ttft", ids, False, f"{pair.id}: no per-turn TTFTs")
    s = pair.settings
    gain = ratio_of_medians(off, on, samples=s.bootstrap_samples, confidence=s.confidence)
    turns = sorted({t.turn for t in late_turns(pair.on)})
    bound = prefill_bound(late_turns(pair.on))
    by_turn_off, by_turn_on = ttft_by_turn(pair.off), ttft_by_turn(pair.on)
    per_turn = {t: by_turn_off[t] / by_turn_on[t] for t in by_turn_on if t in by_turn_off and by_turn_on[t] > 0}
    concurrency, limit = pair.on.key.concurrency, s.multiturn_gain_concurrency
    must_gain = gain_required(limit, concurrency)
    message = (
        f"{pair.id} at concurrency {concurrency}: median TTFT of turns {turns[0]}-{turns[-1]} "
        f"{np.median(off):,.1f} -> {np.median(on):,.1f} ms, gain {gain} next to its prefill bound "
        + (f"{bound:.2f}x" if bound else "?")
        + "\n  gain by turn: " + ", ".join(f"turn {t} {g:.2f}x" for t, g in sorted(per_turn.items()))
    )  # fmt: skip
    if must_gain:
        ok = gain.low > 1.0
        if not ok:
            message += "\n- the gain is not significant: its interval reaches 1.0 (no improvement)"
    else:
        tol = s.overhead_tolerance
        slowdown_low = 1 / gain.high if gain.high else float("inf")
        ok = slowdown_low <= 1 + tol
        message += (
            f"\n  held to not being slower at concurrency {concurrency} (--apc-set multiturn_gain_concurrency="
            f"{limit}), tolerance {tol:.0%}"
        )
        if not ok:
            message += f"\n- the late turns are slower with APC by at least {slowdown_low - 1:.0%}"
    numbers = {"ttft_speedup": gain.estimate, "ttft_speedup_low": gain.low, "ttft_speedup_high": gain.high,
               "median_ttft_off_ms": float(np.median(off)), "median_ttft_on_ms": float(np.median(on)),
               "turns": turns, "prefill_bound": bound, "gain_by_turn": {str(t): g for t, g in per_turn.items()},
               "gain_required": must_gain}  # fmt: skip
    return Verdict("multiturn_ttft", ids, ok, message, numbers, held_to=FASTER if must_gain else NOT_SLOWER)


def prefill_bound(turns: list[TurnRecord]) -> float | None:
    """Prompt tokens over the tokens left to compute once the predicted hits are served: the most a cache can
    cut these turns' prefill work by."""
    prompt = sum(sum(t.prompt_tokens) for t in turns)
    left = prompt - sum(t.predicted_hits for t in turns)
    return prompt / left if left > 0 else None


def ttft_by_turn(run: RunRecord) -> dict[int, float]:
    """Median TTFT (ms) per turn index, every repeat pooled (the plot and the summary)."""
    out: dict[int, float] = {}
    for turn in sorted({t.turn for t in run.turns}):
        values = [v for t in run.turns if t.turn == turn for v in t.ttfts_ms]
        if values:
            out[turn] = float(np.median(values))
    return out


def turn_hits_across_tiers(run: RunRecord) -> Verdict:
    """A small GPU cache (M-c1-small-cache), and the same with a CPU tier behind it (M-c1-offload-tier): every
    turn's GPU-cache hits are what a replay of vLLM's block pool at the server's size gives (exact at
    concurrency 1, where a loaded block takes its place in the pool like a computed one), and the tier serves
    exactly what the GPU cache lost: predicted - replayed, so that both tiers together hit what one server with
    room for every conversation does. Without a tier, it serves nothing. Tokens are counted by source
    (prompt_tokens_by_source), not by the hit counter, which counts a request that waited for its blocks twice."""
    tier = run.key.mode.tier
    blocks, block = run.server.num_gpu_blocks, run.server.block_size
    where = f"a GPU cache of {blocks:,} blocks of {block} tokens" if blocks and block else "a GPU cache of unknown size"
    lines = [
        f"{run.key.id}: {where}" + (" and a CPU tier" if tier else ", no tier")
        + ": per turn, GPU cache hits / replayed, tier hits / expected, measured hits all tiers / predicted"
    ]  # fmt: skip
    problems: list[str] = []
    if not run.turns:
        problems.append("the run has no turns (not a multi-turn run, or its prediction could not be made)")
    for t in run.turns:
        local = t.local_tokens
        got_tier = t.tier_tokens or 0
        head = f"repeat {t.repeat + 1} turn {t.turn}"
        if local is None or t.replayed is None:
            problems.append(
                f"{head}: "
                + ("the server does not count prompt tokens by source (vllm:prompt_tokens_by_source_total), so the "
                   "GPU cache's hits cannot be told from the tier's" if local is None else
                   "no replay of the block pool: the server reported no KV-cache size (vllm:cache_config_info)")
            )  # fmt: skip
            continue
        want_tier = t.predicted_hits - t.replayed if tier else 0
        lines.append(
            f"  {head}: GPU {local:,} / {t.replayed:,}, tier {got_tier:,} / {want_tier:,}, all tiers "
            f"{local + got_tier:,} / {t.predicted_hits:,}" + ("" if (local, got_tier) == (t.replayed, want_tier)
                                                              else "  <- differs")
        )  # fmt: skip
        if local + got_tier > t.predicted_hits:
            problems.append(
                f"{head}: {local + got_tier:,} tokens served from the caches, more than any earlier request of the "
                f"run explains ({t.predicted_hits:,}): the reset before the repeat left blocks in "
                + ("the GPU cache or the tier (reset_external)" if tier else "the GPU cache")
            )
        elif local != t.replayed:
            problems.append(
                f"{head}: the GPU cache served {local:,} tokens, and a replay of vLLM's block pool (free blocks "
                f"reused in the order they were freed, tail first) at {blocks or '?'} blocks gives "
                f"{t.replayed:,}: the pool evicts in another order than vLLM's, or requests overlapped (the replay "
                "is exact at concurrency 1)"
            )
        elif got_tier != want_tier:
            problems.append(
                f"{head}: the tier served {got_tier:,} tokens, and the GPU cache lost {want_tier:,} that an earlier "
                "turn left: "
                + ("the tier did not keep every evicted block (too small: see the start-up warnings) or had not "
                   "stored them yet" if got_tier < want_tier else "the tier served blocks the GPU cache still had")
                if tier
                else f"{head}: a server without a tier loaded {got_tier:,} tokens through a KV connector"
            )  # fmt: skip
    line, early = barrier(run)
    lines.append(line)
    problems += early
    predicted = sum(t.predicted_hits for t in run.turns)
    replayed = sum(t.replayed or 0 for t in run.turns)
    if run.turns and all(t.replayed is not None for t in run.turns) and replayed >= predicted:
        problems.append(
            f"the GPU cache of {blocks:,} blocks kept every conversation between turns (replayed {replayed:,} = "
            f"predicted {predicted:,}): nothing was evicted, so this run measures neither eviction nor the tier"
        )
    numbers: dict[str, Any] = {
        "tier": tier,
        "turns": [
            {"repeat": t.repeat, "turn": t.turn, "local": t.local_tokens, "tier": t.tier_tokens,
             "replayed": t.replayed, "predicted": t.predicted_hits}
            for t in run.turns
        ],
    }  # fmt: skip
    message = "\n".join(lines + [f"- {p}" for p in dict.fromkeys(problems)])
    return Verdict("multiturn_tiers", [run.key.id], not problems, message, numbers)
