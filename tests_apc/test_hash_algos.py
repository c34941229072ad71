"""Prefix-caching hash algorithms (--apc-hash-algos sha256,sha256_cbor,xxhash,xxhash_cbor).

Each listed algorithm gets its own APC-on server (one launch each); its ON runs are compared with the
default server's: the algorithm names blocks differently but must cache exactly the same ones, at a cost
within --apc-set overhead_tolerance.
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.apc, pytest.mark.hash_algo]


@pytest.mark.apc_cases("D", hash_algos=True)
def test_cached_tokens(apc_run, apc_assert):
    """The algorithm's server hits exactly as predicted."""
    apc_assert(verdicts.cached_tokens_match(apc_run))


@pytest.mark.apc_cases("BDF", hash_algos=True)
def test_same_as_default(apc_run, apc_default_run, apc_settings, apc_assert):
    """Same cached tokens as the default algorithm, TTFT and duration within tolerance."""
    apc_assert(verdicts.same_as_default(apc_run, apc_default_run, apc_settings))


@pytest.mark.apc_cases("BDF", hash_algos=True)
def test_same_answers(apc_run, apc_assert):
    """Under each hash algorithm, answers served from the cache agree with the same prompts' answers
    computed without it (a cache_salt of their own) on the same server."""
    apc_assert(verdicts.same_answers(apc_run))
