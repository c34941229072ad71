"""The multi-turn case: the conversations it sends, the exact per-turn prediction, the block-pool replay that
names eviction, the verdicts and the run ids. Token ids and counters are made up here; the real-vLLM run is
tests/test_e2e_multiturn.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pytest_apc.measure.bench_worker import chat_samples
from pytest_apc.measure.multiturn import merged_bench, prediction, sum_deltas
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.verdicts import Pair, compaction_hits, late_turn_ttft, turn_hits_across_tiers, turn_hits_match
from pytest_apc.workload.cases import COMPACT, OFFLOAD_TIER, SMALL_CACHE, RunKey, ServerMode, Workload
from pytest_apc.workload.multiturn import Conversations, TurnRecord, cached_tokens, predict_rounds, replay

B = 4


def conv(**kw: int) -> Conversations:
    args = {"conversations": 3, "turns": 4, "prefix_len": 20, "user_len": 6, "reply_len": 4, "summary_len": 5,
            "seed": 0, **kw}  # fmt: skip
    return Conversations(**args)


def test_every_turn_sends_the_whole_history_with_fixed_replies() -> None:
    c = conv()
    msgs = c.messages(1, 2)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"] == c.system() == c.messages(0, 0)[0]["content"]  # one global prefix
    assert msgs[2]["content"] == c.reply(1, 0)
    # The next turn extends this one: its messages start with these, the new reply in between.
    nxt = c.messages(1, 3)
    assert nxt[: len(msgs)] == msgs
    assert nxt[len(msgs)]["content"] == c.reply(1, 2)
    assert c == conv()
    assert c.user(0, 0) == conv().user(0, 0)
    assert c.user(0, 0) != c.user(1, 0)


def test_compaction_replaces_the_history_by_a_summary_after_k_turns() -> None:
    c = conv(compact_after=2)
    assert not c.compacted(1)
    assert c.compacted(2)
    assert c.compacted(3)
    two = c.messages(0, 2)
    assert [m["role"] for m in two] == ["system", "user", "assistant", "user"]
    assert two[1]["content"] == c.summary(0)
    three = c.messages(0, 3)
    assert three[:4] == two
    assert three[4]["content"] == c.reply(0, 2)


def test_cached_tokens_are_the_longest_common_prefix_in_whole_blocks_capped_at_len_minus_one() -> None:
    assert cached_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9], [[1, 2, 3, 4, 5, 6, 7, 0]], B) == 4  # 7 shared -> 1 block
    assert cached_tokens([1, 2, 3, 4, 5, 6, 7, 8], [[1, 2, 3, 4, 5, 6, 7, 8, 9]], B) == 4  # capped at len - 1 = 7
    assert cached_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9], [[1, 2, 3, 4, 5, 6, 7, 8, 0]], B) == 8
    assert cached_tokens([1, 2, 3], [], B) == 0


def rounds_of(c: Conversations) -> list[list[list[int]]]:
    """Token ids standing in for /tokenize: one id per word, the roles as ids of their own."""
    vocab: dict[str, int] = {}

    def ids(messages: list[dict[str, str]]) -> list[int]:
        out = [0]
        for m in messages:
            out.append(vocab.setdefault(f"<{m['role']}>", len(vocab) + 1))
            out += [vocab.setdefault(w, len(vocab) + 1) for w in m["content"].split()]
        return [*out, vocab.setdefault("<assistant>", len(vocab) + 1)]

    return [[ids(m) for m in c.round(t)] for t in range(c.turns)]


def test_hits_grow_turn_by_turn_and_fall_to_the_global_prefix_after_compaction() -> None:
    rounds = rounds_of(conv())
    hits = predict_rounds(rounds, B)
    # Round 0: the first request computes the global prefix, the others hit its whole blocks.
    glob = hits[0][1]
    assert hits[0][0] == 0
    assert glob > 0
    assert hits[0] == [0, glob, glob]
    totals = [sum(h) for h in hits]
    assert totals == sorted(totals)
    assert totals[3] > totals[1] > totals[0]
    # Each later turn hits its own previous request, to the last whole block of it.
    for t in range(1, 4):
        for c in range(3):
            assert hits[t][c] == cached_tokens(rounds[t][c], [rounds[t - 1][c]], B)
    compacted = predict_rounds(rounds_of(conv(compact_after=2)), B)
    # The summary is new: only the global prefix is left to hit (and a block of words another summary
    # happens to start with).
    assert all(glob <= h <= glob + B for h in compacted[2])
    assert compacted[2][0] == glob
    assert compacted[3][0] > glob


def test_the_replay_keeps_everything_in_a_large_pool_and_evicts_in_a_small_one() -> None:
    rounds = rounds_of(conv())
    exact = predict_rounds(rounds, B)
    big, evicted = replay(rounds, 4, B, 10_000, 1)
    assert big == exact
    assert evicted == 0
    longest = max(len(t) for r in rounds for t in r)
    small, evicted = replay(rounds, 4, B, -(-(longest + 4) // B) + 2, 1)
    assert evicted > 0
    assert sum(map(sum, small)) < sum(map(sum, exact))


def record(case: str, turns: list[TurnRecord], *, gpu_blocks: int | None = None, variant: str = "") -> RunRecord:
    key = RunKey(case, 8, variant=variant)
    info = ServerInfo(key.mode.name, [], "", "", block_size=B, num_gpu_blocks=gpu_blocks)
    delta = Delta(10, 0, 10, 10, 0, 0, 0, {})
    bench = {"completed": 3, "failed": 0, "total_input_tokens": 10, "duration": 1.0, "ttfts": [0.1, 0.2]}
    run = RunRecord(key, Workload("multiturn", 20, 40, 4, 3, 0), info, [Repeat(bench, delta, None, None, "", "")], 0, 1)
    run.turns = turns
    rounds = rounds_of(conv())
    run.prediction = prediction(rounds, predict_rounds(rounds, B), B, 24)
    return run


def turn(t: int, predicted: list[int], hits: int, *, replayed: int | None = None, ttft: float = 10.0) -> TurnRecord:
    return TurnRecord(0, t, t >= 2, [40] * 3, predicted, hits, 120, [ttft] * 3, replayed)


def test_turn_hits_pass_when_exact_and_name_eviction_when_the_replay_loses_blocks() -> None:
    ok = record("M", [turn(0, [0, 24, 24], 48), turn(1, [28, 28, 28], 84)])
    v = turn_hits_match(ok)
    assert v.passed
    assert "turn 1: hits 84 / predicted 84" in v.message
    evicted = record("M", [turn(0, [0, 24, 24], 48), turn(1, [28, 28, 28], 24, replayed=24)], gpu_blocks=12)
    v = turn_hits_match(evicted)
    assert not v.passed
    assert "eviction" in v.message
    assert "12 blocks" in v.message
    assert "APC" not in v.message
    broken = record("M", [turn(0, [0, 24, 24], 48), turn(1, [28, 28, 28], 24, replayed=84)], gpu_blocks=1000)
    v = turn_hits_match(broken)
    assert not v.passed
    assert "eviction" not in v.message
    off = TurnRecord(0, 1, False, [40] * 3, [28] * 3, 0, 0)
    assert "APC is off" in turn_hits_match(record("M", [off])).message


def test_compaction_hits_fall_to_the_global_prefix_as_predicted() -> None:
    good = [turn(1, [28, 28, 28], 84), turn(2, [24, 24, 24], 72), turn(3, [36, 36, 36], 108)]
    v = compaction_hits(record("M", good, variant=COMPACT))
    assert v.passed, v.message
    assert v.numbers["global_prefix_hit"] == 24
    short = [turn(1, [28, 28, 28], 84), turn(2, [24, 24, 24], 48)]
    assert not compaction_hits(record("M", short, variant=COMPACT)).passed


def test_late_turns_are_judged_by_a_bootstrap_interval_of_their_ttfts() -> None:
    settings = SimpleNamespace(bootstrap_samples=500, confidence=0.95, multiturn_gain_concurrency=8,
                               overhead_tolerance=0.10)  # fmt: skip
    rng = np.random.default_rng(0)

    def turns(scale: float) -> list[TurnRecord]:
        return [TurnRecord(0, t, False, [40], [8 * t], 0, 40, list(rng.normal(scale * (1 + t), 1, 20)))
                for t in range(4)]  # fmt: skip

    faster = Pair(record("L", turns(50)), record("M", turns(10)), settings)  # type: ignore[arg-type]
    v = late_turn_ttft(faster)
    assert v.passed, v.message
    assert v.numbers["turns"] == [2, 3]
    assert v.numbers["ttft_speedup_low"] > 1
    assert v.numbers["gain_required"]
    # Turns 2 and 3 predict 16 and 24 of 40 tokens cached: 80 prompt tokens, 40 left to compute.
    assert v.numbers["prefill_bound"] == 2.0
    assert "prefill bound 2.00x" in v.message
    assert set(v.numbers["gain_by_turn"]) == {"0", "1", "2", "3"}
    assert "turn 3 5.0" in v.message  # medians 200 / 40
    same = Pair(record("L", turns(10)), record("M", turns(10)), settings)  # type: ignore[arg-type]
    v = late_turn_ttft(same)
    assert not v.passed
    assert "not significant" in v.message


def test_above_the_gain_concurrency_late_turns_are_held_to_not_being_slower() -> None:
    rng = np.random.default_rng(1)

    def turns(scale: float) -> list[TurnRecord]:
        return [TurnRecord(0, t, False, [40], [0], 0, 40, list(rng.normal(scale, 1, 20))) for t in range(4)]

    held = SimpleNamespace(bootstrap_samples=500, confidence=0.95, multiturn_gain_concurrency=0,
                           overhead_tolerance=0.10)  # fmt: skip
    same = Pair(record("L", turns(10)), record("M", turns(10)), held)  # type: ignore[arg-type]
    v = late_turn_ttft(same)
    assert v.passed, v.message
    assert not v.numbers["gain_required"]
    assert "held to not being slower at concurrency 8" in v.message
    slower = Pair(record("L", turns(10)), record("M", turns(20)), held)  # type: ignore[arg-type]
    v = late_turn_ttft(slower)
    assert not v.passed
    assert "slower with APC by at least" in v.message
    # A limit below the run's concurrency holds it too; one at or above requires the gain.
    below = SimpleNamespace(**{**held.__dict__, "multiturn_gain_concurrency": 4})
    assert late_turn_ttft(Pair(record("L", turns(10)), record("M", turns(10)), below)).passed  # type: ignore[arg-type]


def test_run_ids_and_pairs_of_the_multiturn_case() -> None:
    key = RunKey.parse("M-c8-compact")
    assert key == RunKey("M", 8, variant=COMPACT)
    assert key.id == "M-c8-compact"
    assert key.mode == ServerMode(True)
    assert RunKey.parse("L-c1").mode == ServerMode(False)
    assert RunKey.parse("M-c1").pair() == (RunKey("L", 1), RunKey("M", 1))


def test_the_records_round_trip_with_their_turns() -> None:
    run = record("M", [turn(0, [0, 24, 24], 48)])
    data = json.loads(json.dumps(run.to_json()))
    assert data["turns"][0]["predicted_hits"] == 48
    back = RunRecord.from_json(data)
    assert back.turns == run.turns


def test_rounds_merge_into_one_repeat() -> None:
    one = {"completed": 2, "failed": 0, "total_input_tokens": 5, "duration": 1.0, "ttfts": [0.1]}
    two = {"completed": 2, "failed": 0, "total_input_tokens": 7, "duration": 2.0, "ttfts": [0.3]}
    merged = merged_bench([one, two])
    assert merged["completed"] == 4
    assert merged["total_input_tokens"] == 12
    assert merged["duration"] == 3.0
    assert merged["ttfts"] == [0.1, 0.3]
    assert round(merged["median_ttft_ms"]) == 200
    d = Delta(1, 2, 3, None, 0, 0, 0, {})
    total = sum_deltas([d, d])
    assert total is not None
    assert total.prefix_cache_hits == 4
    assert total.computed_tokens is None
    assert sum_deltas([d, None]) is None


def test_a_message_list_file_becomes_vllm_samples_with_their_messages(tmp_path: Path) -> None:
    path = tmp_path / "round.jsonl"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    path.write_text(json.dumps({"prompt": messages, "prompt_len": 9, "output_tokens": 3}) + "\n")
    (sample,) = (
        chat_samples(SimpleNamespace(dataset_name="custom", dataset_path=str(path), request_id_prefix="x")) or []
    )
    assert sample.chat_messages == messages
    assert sample.prompt_len == 9
    assert sample.expected_output_len == 3
    assert sample.request_id == "x0"
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "text"}) + "\n")
    assert chat_samples(SimpleNamespace(dataset_name="custom", dataset_path=str(plain))) is None
    assert chat_samples(SimpleNamespace(dataset_name="random", dataset_path=None)) is None


def test_the_first_round_sends_its_first_request_alone_so_the_global_prefix_is_cached_first() -> None:
    from pytest_apc.measure.multiturn import round_parts

    assert round_parts(0, 8) == [(0, 1), (1, 8)]
    assert round_parts(0, 1) == [(0, 1)]
    assert round_parts(1, 8) == [(0, 8)]
    assert round_parts(5, 3) == [(0, 3)]


def test_turn_hits_fail_without_a_prediction_and_name_counters_that_were_not_read() -> None:
    run = record("M", [turn(0, [0, 0, 0], 0)])
    run.prediction = None  # a server that reported no block size: every "prediction" is 0
    v = turn_hits_match(run)
    assert not v.passed
    assert "no prediction" in v.message
    unread = record("M", [TurnRecord(0, 1, False, [40] * 3, [28, 28, 28], None, None, [10.0] * 3)])
    unread.repeats[0].metrics_error = "GET /metrics: connection refused"
    v = turn_hits_match(unread)
    assert not v.passed
    assert "counters were not read around this turn: GET /metrics: connection refused" in v.message
    assert "eviction" not in v.message


def tier_turn(t: int, predicted: int, replayed: int, local: int | None, tier: int | None) -> TurnRecord:
    return TurnRecord(0, t, False, [40] * 3, [predicted], local, 120, [10.0] * 3, replayed, local, tier)


def tier_record(variant: str, turns: list[TurnRecord], gpu_blocks: int = 30) -> RunRecord:
    run = record("M", turns, gpu_blocks=gpu_blocks, variant=variant)
    run.key = RunKey("M", 1, variant=variant)
    return run


def test_small_cache_runs_are_servers_of_their_own_at_concurrency_1() -> None:
    from pytest_apc.workload.plan import parametrization

    small, tier = RunKey.parse("M-c1-small-cache"), RunKey.parse("M-c1-offload-tier")
    assert (small.variant, tier.variant) == (SMALL_CACHE, OFFLOAD_TIER)
    assert small.mode == ServerMode(True, cache="multiturn-small-cache")
    assert not small.mode.tier
    assert tier.mode.tier
    assert tier.mode.cache_family == "multiturn"
    assert RunKey("N", 1).mode.cache_family == "offload"
    assert small.mode != RunKey("N", 1).mode
    assert RunKey.parse("M-c8-round_robin").route == "round_robin"  # anything else after M is a route
    gpu = SimpleNamespace(profile="gpu", multiturn_concurrency=(1, 8), concurrency=8)
    cpu = SimpleNamespace(profile="cpu", multiturn_concurrency=(1, 8), concurrency=8)
    params = parametrization("M", {"tiers": True}, gpu)  # type: ignore[arg-type]
    assert [(p.run_id, p.skip) for p in params] == [("M-c1-small-cache", None), ("M-c1-offload-tier", None)]
    params = parametrization("M", {"tiers": True}, cpu)  # type: ignore[arg-type]
    assert params[0].skip is None
    assert "no KV offload tier" in (params[1].skip or "")


def test_the_tier_verdict_passes_when_each_tier_serves_what_the_replay_says() -> None:
    turns = [tier_turn(0, 48, 48, 48, 0), tier_turn(1, 84, 60, 60, 24)]
    v = turn_hits_across_tiers(tier_record(OFFLOAD_TIER, turns))
    assert v.passed, v.message
    assert "GPU 60 / 60, tier 24 / 24, all tiers 84 / 84" in v.message
    no_tier = [tier_turn(0, 48, 48, 48, 0), tier_turn(1, 84, 60, 60, 0)]
    assert turn_hits_across_tiers(tier_record(SMALL_CACHE, no_tier)).passed


def test_the_tier_verdict_fails_each_way_a_tier_or_the_pool_can_be_wrong() -> None:
    def failed(variant: str, turns: list[TurnRecord]) -> str:
        v = turn_hits_across_tiers(tier_record(variant, turns))
        assert not v.passed
        return v.message

    first = tier_turn(0, 48, 48, 48, 0)
    # The GPU cache kept other blocks than vLLM's pool would.
    assert "a replay of vLLM's block pool" in failed(SMALL_CACHE, [first, tier_turn(1, 84, 60, 56, 0)])
    # The tier served less than the GPU cache lost, or a server without one loaded blocks.
    assert "did not keep every evicted block" in failed(OFFLOAD_TIER, [first, tier_turn(1, 84, 60, 60, 12)])
    assert "without a tier loaded" in failed(SMALL_CACHE, [first, tier_turn(1, 84, 60, 60, 24)])
    # More than the prediction: the reset left blocks behind.
    assert "the reset before the repeat left blocks" in failed(OFFLOAD_TIER, [first, tier_turn(1, 84, 60, 60, 40)])
    # A cache that evicted nothing measured nothing.
    assert "nothing was evicted" in failed(OFFLOAD_TIER, [first, tier_turn(1, 84, 84, 84, 0)])
    # No by-source counters: the tiers cannot be told apart.
    assert "by source" in failed(OFFLOAD_TIER, [first, tier_turn(1, 84, 60, None, None)])
    assert "no turns" in failed(OFFLOAD_TIER, [])


def test_the_replay_gives_the_gpu_cache_hits_measured_on_an_h200() -> None:
    """M-c1-small-cache on one H200 (vLLM 0.26.0, 8B shape, 1,248 blocks of 16): every turn's GPU-cache hits,
    counted by source, are what the replay of vLLM's block pool gives. The token ids are stand-ins with the
    measured lengths and the sharing the server's own tokens had (each request shares its predicted cached
    tokens with its conversation's previous turn, the first round the global prefix). A pool that uses
    never-cached space before evicting predicted 71,712 and 70,304 for turns 1 and 2, where vLLM served
    71,616 and 67,888: vLLM takes free blocks from the front of one queue, cached or not."""
    data = json.loads((Path(__file__).parent / "data" / "h200-multiturn-small-cache.json").read_text())
    fresh = iter(range(10**9, 2 * 10**9))
    rounds: list[list[list[int]]] = []
    for t in data["turns"]:
        before = rounds[-1] if rounds else None
        requests: list[list[int]] = []
        for c, (n, shared) in enumerate(zip(t["prompt_tokens"], t["predicted"], strict=True)):
            base = (before[c] if before else (requests[0] if requests else []))[:shared]
            requests.append(base + [next(fresh) for _ in range(n - len(base))])
        rounds.append(requests)
    assert predict_rounds(rounds, data["block_size"]) == [t["predicted"] for t in data["turns"]]
    hits, evicted = replay(rounds, data["output_len"], data["block_size"], data["gpu_blocks"], 1)
    assert [sum(h) for h in hits] == [t["local_tokens"] for t in data["turns"]]
    assert evicted > 0


def test_the_round_barrier_is_checked_from_send_and_first_token_times() -> None:
    def timed(t: int, sent: list[float], first: list[float]) -> TurnRecord:
        rec = turn(t, [0, 24, 24] if t == 0 else [28, 28, 28], 48 if t == 0 else 84)
        rec.sent_s, rec.first_token_s = sent, first
        return rec

    ok = record("M", [timed(0, [0.0, 0.5, 0.5], [0.4, 0.6, 0.6]), timed(1, [2.0, 2.0, 2.0], [2.1, 2.1, 2.1])])
    v = turn_hits_match(ok)
    assert v.passed, v.message
    assert "barrier: 5 requests sent after the prefill they hit" in v.message
    # Turn 1 of conversation 2 sent before turn 0's first token; a first round sent all at once.
    early = record("M", [timed(0, [0.0, 0.5, 0.5], [0.4, 0.6, 2.5]), timed(1, [2.0, 2.0, 2.0], [2.1, 2.1, 2.6])])
    v = turn_hits_match(early)
    assert not v.passed
    assert "turn 1 conversation 2: sent at 2.000 s, before turn 0's first token at 2.500 s" in v.message
    together = record("M", [timed(0, [0.0, 0.0, 0.0], [0.4, 0.5, 0.5])])
    assert "before the first request's first token" in turn_hits_match(together).message
    untimed = record("M", [turn(0, [0, 24, 24], 48)])
    assert "3 not checked (the benchmark saved no send times)" in turn_hits_match(untimed).message


def test_late_turns_own_the_rule_they_were_held_to() -> None:
    """``held_to`` of multiturn_ttft: faster up to --apc-set multiturn_gain_concurrency, not slower above it; a
    file written before verdicts carried it reads the same rule from ``numbers.gain_required``."""
    from pytest_apc.verdicts.verdict import FASTER, NOT_SLOWER, held_to

    rng = np.random.default_rng(2)

    def turns(scale: float) -> list[TurnRecord]:
        return [TurnRecord(0, t, False, [40], [0], 0, 40, list(rng.normal(scale, 1, 20))) for t in range(4)]

    for limit, rule in ((8, FASTER), (4, NOT_SLOWER), (0, NOT_SLOWER)):
        s = SimpleNamespace(bootstrap_samples=500, confidence=0.95, multiturn_gain_concurrency=limit,
                            overhead_tolerance=0.10)  # fmt: skip
        v = late_turn_ttft(Pair(record("L", turns(50)), record("M", turns(10)), s))  # type: ignore[arg-type]
        assert v.held_to == rule, limit
        assert held_to({k: x for k, x in v.to_json().items() if k != "held_to"}) == rule
