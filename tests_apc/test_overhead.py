"""Cases A/B: no shared prefix, 32K unique tokens per request: what APC costs when it cannot help.

A runs on the APC-off server, B on the APC-on server, with byte-identical prompts. B may hit only what
the chat template puts in front of every prompt (when that spans a whole block).
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.apc, pytest.mark.overhead]


@pytest.mark.apc_cases("A")
def test_apc_really_off(apc_run, apc_assert):
    """The OFF server made no prefix-cache lookups and served no hits."""
    apc_assert(verdicts.apc_really_off(apc_run))


@pytest.mark.apc_cases("B")
def test_cached_tokens(apc_run, apc_assert):
    """Without a shared prefix the ON server hits at most the template header's whole blocks."""
    apc_assert(verdicts.cached_tokens_match(apc_run))


@pytest.mark.apc_cases("B")
def test_apc_overhead(apc_pair, apc_assert):
    """A ~ B: APC on is not slower than off beyond --apc-set overhead_tolerance (TTFT interval, duration)."""
    apc_assert(verdicts.not_slower(apc_pair))


@pytest.mark.apc_cases("B")
def test_same_answers(apc_pair, apc_assert):
    """B's answers served from its cache agree with the same prompts' answers without it, and with A's."""
    apc_assert(verdicts.same_answers(apc_pair))
