"""Case M behind a router: which conversations each replica held, told from every replica's counters.

A run sends round t (turn t of every conversation) as one benchmark run and reads every replica's requests
and hits around it. A replica's hits are exact given what it prefilled before (``multiturn.cached_tokens``
over the requests that landed there since the reset), so an assignment of the round's requests to
replicas predicts every replica's hits exactly. ``explain`` finds the routing that explains every replica's
request count and hits in every round: first an assignment of conversations to replicas that holds for
every round (affinity: each conversation's turns land where its history is), else, round by round, the
routing that moves the fewest conversations. A request whose previous turn was prefilled on another replica
computes its history again: a cold prefill the routing caused, on top of the one every conversation's first
turn makes. The search is exhaustive up to ``MAX_ASSIGNMENTS`` assignments a round; beyond that (or past
``MAX_STATES`` routings kept between rounds) a routing that explains the counters may be missed, and
``Explanation.exhaustive`` says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_apc.workload.multiturn import common_prefix, served

# Assignments of one round's G requests to R replicas tried (R^G): 2 replicas x 16 conversations.
MAX_ASSIGNMENTS = 1 << 16
# Routings (histories of where every request went) kept from one round to the next, fewest moves first.
MAX_STATES = 64


@dataclass
class Explanation:
    """A routing that explains every replica's requests and hits in every round (``found``), or why none."""

    found: bool
    exhaustive: bool  # False: the search was bounded, so "not found" does not prove that no routing exists
    held: list[dict[str, list[int]]] = field(default_factory=list)  # per round: replica -> its conversations
    predicted: list[dict[str, int]] = field(default_factory=list)  # per round: replica -> its predicted hits
    moved: list[list[int]] = field(default_factory=list)  # per round: conversations on another replica than before
    alternatives: int = 0  # further constant assignments that explain the counters as well (same hits)

    @property
    def constant(self) -> bool:
        """Every conversation stayed on one replica."""
        return self.found and not any(self.moved)

    @property
    def moves(self) -> int:
        return sum(len(m) for m in self.moved)


class _Requests:
    """The rounds' token ids and the cached tokens of a request given what its replica prefilled before."""

    def __init__(self, rounds: Sequence[Sequence[Sequence[int]]], block_size: int) -> None:
        self.rounds = rounds
        self.block = block_size
        self._lcp: dict[tuple[int, int, int, int], int] = {}

    def lcp(self, a: tuple[int, int], b: tuple[int, int]) -> int:
        key = (*a, *b) if a <= b else (*b, *a)
        if key not in self._lcp:
            self._lcp[key] = common_prefix(self.rounds[a[0]][a[1]], self.rounds[b[0]][b[1]])
        return self._lcp[key]

    def cached(self, request: tuple[int, int], earlier: Sequence[tuple[int, int]]) -> int:
        longest = max((self.lcp(request, e) for e in earlier), default=0)
        return served(longest, len(self.rounds[request[0]][request[1]]), self.block) if self.block else 0


def _round_hits(
    req: _Requests, turn: int, assignment: Sequence[int], seen: Sequence[Sequence[tuple[int, int]]]
) -> list[int]:
    """Each replica's predicted hits for round ``turn`` routed as ``assignment`` (conversation -> replica),
    its requests prefilled in sending order after what ``seen`` says each replica held."""
    out = []
    for r, before in enumerate(seen):
        local = list(before)
        hits = 0
        for c, where in enumerate(assignment):
            if where == r:
                hits += req.cached((turn, c), local)
                local.append((turn, c))
        out.append(hits)
    return out


def _assignments(conversations: int, counts: Sequence[int]) -> list[tuple[int, ...]]:
    """Every assignment of ``conversations`` to replicas with ``counts[r]`` conversations on replica r."""
    if sum(counts) != conversations:
        return []
    return [a for a in itertools.product(range(len(counts)), repeat=conversations)
            if all(a.count(r) == n for r, n in enumerate(counts))]  # fmt: skip


def explain(
    rounds: Sequence[Sequence[Sequence[int]]],
    block_size: int,
    names: Sequence[str],
    requests: Sequence[Sequence[int]],
    hits: Sequence[Sequence[int]],
) -> Explanation:
    """The routing of a multi-turn run that explains ``requests[t][r]`` and ``hits[t][r]`` (round t, replica
    ``names[r]``) exactly; ``rounds[t][c]``: the token ids of conversation c's turn t, sent in that order."""
    req = _Requests(rounds, block_size)
    replicas, turns = len(names), len(rounds)
    conversations = len(rounds[0]) if rounds else 0
    if replicas**conversations > MAX_ASSIGNMENTS:
        return Explanation(found=False, exhaustive=False)
    per_round = [_assignments(conversations, requests[t]) for t in range(turns)]
    # Affinity first: one assignment for every round (the request counts must then be the same each round).
    constant = [a for a in per_round[0] if all(list(requests[t]) == list(requests[0]) for t in range(turns))]
    matches = [a for a in constant if _replays(req, [a] * turns, hits, replicas)]
    if matches:
        return _explanation(req, [matches[0]] * turns, names, alternatives=len(matches) - 1)
    # Else round by round, keeping the routings that explain every round so far, fewest moves first.
    states: list[tuple[int, list[tuple[int, ...]]]] = [(0, [])]
    exhaustive = True
    for t in range(turns):
        grown: dict[tuple[frozenset[tuple[int, int]], ...], tuple[int, list[tuple[int, ...]]]] = {}
        for moves, history in states:
            seen = _seen(history, replicas)
            for a in per_round[t]:
                if _round_hits(req, t, a, seen) != list(hits[t]):
                    continue
                moved = sum(1 for c in range(conversations) if history and history[-1][c] != a[c])
                path = [*history, a]
                key = (*(frozenset(s) for s in _seen(path, replicas)), frozenset(enumerate(a)))
                if key not in grown or grown[key][0] > moves + moved:
                    grown[key] = (moves + moved, path)
        states = sorted(grown.values(), key=lambda s: s[0])
        if len(states) > MAX_STATES:
            states, exhaustive = states[:MAX_STATES], False
        if not states:
            return Explanation(found=False, exhaustive=exhaustive)
    return _explanation(req, states[0][1], names)


def _seen(history: Sequence[Sequence[int]], replicas: int) -> list[list[tuple[int, int]]]:
    seen: list[list[tuple[int, int]]] = [[] for _ in range(replicas)]
    for t, a in enumerate(history):
        for c, r in enumerate(a):
            seen[r].append((t, c))
    return seen


def _replays(req: _Requests, history: Sequence[Sequence[int]], hits: Sequence[Sequence[int]], replicas: int) -> bool:
    return all(_round_hits(req, t, a, _seen(history[:t], replicas)) == list(hits[t]) for t, a in enumerate(history))


def _explanation(
    req: _Requests, history: Sequence[Sequence[int]], names: Sequence[str], alternatives: int = 0
) -> Explanation:
    replicas = len(names)
    held, predicted, moved = [], [], []
    for t, a in enumerate(history):
        held.append({name: [c for c, where in enumerate(a) if where == r] for r, name in enumerate(names)})
        round_hits = _round_hits(req, t, a, _seen(history[:t], replicas))
        predicted.append(dict(zip(names, round_hits, strict=True)))
        moved.append([c for c, where in enumerate(a) if t and history[t - 1][c] != where])
    return Explanation(True, True, held, predicted, moved, alternatives)
