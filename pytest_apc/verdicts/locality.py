"""Where a fleet's requests landed, read from each replica's counters: requests, hits and cold prefills.

A replica that served k requests, c of them the first of their prefix group *on that replica*, hits
(k - c) * P + (c - 1) * Q tokens on a cold cache (``Prediction.replica_hits``; P: a group's shared blocks,
Q: the template header's). So each replica's cold prefills follow from its own counters, without router
internals, and the fleet's total C is compared with the ideal G (one per group) and with what the route
promises. Every extra cold prefill computes P - Q prompt tokens a better route would have served from a
cache: the routing cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_apc.measure.records import MeasurementError, Repeat, RunRecord
from pytest_apc.serving.metrics import Delta
from pytest_apc.workload.cases import DATA_PARALLEL, EXTERNAL_FLEET, Prediction, RunKey

# What each route promises about where requests land, checked against the counters.
PROMISES = {
    "round_robin": "requests spread evenly: replicas differ by at most one request",
    "consistent_hash": "one routing key, one replica: every request of the run on the same replica",
}
# What a gateway run elsewhere may promise (--apc-set fleet_promise): the two outcomes above, loosened to hold
# for a gateway that balances by load (spread) or routes by prefix or session with many groups (affinity).
GATEWAY_PROMISES = {
    "spread": "requests spread over the replicas: no replica left idle (each serves at least one request)",
    "affinity": "every prefix group on one replica: cold prefills C = prefix groups G",
}
NO_PROMISE = {
    "cache_aware": "routes to the replica whose cache matches best unless load is imbalanced (no fixed outcome)",
    DATA_PARALLEL: "vLLM's data-parallel balancer routes by load (no fixed outcome)",
    EXTERNAL_FLEET: "routed by the external router or gateway, no promise declared (no fixed outcome)",
}


@dataclass(frozen=True)
class ReplicaCount:
    """One replica (or data-parallel engine) during one repeat."""

    name: str
    requests: int
    queries: int
    hits: int
    cold_prefills: int | None  # None: the prefix spans no block beyond the header, so it cannot be told
    unexplained: int  # hits minus what `cold_prefills` explains (0 on an exact match)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Locality:
    """One repeat of a fleet run, replica by replica."""

    route: str
    replicas: list[ReplicaCount]
    num_prompts: int
    prediction: Prediction

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.replicas)

    @property
    def hits(self) -> int:
        return sum(r.hits for r in self.replicas)

    @property
    def cold_prefills(self) -> int | None:
        counts = [r.cold_prefills for r in self.replicas]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def ideal(self) -> int:
        """One cold prefill per prefix group: every group served by one replica."""
        return self.prediction.prefix_groups

    @property
    def active_replicas(self) -> int:
        """A: the replicas that served at least one request."""
        return sum(1 for r in self.replicas if r.requests)

    @property
    def extra_prefill_tokens(self) -> int | None:
        """Prompt tokens computed that one server would have served from its cache: (C - G) x (P - Q) for
        the groups split across replicas, plus (A - 1) x Q for the header each further replica computes."""
        cold = self.cold_prefills
        if cold is None:
            return None
        p = self.prediction
        split = (cold - self.ideal) * (p.group_tokens - p.header_block_tokens)
        return split + max(0, self.active_replicas - 1) * p.header_block_tokens

    @property
    def routing_cost(self) -> float | None:
        """The extra prefill as a share of what APC saves on one server (``Prediction.expected_hits``)."""
        extra, ideal_hits = self.extra_prefill_tokens, self.prediction.expected_hits
        return None if extra is None or ideal_hits <= 0 else extra / ideal_hits

    def tolerance(self, requests: int) -> int:
        """How far one replica's hits may miss whole cold prefills: a block per request (tokenisation at
        the prefix/suffix boundary), under half a group's blocks so that the count stays unambiguous."""
        p = self.prediction
        half_group = max(0, (p.group_tokens - p.header_block_tokens) // 2 - 1)
        return min(requests * p.block_size, half_group)

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "replicas": [r.as_dict() for r in self.replicas],
            "requests": self.requests,
            "hits": self.hits,
            "cold_prefills": self.cold_prefills,
            "ideal_cold_prefills": self.ideal,
            "extra_prefill_tokens": self.extra_prefill_tokens,
            "routing_cost": self.routing_cost,
            "ideal_hits": self.prediction.expected_hits,
        }


