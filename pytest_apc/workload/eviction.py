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

BlockId = tuple[object, ...]  # what a block caches: equal ids are the same tokens after the same prefix


class BlockPool:
    """vLLM's block pool, as far as hits depend on it (this module's docstring): ``admit`` a request, which
    hits its cached leading blocks and takes the rest from the front of the free queue (evicting what they
    cached), then ``release`` it, which frees its blocks tail first."""

    def __init__(self, gpu_blocks: int) -> None:
        self.usable = gpu_blocks - 1  # block 0 is the null block
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, gpu_blocks))  # front = next to reuse
        # Block identity -> the physical blocks caching it (vLLM keeps duplicates of one hash), and back.
        self.cached: dict[BlockId, list[int]] = {}
        self.holds: dict[int, BlockId] = {}
        self.users: dict[int, int] = {}  # physical block -> running requests holding it
        self.evicted = 0

    def admit(self, filled: Sequence[BlockId], hittable: int, total_blocks: int) -> tuple[int, list[int]]:
        """A request whose full blocks are ``filled`` (prompt and output: each is cached once full), of which
        the first ``hittable`` may be hits (the last prompt token is always computed), holding
        ``total_blocks`` at its longest: its hit blocks, and the physical blocks it holds."""
        if total_blocks > self.usable:
            raise ValueError(f"a request needs {total_blocks} blocks, more than the {self.usable} usable ones")
        own: list[int] = []
        while len(own) < hittable and filled[len(own)] in self.cached:
            block = self.cached[filled[len(own)]][0]
            self.free.pop(block, None)  # a hit block in use leaves the free queue
            own.append(block)
        hit_blocks = len(own)
        while len(own) < total_blocks:
            if not self.free:
                raise ValueError("the running requests need more blocks than the pool has")
            block, _ = self.free.popitem(last=False)
            gone = self.holds.pop(block, None)
            if gone is not None:
                self.evicted += 1
                self.cached[gone].remove(block)
                if not self.cached[gone]:
                    del self.cached[gone]
            own.append(block)
        for block in own:
            self.users[block] = self.users.get(block, 0) + 1
        for j in range(hit_blocks, len(filled)):  # every block it fills is cached
            self.cached.setdefault(filled[j], []).append(own[j])
            self.holds[own[j]] = filled[j]
        return hit_blocks, own

    def release(self, own: Sequence[int]) -> None:
        """Freed tail first: cached blocks to the end of the queue (least recently used leave first), blocks
        that cache nothing (the last, partial one) to its front, to be reused first; a block another running
        request holds stays out of the queue."""
        released = []
        for block in reversed(own):
            self.users[block] -= 1
            if not self.users[block]:
                released.append(block)
        for block in reversed([b for b in released if b not in self.holds]):
            self.free[block] = None
            self.free.move_to_end(block, last=False)
        for block in released:
            if block in self.holds:
                self.free[block] = None


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
    pool = BlockPool(gpu_blocks)
    hits: list[int] = []
    for i, request in enumerate(requests):

        def identity(j: int, request: Request = request, i: int = i) -> BlockId:
            if j < header_blocks:
                return (-1, j)
            if j < shared_blocks:
                return (request.group, j)
            return (-2, i, j)

        # KV slots are needed for every token but the last output.
        tokens = request.prompt_tokens + request.output_tokens - 1
        try:
            hit, own = pool.admit(
                [identity(j) for j in range(tokens // block_size)],
                (request.prompt_tokens - 1) // block_size,
                ceil_div(tokens, block_size),
            )
        except ValueError as err:
            raise ValueError(f"request {i}: {err}") from None
        hits.append(hit * block_size)
        pool.release(own)
    return hits
