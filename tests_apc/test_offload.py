"""Cases N/O: the second cache tier. G prefix groups whose working set does not fit a deliberately small
GPU KV cache, on a server without (N) and with (O) a CPU offload tier (vLLM --kv-offloading-size).

Both servers get the same GPU cache, sized from the workload and the model's KV bytes per token; the
tier is sized to hold the working set. Counters are split by source (GPU cache, tier, computed). Not
part of ``-m apc``: select with ``-m offload`` (``--gpu-node`` only: vLLM's CPU build has no tier).
"""

import pytest

from pytest_apc import verdicts

pytestmark = [pytest.mark.offload]


@pytest.mark.apc_cases("O")
def test_hits_across_tiers(apc_run, apc_assert):
    """GPU-cache hits + tier hits = (N - G) x P + (G - 1) x Q, what one server with room for every prefix
    hits; the tier served part of it; a reset that left prefixes in the tier shows as hits above it."""
    apc_assert(verdicts.hits_across_tiers(apc_run))


@pytest.mark.apc_cases("O")
def test_tier_pays_off(apc_pair, apc_assert):
    """With the tier the same small GPU cache hits more, and median TTFT is significantly lower."""
    apc_assert(verdicts.tier_pays_off(apc_pair))


@pytest.mark.apc_cases("NO", sequential=True)
def test_eviction_predicted(apc_run, apc_assert):
    """At concurrency 1 the GPU cache's own hits are a replay of vLLM's block pool (LRU, tail first) over
    the requests in the order they were sent."""
    apc_assert(verdicts.eviction_predicted(apc_run))


@pytest.mark.apc_cases("O")
def test_same_answers(apc_pair, apc_assert):
    """Answers served through the tier (blocks loaded back from CPU memory) agree with the same prompts'
    answers without any cache, and with the no-tier server's."""
    apc_assert(verdicts.same_answers(apc_pair))
