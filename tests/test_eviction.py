"""The replay of vLLM's block pool (eviction.py): small cases worked by hand, and the H200 measurement."""

import json
from pathlib import Path

import pytest

from pytest_apc.workload.eviction import Request, local_hits

DATA = Path(__file__).parent / "data" / "h200-offload-requests.json"


def test_the_replay_gives_the_local_hits_measured_on_an_h200() -> None:
    data = json.loads(DATA.read_text())
    requests = [
        Request(g, n, data["output_tokens"]) for g, n in zip(data["groups"], data["prompt_tokens"], strict=True)
    ]
    assert sum(data["prompt_tokens"]) == 947_023
    hits = local_hits(
        requests,
        header_tokens=data["header_tokens"],
        shared_tokens=data["header_tokens"] + data["prefix_tokens"],
        block_size=data["block_size"],
        gpu_blocks=data["gpu_blocks"],
    )
    assert sum(hits) == data["measured_local_hits"] == 274_864
    # Partial hits are the heads that tail-first eviction left: whole blocks, shorter than the prefix.
    partial = [h for h in hits if 16 < h < 32_784]
    assert partial
    assert all(h % 16 == 0 for h in partial)


def test_a_cache_with_room_for_everything_hits_one_servers_prediction() -> None:
    # 3 groups x 2 requests, prefix 64 tokens + header 8 (block 16: S = 72 -> 4 shared blocks, header 0).
    requests = [Request(g, 8 + 64 + 20, 4) for g in (0, 1, 0, 2, 1, 2)]
    hits = local_hits(requests, header_tokens=8, shared_tokens=72, block_size=16, gpu_blocks=1000)
    assert hits == [0, 0, 64, 0, 64, 64]  # (N - G) x P with P = 64, Q = 0


def test_a_returning_group_hits_the_head_its_tail_first_eviction_left() -> None:
    # Block 10, 14 usable. A request takes ceil((100 + 4 - 1) / 10) = 11 blocks: 10 full (the first 9 its
    # group's prefix), the 11th partial. Group 0, then group 1, then group 0 again.
    requests = [Request(0, 100, 4), Request(1, 100, 4), Request(0, 100, 4)]
    hits = local_hits(requests, header_tokens=0, shared_tokens=90, block_size=10, gpu_blocks=15)
    # Request 1 takes request 0's partial block and the 3 never used without evicting, then evicts request 0's
    # blocks 9, 8, ..., 3 (tail first): request 2 hits the 3 head blocks left.
    assert hits == [0, 0, 30]


def test_the_partial_last_block_is_reused_before_a_cached_block_is_evicted() -> None:
    # 13 usable blocks, 11 per request. Group 0, group 1 twice, group 0 again. Request 1 leaves group 0
    # one head block; request 2 hits group 1's 9 prefix blocks and takes 2 new blocks: first request 1's
    # partial last block (front of the queue, caching nothing), then one more. Were the partial block queued
    # behind the cached ones, request 2 would evict group 0's last block and request 3 would hit nothing.
    requests = [Request(0, 100, 4), Request(1, 100, 4), Request(1, 100, 4), Request(0, 100, 4)]
    hits = local_hits(requests, header_tokens=0, shared_tokens=90, block_size=10, gpu_blocks=14)
    assert hits == [0, 0, 90, 10]


def test_a_request_larger_than_the_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 11 blocks, more than the 9 usable"):
        local_hits([Request(0, 100, 4)], header_tokens=0, shared_tokens=90, block_size=10, gpu_blocks=10)
