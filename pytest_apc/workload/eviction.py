"""The local prefix-cache hits of a GPU cache too small for the workload, predicted by replaying vLLM's
block pool over the requests in the order the benchmark sent them (concurrency 1: one at a time).

vLLM's pool (``vllm/v1/core/block_pool.py``), as far as hits depend on it:

* ``num_gpu_blocks`` blocks; block 0 is the null block, never used for KV.
* Free blocks wait in one queue. A new block is taken from its front (the least recently freed); if it
  still holds a cached block, that block is evicted then.
* A request's hit is the longest run of its full prompt blocks, from the first, that are cached (at most
  ``prompt - 1`` tokens: the last one is always computed). Hit blocks in the free queue leave it.
* When a request finishes its blocks are freed **in reverse order** (its last block first): the cached
  ones go to the end of the queue, so a prefix is evicted from its tail and a group that returns later
  still hits its head; a block that caches nothing (the last, partial one) goes to the front, to be reused
  before any cached block is evicted.
* A block is cached once full: the prompt's full blocks, and the output's as decoding fills them.

Checked against one H200 (vLLM 0.26.0, 8B shape, 3,000 GPU blocks, 4 groups of 32K, 28 requests, output
64): the replay gives the 274,864 local hits measured; without the front-of-queue rule for the partial
block it is 2 blocks short (tests/test_eviction.py).

Which blocks are the same: those entirely inside the template header (every request), and those entirely
inside header + prefix of the same prefix group; every other block is a request's own. The request order
and each request's group come from vLLM's dataset code (the benchmark worker records them), the prompt
lengths from the server's own usage counts, so nothing here is guessed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_apc.workload.cases import ceil_div

BlockId = tuple[int, ...]  # (-1, j): a header block; (g, j): group g's prefix block j; (-2, i, j): request i's own


@dataclass(frozen=True)
class Request:
    group: int
    prompt_tokens: int  # as the server counts them (template included)
    output_tokens: int


def local_hits(
    requests: Sequence[Request], *, header_tokens: int, shared_tokens: int, block_size: int, gpu_blocks: int
) -> list[int]:
    """Hit tokens of each request, in order, on a cold cache of ``gpu_blocks`` blocks, one request at a time.

    ``shared_tokens`` is S = header + prefix (what requests of one group share), ``header_tokens`` what all
    share. A request that does not fit the cache at all is an error (vLLM would not admit it either).
    """
    header_blocks, shared_blocks = header_tokens // block_size, shared_tokens // block_size
    free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, gpu_blocks))  # front = next to reuse
    # Block identity -> the physical blocks caching it (vLLM keeps duplicates of one hash), and back.
    cached: dict[BlockId, list[int]] = {}
    holds: dict[int, BlockId] = {}
    hits: list[int] = []
    for i, request in enumerate(requests):

        def identity(j: int, request: Request = request, i: int = i) -> BlockId:
            if j < header_blocks:
                return (-1, j)
            if j < shared_blocks:
                return (request.group, j)
            return (-2, i, j)

        # The last prompt token is always computed; KV slots are needed for every token but the last output.
        hittable = (request.prompt_tokens - 1) // block_size
        tokens = request.prompt_tokens + request.output_tokens - 1
        total_blocks = ceil_div(tokens, block_size)
        if total_blocks > gpu_blocks - 1:
            raise ValueError(f"request {i} needs {total_blocks} blocks, more than the {gpu_blocks - 1} usable ones")
        own: list[int] = []
        while len(own) < hittable and identity(len(own)) in cached:
            block = cached[identity(len(own))][0]
            free.pop(block, None)  # a hit block in use leaves the free queue
            own.append(block)
        hit_blocks = len(own)
        hits.append(hit_blocks * block_size)
        while len(own) < total_blocks:
            block, _ = free.popitem(last=False)
            evicted = holds.pop(block, None)
            if evicted is not None:
                cached[evicted].remove(block)
                if not cached[evicted]:
                    del cached[evicted]
            own.append(block)
        for j in range(hit_blocks, tokens // block_size):  # every block it filled is cached
            cached.setdefault(identity(j), []).append(own[j])
            holds[own[j]] = identity(j)
        # Freed tail first: cached blocks to the end of the queue (least recently used leave first), blocks
        # that cache nothing (the last, partial one) to its front, to be reused first.
        uncached = [block for block in reversed(own) if block not in holds]
        for block in reversed(uncached):
            free[block] = None
            free.move_to_end(block, last=False)
        for block in reversed(own):
            if block in holds:
                free[block] = None
    return hits
