"""Cases C/D: one 32K prefix shared by every request, a 1K unique suffix: the pure APC effect.

C runs on the APC-off server, D on the APC-on server, with byte-identical prompts.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.apc, pytest.mark.pure]


@pytest.mark.apc_cases("C")
def test_apc_really_off(apc_run, apc_assert):
    """The OFF server made no prefix-cache lookups and served no hits."""
    apc_assert(verdicts.apc_really_off(apc_run))


@pytest.mark.apc_cases("D")
def test_cached_tokens(apc_run, apc_assert):
    """The ON server served (N-1) x floor(S/B) x B cached tokens, S = template header + prefix."""
    apc_assert(verdicts.cached_tokens_match(apc_run))


@pytest.mark.apc_cases("D")
def test_pure_apc(apc_pair, apc_assert):
    """D computes only the suffixes (and one prefix), and its median TTFT is significantly lower than C's
    (up to --apc-set pure_gain_concurrency; every level on a GPU node)."""
    apc_assert(verdicts.prefill_saved(apc_pair), verdicts.pure_effect(apc_pair))


@pytest.mark.apc_cases("D")
def test_same_answers(apc_pair, apc_assert):
    """D's answers served from its cache agree with the same prompts' answers without it, and with C's
    (identical, or parting only at a near tie: each token in the other's top-k)."""
    apc_assert(verdicts.same_answers(apc_pair))
