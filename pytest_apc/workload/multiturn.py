"""The multi-turn case (M on the APC-on server, L on the APC-off one): what it sends and what it predicts.

G conversations of T turns share one global prefix (a system prompt and tool definitions, P tokens of
seeded text). Turn t of a conversation sends its whole history: the global prefix, every earlier user
message (U tokens) each followed by a fixed synthetic assistant reply (A tokens; fixed, so that the next
prompt does not depend on what the model generated), and the new user message. Round t is turn t of every
conversation, one benchmark run; the next round starts once every request of this one finished.

The compaction variant (``M-c<N>-compact``) replaces a conversation's history after K turns by a short
summary after the global prefix: its turn K hits the global prefix only, and the turns after it hit the
summary-based history again.

The prediction is exact given the token ids the server prefills (``/tokenize`` with each request's
messages): a request's cached tokens are its longest common prefix with any request prefilled before it
on that server since the reset, capped at its length - 1 (vLLM computes the last prompt token) and floored
to whole blocks. ``replay`` runs the same requests through vLLM's block pool at a given size (the offload
case's, ``eviction.BlockPool``), to tell a cache too small to keep a conversation between turns from a broken
one, and to predict the GPU cache's own hits on such a cache.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.workload.cases import ceil_div
from pytest_apc.workload.eviction import BlockId, BlockPool

# Words of one token each in most tokenizers (English and Python text): lengths in words are close to tokens.
_WORDS = tuple(
    [
        "the",
        "and",
        "for",
        "with",
        "this",
        "that",
        "from",
        "return",
        "self",
        "value",
        "list",
        "name",
        "data",
        "file",
        "line",
        "time",
        "type",
        "none",
        "true",
        "false",
        "import",
        "class",
        "def",
        "if",
        "else",
        "while",
        "try",
        "except",
        "print",
        "open",
        "read",
        "write",
        "path",
        "text",
        "size",
        "key",
        "item",
    ]
)

Message = dict[str, str]


def text(tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens of seeded text."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, tokens)))


@dataclass(frozen=True)
class Conversations:
    """The multi-turn workload: every message of every conversation, fixed by the seed."""

    conversations: int
    turns: int
    prefix_len: int
    user_len: int
    reply_len: int
    summary_len: int
    seed: int
    compact_after: int = 0  # 0: never compacted

    def _rng(self, *parts: int) -> random.Random:
        return random.Random(f"{self.seed}-" + "-".join(map(str, parts)))

    def system(self) -> str:
        rng = self._rng(0)
        return "You are a coding agent. Tools: " + text(self.prefix_len, rng)

    def user(self, conversation: int, turn: int) -> str:
        return text(self.user_len, self._rng(1, conversation, turn))

    def reply(self, conversation: int, turn: int) -> str:
        return text(self.reply_len, self._rng(2, conversation, turn))

    def summary(self, conversation: int) -> str:
        return text(self.summary_len, self._rng(3, conversation))

    def compacted(self, turn: int) -> bool:
        """Whether turn ``turn``'s history starts from the summary."""
        return 0 < self.compact_after <= turn

    def messages(self, conversation: int, turn: int) -> list[Message]:
        """What turn ``turn`` (0-based) of ``conversation`` sends."""
        out: list[Message] = [{"role": "system", "content": self.system()}]
        first = 0
        if self.compacted(turn):
            out += [
                {"role": "user", "content": self.summary(conversation)},
                {"role": "assistant", "content": "Noted."},
            ]
            first = self.compact_after
        for j in range(first, turn):
            out += [
                {"role": "user", "content": self.user(conversation, j)},
                {"role": "assistant", "content": self.reply(conversation, j)},
            ]
        out.append({"role": "user", "content": self.user(conversation, turn)})
        return out

    def round(self, turn: int) -> list[list[Message]]:
        """Round ``turn``: one request per conversation, in sending order."""
        return [self.messages(c, turn) for c in range(self.conversations)]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def cached_tokens(tokens: Sequence[int], earlier: Sequence[Sequence[int]], block_size: int) -> int:
    """What vLLM's prefix cache serves a request: its longest common prefix with any earlier request, capped
    at len - 1 and floored to whole blocks (only full blocks are cached; the last prompt token is computed)."""
    return served(max((common_prefix(tokens, e) for e in earlier), default=0), len(tokens), block_size)


