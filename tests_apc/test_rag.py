"""Cases E/F: a 32K prefix shared by every request and a 32K unique suffix (agent/RAG shape).

APC can at best skip the prefix's prefill, about half the tokens and less than half the attention work,
so 5-10x is the wrong bar here: the verdicts compare with bounds computed from the workload.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.apc, pytest.mark.rag]


@pytest.mark.apc_cases("E")
def test_apc_really_off(apc_run, apc_assert):
    """The OFF server made no prefix-cache lookups and served no hits."""
    apc_assert(verdicts.apc_really_off(apc_run))


@pytest.mark.apc_cases("F")
def test_cached_tokens(apc_run, apc_assert):
    """The ON server served (N-1) x floor(S/B) x B cached tokens, S = template header + prefix."""
    apc_assert(verdicts.cached_tokens_match(apc_run))


@pytest.mark.apc_cases("F")
def test_rag_apc(apc_pair, apc_assert):
    """F computes about half of E's prefill; at high concurrency it must not be slower (TTFT is queueing)."""
    apc_assert(verdicts.prefill_saved(apc_pair), verdicts.rag_effect(apc_pair))


@pytest.mark.apc_cases("F")
def test_same_answers(apc_pair, apc_assert):
    """F's answers served from its cache agree with the same prompts' answers without it, and with E's."""
    apc_assert(verdicts.same_answers(apc_pair))
