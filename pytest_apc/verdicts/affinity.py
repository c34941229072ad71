"""Case M behind the router: which conversations each replica held and the cold prefills the routing caused.

Every round's counters are read on every replica; ``workload.affinity.explain`` (at measuring time, with the
token ids) found the routing that explains them exactly. Every conversation's first turn is a cold prefill
(it computes its own user message; the first conversation on each replica the global prefix as well); a
later turn that lands on another replica than its previous turn computes its history again: a cold prefill
the routing caused. consistent_hash on the conversation id (its x-request-id) must keep every conversation
on one replica: one cold prefill per conversation, every replica's hits in every round exactly as predicted,
and every round after the first hitting in total what one server would. round_robin is held to its own
promise (every round spread evenly) and reported. Counters that do not add up fail every route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts.verdict import Verdict
from pytest_apc.workload.multiturn import TurnRecord


@dataclass(frozen=True)
class Routed:
    """One repeat of case M behind a router, replica by replica (``None``: the routing was not found)."""

    conversations: int
    replicas: list[str]
    requests: dict[str, int]  # every round's requests summed
    held: dict[str, list[int]] | None  # the conversations each replica held (constant routing only)
    cold_prefills: int | None  # one per conversation, plus one per request moved away from its history
    moved: int | None
    hits: int | None
    ideal_hits: int  # one server's prediction
    alternatives: int  # further constant routings the counters cannot tell from ``held`` (turns that hit alike)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def routing_of_repeat(run: RunRecord, repeat: int) -> Routed | None:
    """The repeat's routing, or None when its turns hold no per-replica counters."""
    turns = [t for t in run.turns if t.repeat == repeat]
    if not turns or any(t.replica_requests is None for t in turns):
        return None
    names = list(turns[0].replica_requests or {})
    found = all(t.held is not None for t in turns)
    moved = sum(len(t.moved or []) for t in turns) if found else None
    conversations = len(turns[0].prompt_tokens)
    hits = [t.hits for t in turns]
    return Routed(
        conversations=conversations,
        replicas=names,
        requests={n: sum((t.replica_requests or {}).get(n, 0) for t in turns) for n in names},
        held=turns[0].held if found and not moved else None,
        cold_prefills=conversations + moved if moved is not None else None,
        moved=moved,
        hits=None if any(h is None for h in hits) else sum(h for h in hits if h is not None),
        ideal_hits=sum(t.predicted_hits for t in turns),
        alternatives=turns[0].alternatives or 0,
    )


def _replica_lines(turns: list[TurnRecord]) -> list[str]:
    names = list(turns[0].replica_requests or {})
    lines = []
    for name in names:
        held = [t.held.get(name, []) if t.held is not None else None for t in turns]
        constant = all(h == held[0] for h in held)
        convs = (
            ("conversations " + (",".join(map(str, held[0])) or "none")) if constant and held[0] is not None
            else "conversations by turn " + " | ".join("?" if h is None else ",".join(map(str, h)) or "-" for h in held)
        )  # fmt: skip
        per_turn = ", ".join(
            f"t{t.turn} {(t.replica_hits or {}).get(name, '?')}/"
            + (str((t.replica_predicted or {}).get(name)) if t.replica_predicted is not None else "?")
            + f" ({(t.replica_requests or {}).get(name, '?')} req)"
            for t in turns
        )
        lines.append(f"    {name}: {convs}; hits measured/predicted per turn: {per_turn}")
    return lines


def conversation_affinity(run: RunRecord) -> Verdict:
    """Where the conversations of a case M run behind the router landed, and whether the counters and the
    route's promise hold (see the module)."""
    route = run.key.route
    lines = [f"{run.key.id}: conversations behind vllm-router ({route}), replica by replica:"]
    problems: list[str] = []
    numbers: dict[str, Any] = {"route": route, "repeats": []}
    if not run.turns:
        problems.append("the run has no turns (its measurement made no rounds)")
    if run.prediction is None:
        problems.append("no prediction: the replicas reported no KV block size (vllm:cache_config_info)")
    for repeat in sorted({t.repeat for t in run.turns}):
        turns = [t for t in run.turns if t.repeat == repeat]
        head = f"repeat {repeat + 1}"
        routed = routing_of_repeat(run, repeat)
        if routed is None:
            errors = [r.metrics_error for r in run.repeats if r.metrics_error]
            problems.append(
                f"{head}: no per-replica counters (requests and hits of every replica around every round)"
                + (f": {errors[0]}" if errors else "")
            )
            continue
        numbers["repeats"].append(routed.as_dict())
        lines.append(f"  {head}: {routed.conversations} conversations x {len(turns)} turns")
        lines += _replica_lines(turns)
        if routed.alternatives:
            lines.append(
                f"    ({routed.alternatives} other assignments of conversations to replicas explain the counters as "
                "well: conversations whose turns hit alike cannot be told apart by the counters)"
            )
        for t in turns:  # accounting: every request on exactly one replica, the replicas' hits add up
            counts, hits = t.replica_requests or {}, t.replica_hits or {}
            if sum(counts.values()) != len(t.prompt_tokens):
                problems.append(
                    f"{head} turn {t.turn}: the replicas finished {sum(counts.values())} requests "
                    f"({counts}) for the round's {len(t.prompt_tokens)}"
                )
            if t.hits is not None and sum(hits.values()) != t.hits:
                problems.append(f"{head} turn {t.turn}: the replicas' hits {hits} do not add up to {t.hits}")
            if route == "round_robin" and counts and max(counts.values()) - min(counts.values()) > 1:
                problems.append(f"{head} turn {t.turn}: round_robin must spread the round evenly, but {counts}")
        if routed.cold_prefills is None:
            searched = all(t.searched_all is not False for t in turns)
            words = (
                "no routing of the conversations explains every replica's hits in every round"
                + ("" if searched else " within the search's bound (too many conversations x replicas)")
                + ": conversations moved between replicas in ways the counters cannot be matched to, or a replica "
                "lost cached blocks (eviction, preemption); hits measured/predicted by one server per turn: "
                + ", ".join(f"t{t.turn} {t.hits}/{t.predicted_hits}" for t in turns)
            )
            lines.append(f"    {words}")
            if searched or route == "consistent_hash":
                problems.append(f"{head}: {words}")
            continue
        lines.append(
            f"    cold prefills {routed.cold_prefills} for {routed.conversations} conversations: "
            f"{routed.moved} caused by routing (a turn on another replica than its history"
            + ("" if not routed.moved else "; the fewest moves that explain the counters")
            + f"); hits {routed.hits}, one server's prediction {routed.ideal_hits}"
        )
        if route == "consistent_hash":
            if routed.moved:
                moves = "; ".join(f"turn {t.turn}: {t.moved}" for t in turns if t.moved)
                problems.append(
                    f"{head}: consistent_hash on the conversation id must keep each conversation on one replica, but "
                    f"{routed.moved} turns landed away from their history (conversations by turn: {moves}): "
                    f"{routed.cold_prefills} cold prefills for {routed.conversations} conversations"
                )
            for t in turns[1:]:
                if t.hits != t.predicted_hits:
                    problems.append(
                        f"{head} turn {t.turn}: hits {t.hits}, but one server's prediction is {t.predicted_hits} "
                        "(with affinity every turn after the first hits its whole history)"
                    )
    message = "\n".join(lines + [f"- {p}" for p in dict.fromkeys(problems)])
    return Verdict("conversation_affinity", [run.key.id], not problems, message, numbers)
