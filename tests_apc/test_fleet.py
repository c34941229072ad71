"""Case R: prefix groups sent through a router to several replicas, where routing decides APC's payoff.

A request can only hit the prefix blocks of the replica it lands on. One run per route (each
--apc-set router_policies policy on the same replicas behind vllm-router, vLLM's data-parallel balancer with
--apc-set data_parallel_size, or an external fleet with --apc-fleet-url), every replica's cache reset before
it, every replica's counters read around it. Not part of ``-m apc``: select with ``-m fleet``.

Case M behind the router (``test_multiturn_affinity``) runs on the same replicas: ``-m fleet`` measures
both, ``-m fleet -k multiturn`` only M; it is not a ``multiturn`` test, so ``-m multiturn`` starts no fleet.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.fleet]


@pytest.mark.apc_cases("R", fleet=True)
def test_fleet_accounting(apc_run, apc_assert):
    """Each request reached one replica once, and each replica's hits are whole cold prefills."""
    apc_assert(verdicts.fleet_accounting(apc_run))


@pytest.mark.apc_cases("R", fleet=True)
def test_prefix_locality(apc_run, apc_settings, apc_assert):
    """Cold prefills against one per prefix group and against the route's promise; the routing cost."""
    apc_assert(verdicts.prefix_locality(apc_run, apc_settings))


@pytest.mark.apc_cases("R", fleet=True)
def test_same_answers(apc_run, apc_assert):
    """Through the router, answers served from a replica's cache agree with the same prompts' answers
    computed without it (a cache_salt of their own)."""
    apc_assert(verdicts.same_answers(apc_run))


@pytest.mark.apc_cases("M", fleet=True)
def test_multiturn_affinity(apc_run, apc_assert):
    """Case M's conversations through the router, one run per policy, each conversation id its routing key:
    which conversations each replica held, its hits turn by turn as predicted, and the cold prefills the
    routing caused; consistent_hash must give one cold prefill per conversation."""
    apc_assert(verdicts.conversation_affinity(apc_run))
