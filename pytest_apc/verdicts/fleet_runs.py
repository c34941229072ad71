"""The verdicts on a fleet run (case R behind a router): the books balance replica by replica
(``fleet_accounting``) and the requests landed where the route promises (``prefix_locality``)."""

from __future__ import annotations

from pytest_apc.config import Settings
from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts import figures, locality
from pytest_apc.verdicts.verdict import Repeats, Verdict


def fleet_accounting(run: RunRecord) -> Verdict:
    """A fleet run's books balance replica by replica: every request reached exactly one replica (none
    dropped, none retried), every prompt token was looked up, and each replica's hits are whole cold
    prefills: (k - c) x P + (c - 1) x Q for its k requests and c groups first seen there."""
    judged = Repeats()
    for repeat in run.repeats:
        found = locality.of_repeat(run, repeat)
        p = found.prediction
        problems = []
        tokens = int(repeat.bench["total_input_tokens"])
        queries = sum(r.queries for r in found.replicas)
        if found.requests != found.num_prompts:
            problems.append(
                f"the replicas finished {found.requests} requests for the benchmark's {found.num_prompts}: the "
                f"router {'retried or duplicated' if found.requests > found.num_prompts else 'dropped'} requests"
            )
        if queries != tokens:
            problems.append(f"the replicas looked up {queries:,} prompt tokens, the benchmark sent {tokens:,}")
        for r in found.replicas:
            if r.cold_prefills is None:
                problems.append(
                    f"{r.name}: the shared prefix ({p.shared_prefix_tokens} tokens with the template) spans no block "
                    f"of {p.block_size} beyond the template header, so cold prefills cannot be told from hits"
                )
            elif abs(r.unexplained) > found.tolerance(r.requests):
                problems.append(
                    f"{r.name}: hits {r.hits:,} are no whole number of cold prefills: {r.requests} requests with "
                    f"{r.cold_prefills} cold would hit {p.replica_hits(r.requests, r.cold_prefills):,} "
                    f"(off by {r.unexplained:+,}, allowed ±{found.tolerance(r.requests):,}); "
                    "diagnosis: a cache that was not cold, evictions, or prompts other than the prediction's"
                )
        line = (
            f"{run.key.id}: "
            + "; ".join(
                f"{r.name} {r.requests} requests, {r.hits:,} hits = {r.cold_prefills} cold prefill(s)"
                + (f" {r.unexplained:+,}" if r.unexplained else "")
                for r in found.replicas
            )
            + f" (P = {p.group_tokens:,} tokens per group hit, Q = {p.header_block_tokens} header tokens)"
        )
        judged.add(line, found.as_dict(), problems)
    return judged.verdict("fleet_accounting", [run.key.id])


def prefix_locality(run: RunRecord, settings: Settings) -> Verdict:
    """Cold prefills C against the ideal G (one per prefix group) and against what the route promises;
    the routing cost as extra prefill tokens and as a share of what APC saves on one replica. Fails when
    the route broke its promise (round_robin: even spread; consistent_hash with one key: one replica; an
    external fleet: its --apc-set fleet_promise), when the routing cost exceeds --apc-set max_routing_cost, and
    when the replicas' counters do not hold the benchmark's requests (nothing to tell locality from)."""
    judged = Repeats()
    promise = locality.held_to(run.key, settings.fleet_promise)
    for repeat in figures.judged_localities(run, settings):
        found, cost = repeat.found, repeat.found.routing_cost
        line = (
            f"{run.key.id}: {found.cold_prefills} cold prefills for {found.ideal} prefix group(s) across "
            f"{len(found.replicas)} replicas (ideal {found.ideal}); hits {found.hits:,} of the "
            f"{found.prediction.expected_hits:,} one server would serve"
            + (
                f"; routing cost {found.extra_prefill_tokens:,} extra prefill tokens = {cost:.1%} of what APC saves"
                if cost is not None
                else ""
            )
        )
        judged.add(line, found.as_dict(), repeat.problems)
    return judged.verdict(
        "prefix_locality",
        [run.key.id],
        f"{run.key.route}: {locality.promise_text(run.key, promise)}",
        promise=promise or None,
        max_routing_cost=settings.max_routing_cost,
    )