def of_repeat(run: RunRecord, repeat: Repeat) -> Locality:
    """The locality of one repeat; a MeasurementError when the counters to tell it are missing."""
    p = run.prediction
    if p is None:
        raise MeasurementError(
            f"cannot account for the fleet run {run.key.id}: no prediction (block size "
            f"{run.block_size or 'unknown'}, chat header: {run.server.chat_header_error or 'not measured'})"
        )
    repeat.require_counters(run.key.id, run.server.mode)
    if not repeat.parts:
        raise MeasurementError(
            f"cannot account for the fleet run {run.key.id}: its counters came from one source, not per replica "
            "(a data-parallel server whose /metrics has no engine label, or a fleet of one)"
        )
    counts = []
    for name, d in repeat.parts.items():  # in the fleet's order: replica 1, 2, ..., 10 (or engine 0, 1, ...)
        counts.append(_count(run.key.id, name, d, p))
    return Locality(run.key.route, counts, run.workload.num_prompts, p)


def _count(run_id: str, name: str, d: Delta, p: Prediction) -> ReplicaCount:
    if d.requests is None:
        raise MeasurementError(
            f"cannot account for the fleet run {run_id}: {name} has no vllm:request_success_total counter, so "
            "the requests it served are unknown"
        )
    hits, queries = int(d.prefix_cache_hits or 0), int(d.prefix_cache_queries or 0)
    cold, unexplained = p.cold_prefills(d.requests, hits)
    return ReplicaCount(name, d.requests, queries, hits, cold, unexplained)


def held_to(key: RunKey, gateway_promise: str) -> str:
    """The promise a fleet run is held to: its router policy's (a key of PROMISES), or for an external fleet
    the gateway's --apc-set fleet_promise (a key of GATEWAY_PROMISES); "" for none."""
    if key.mode.fleet == EXTERNAL_FLEET:
        return "" if gateway_promise == "none" else gateway_promise
    return key.route if key.route in PROMISES else ""


def promise_text(key: RunKey, promise: str) -> str:
    """What ``promise`` (from ``held_to``) says, or why the route has none."""
    if promise in GATEWAY_PROMISES:
        return f"{promise} (--apc-set fleet_promise): {GATEWAY_PROMISES[promise]}"
    if promise:
        return PROMISES[promise]
    if key.mode.fleet == EXTERNAL_FLEET:
        return NO_PROMISE[EXTERNAL_FLEET]
    return NO_PROMISE.get(key.route, "no fixed outcome")


def promise_problems(locality: Locality, promise: str) -> list[str]:
    """What ``promise`` (from ``held_to``) said and the counters contradict; [] when kept or when "" (none)."""
    counts = [r.requests for r in locality.replicas]
    served = ", ".join(f"{r.name} {r.requests}" for r in locality.replicas)
    if promise == "round_robin" and max(counts) - min(counts) > 1:
        return [f"round_robin must spread requests evenly, but the replicas served {counts}"]
    if promise == "consistent_hash" and sum(1 for c in counts if c) > 1:
        return [f"consistent_hash with one routing key must use one replica, but requests spread as {counts}"]
    if promise == "spread":
        idle = [r.name for r in locality.replicas if not r.requests]
        if idle:
            return [
                f"spread: no replica may be left idle, but {' and '.join(idle)} served none of the "
                f"{locality.requests} requests (requests per replica: {served})"
            ]
    if promise == "affinity":
        cold = locality.cold_prefills
        if cold is None:
            return ["affinity cannot be checked: the shared prefix spans no block beyond the template header, so "
                    "cold prefills cannot be told from hits (see fleet_accounting)"]  # fmt: skip
        if cold > locality.ideal:
            each = ", ".join(f"{r.name} {r.cold_prefills} ({r.requests} requests)" for r in locality.replicas)
            return [
                f"affinity: every prefix group must stay on one replica, but {cold} cold prefills were computed for "
                f"{locality.ideal} prefix group(s): {cold - locality.ideal} more than one per group, so groups were "
                f"split across replicas; cold prefills per replica: {each}"
            ]
    return []


def cost_problems(locality: Locality, max_percent: float | None) -> list[str]:
    """The routing cost above --apc-set max_routing_cost (percent), or untellable while a bound is set."""
    if max_percent is None:
        return []
    cost, extra = locality.routing_cost, locality.extra_prefill_tokens
    if cost is None or extra is None:
        return [f"the routing cost cannot be told (no cold prefills or nothing APC saves), so "
                f"--apc-set max_routing_cost={max_percent:g}% cannot be checked"]  # fmt: skip
    if cost * 100 > max_percent:
        return [
            f"routing cost {cost:.2%} is above --apc-set max_routing_cost={max_percent:g}%: {extra:,} extra prefill "
            f"tokens of the {locality.prediction.expected_hits:,} APC saves on one server "
            f"({locality.cold_prefills} cold prefills for {locality.ideal} prefix group(s))"
        ]
    return []
