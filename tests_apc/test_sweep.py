"""The concurrency sweep: C/D and E/F again at every level of --apc-set sweep_concurrency (1, 2, 4, 8).

In vLLM V1 blocks are registered when scheduled, so the cached tokens must not depend on concurrency:
every level is held to the same prediction. The default level's runs are shared with the case tests.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.apc, pytest.mark.sweep]


@pytest.mark.apc_cases("CE", sweep=True)
def test_apc_really_off(apc_run, apc_assert):
    """The OFF server counts nothing at any concurrency."""
    apc_assert(verdicts.apc_really_off(apc_run))


@pytest.mark.apc_cases("DF", sweep=True)
def test_cached_tokens_independent_of_concurrency(apc_run, apc_assert):
    """The same predicted hits at every concurrency."""
    apc_assert(verdicts.cached_tokens_match(apc_run))


@pytest.mark.apc_cases("D", sweep=True)
def test_pure_apc(apc_pair, apc_assert):
    """The pure APC effect holds at every concurrency."""
    apc_assert(verdicts.prefill_saved(apc_pair), verdicts.pure_effect(apc_pair))


@pytest.mark.apc_cases("F", sweep=True)
def test_rag_apc(apc_pair, apc_assert):
    """Agent/RAG: a significant TTFT gain at low concurrency, never slower above it."""
    apc_assert(verdicts.prefill_saved(apc_pair), verdicts.rag_effect(apc_pair))


@pytest.mark.apc_cases("DF", sweep=True)
def test_same_answers(apc_pair, apc_assert):
    """At every concurrency, answers served from the cache agree with the OFF twin's and the uncached ones."""
    apc_assert(verdicts.same_answers(apc_pair))