def served(longest: int, length: int, block_size: int) -> int:
    """The cached tokens of a request of ``length`` tokens whose longest common prefix with an earlier one is
    ``longest``: capped at length - 1, floored to whole blocks."""
    return min(longest, length - 1) // block_size * block_size


def predict_rounds(rounds: Sequence[Sequence[Sequence[int]]], block_size: int) -> list[list[int]]:
    """Cached tokens of every request of every round, on a cache that keeps everything since the reset."""
    seen: list[Sequence[int]] = []
    out: list[list[int]] = []
    for requests in rounds:
        hits = []
        for tokens in requests:
            hits.append(cached_tokens(tokens, seen, block_size))
            seen.append(tokens)
        out.append(hits)
    return out


def block_ids(tokens: Sequence[int], block_size: int) -> list[int]:
    """Each full block's identity: a hash of its tokens chained with the block before it, as vLLM names blocks
    (two requests share a block only if every token up to its end is the same)."""
    out: list[int] = []
    previous = 0
    for j in range(len(tokens) // block_size):
        previous = hash((previous, tuple(tokens[j * block_size : (j + 1) * block_size])))
        out.append(previous)
    return out


def replay(
    rounds: Sequence[Sequence[Sequence[int]]],
    output_len: int,
    block_size: int,
    gpu_blocks: int,
    concurrency: int,
) -> tuple[list[list[int]], int]:
    """Cached tokens per request, and the cached blocks evicted, through vLLM's block pool of ``gpu_blocks``
    blocks (``eviction.BlockPool``: free blocks reused from the front of one queue, a request's blocks freed
    tail first, its output blocks cached too): requests run ``concurrency`` at a time in sending order, each
    holding its prompt and output blocks. Exact at concurrency 1; above it, an approximation for the
    diagnosis."""
    pool = BlockPool(gpu_blocks)
    out: list[list[int]] = []
    for r, requests in enumerate(rounds):
        hits: list[int] = []
        for start in range(0, len(requests), concurrency):
            running: list[list[int]] = []
            for i, tokens in enumerate(requests[start : start + concurrency]):
                filled = len(tokens) + output_len - 1  # KV for every token but the last output
                prompt: list[BlockId] = [(b,) for b in block_ids(tokens, block_size)]
                output: list[BlockId] = [("output", r, start + i, j) for j in range(len(prompt), filled // block_size)]
                hit, own = pool.admit(prompt + output, (len(tokens) - 1) // block_size, ceil_div(filled, block_size))
                hits.append(hit * block_size)
                running.append(own)
            for own in running:
                pool.release(own)
        out.append(hits)
    return out, pool.evicted


@dataclass
class TurnRecord:
    """One round of one cold repeat of a multi-turn run, as measured and as predicted."""

    repeat: int
    turn: int
    compacted: bool
    prompt_tokens: list[int]  # per request, as the server tokenized it
    predicted: list[int]  # cached tokens per request
    hits: int | None  # the server's prefix-cache hits over the round (None: not read)
    queries: int | None
    ttfts_ms: list[float] = field(default_factory=list)
    replayed: int | None = None  # the hits a replay of vLLM's block pool at the server's KV size gives
    # The round's prompt tokens by source (vllm:prompt_tokens_by_source_total; None where not exported): served
    # by the GPU prefix cache, loaded from a KV connector's tier. Unlike the hit counter, a request that waits
    # for its blocks and is scheduled again is not counted twice.
    local_tokens: int | None = None
    tier_tokens: int | None = None
    # Each request's send time and first-token time, in seconds since the repeat's first request was sent (None:
    # the benchmark did not save its send times): the round barrier, checked.
    sent_s: list[float] | None = None
    first_token_s: list[float] | None = None
    # Behind a router (affinity.py): every replica's requests and hits over the round, and the routing that
    # explains them (None where not found): the conversations each replica held, the hits that routing
    # predicts, the conversations that landed on another replica than their previous turn.
    replica_requests: dict[str, int] | None = None
    replica_hits: dict[str, int] | None = None
    held: dict[str, list[int]] | None = None
    replica_predicted: dict[str, int] | None = None
    moved: list[int] | None = None
    searched_all: bool | None = None  # False: the routing search was bounded (affinity.MAX_ASSIGNMENTS)
    alternatives: int | None = None  # further constant routings that explain the counters as well

    @property
    def predicted_hits(self) -> int:
        return sum(self.predicted)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "predicted_hits": self.predicted_hits}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
