"""Cases M/L: multi-turn conversations. G conversations of T turns share a global prefix; every turn sends
the conversation's whole history (fixed synthetic replies) plus a new user message, one benchmark run per
round (turn t of every conversation), so that the counters give the hits of every turn index.

M runs on the APC-on server, L on the APC-off server. Not part of ``-m apc``: select with ``-m multiturn``.
The small-cache variants (a GPU cache too small to keep every conversation, without and with a CPU offload
tier) start servers of their own and carry the ``offload`` marker too: ``-m "multiturn and not offload"``
leaves them out.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.multiturn]


@pytest.mark.apc_cases("L")
def test_multiturn_apc_off(apc_run, apc_assert):
    """The OFF server made no prefix-cache lookups and served no hits in any turn."""
    apc_assert(verdicts.apc_really_off(apc_run))


@pytest.mark.apc_cases("M")
def test_turn_hits(apc_run, apc_assert):
    """Every turn hits exactly the predicted tokens: each request's longest common prefix with a request
    prefilled before it since the reset, capped at its length - 1, in whole blocks."""
    apc_assert(verdicts.turn_hits_match(apc_run))


@pytest.mark.apc_cases("M", compact=True)
def test_compaction(apc_run, apc_assert):
    """After K turns every history is replaced by a summary: the next turn hits the global prefix only, and
    every turn still hits exactly as predicted."""
    apc_assert(verdicts.turn_hits_match(apc_run))
    apc_assert(verdicts.compaction_hits(apc_run))


@pytest.mark.apc_cases("M")
def test_late_turns_faster(apc_pair, apc_assert):
    """The late turns (the second half), where the history dominates the prompt, get their first token
    significantly sooner with APC than without, up to --apc-set multiturn_gain_concurrency; above it, no later."""
    apc_assert(verdicts.late_turn_ttft(apc_pair))


@pytest.mark.offload
@pytest.mark.apc_cases("M", tiers=True)
def test_turn_hits_across_tiers(apc_run, apc_assert):
    """On a GPU cache too small for every conversation, each turn's GPU hits are a replay of vLLM's block pool
    (concurrency 1), and a CPU tier serves exactly what the GPU cache lost (without one, nothing)."""
    apc_assert(verdicts.turn_hits_across_tiers(apc_run))
