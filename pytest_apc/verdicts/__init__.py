"""The verdicts: what a test asserts about measured runs, each a pass or a fail with a message.

Modules: what a verdict is and its per-repeat bookkeeping (``verdict``); the OFF/ON pair and whether two
runs are comparable (``pairs``); the numbers a verdict judges and a report row shows, computed once on every
repeat (``figures``); the verdicts on one run's counters (``runs``), on a pair's prefill and timing
(``timing``), on a hash algorithm (``hash_algo``), on a fleet run (``fleet_runs``); why a verdict failed
(``diagnoses``); whether cached answers are the computed ones (``answers``), the offload tier's (``tiers``),
the multi-turn case's (``multiturn``), where a fleet's requests landed (``locality``), where case M's
conversations landed behind the router (``affinity``) and the statistics behind the timing verdicts
(``stats``).
The suite's tests import this package: ``from pytest_apc import verdicts`` then ``verdicts.pure_effect(pair)``.

Layer: above ``measure``; may import ``measure``, ``serving``, ``workload``, ``config`` and ``redaction``.
"""

from __future__ import annotations

from pytest_apc.verdicts.affinity import conversation_affinity
from pytest_apc.verdicts.answers import same_answers
from pytest_apc.verdicts.diagnoses import overcount
from pytest_apc.verdicts.fleet_runs import fleet_accounting, prefix_locality
from pytest_apc.verdicts.hash_algo import same_as_default
from pytest_apc.verdicts.multiturn import compaction_hits, late_turn_ttft, turn_hits_across_tiers, turn_hits_match
from pytest_apc.verdicts.pairs import Pair, not_comparable
from pytest_apc.verdicts.runs import apc_really_off, cached_tokens_match
from pytest_apc.verdicts.tiers import eviction_predicted, hits_across_tiers, tier_pays_off
from pytest_apc.verdicts.timing import not_slower, prefill_saved, pure_effect, rag_effect, ttft_gain
from pytest_apc.verdicts.verdict import Verdict

__all__ = [
    "Pair",
    "Verdict",
    "apc_really_off",
    "cached_tokens_match",
    "compaction_hits",
    "conversation_affinity",
    "eviction_predicted",
    "fleet_accounting",
    "hits_across_tiers",
    "late_turn_ttft",
    "not_comparable",
    "not_slower",
    "overcount",
    "prefill_saved",
    "prefix_locality",
    "pure_effect",
    "rag_effect",
    "same_answers",
    "same_as_default",
    "tier_pays_off",
    "ttft_gain",
    "turn_hits_across_tiers",
    "turn_hits_match",
]
