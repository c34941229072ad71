"""A vLLM general plugin that makes the prefix cache serve wrong content, or save no time, while every counter
stays right.

Test-only: ``tests/test_e2e_fault.py`` installs it into a real vLLM server through a throw-away
distribution (an entry point of the ``vllm.general_plugins`` group on the server's PYTHONPATH). The fault
is chosen by ``PYTEST_APC_TEST_FAULT``:

- ``shift``: each cache hit of two blocks or more gets its blocks shifted by one (the first block twice,
  the last one left out): the scheduler counts the same hit tokens, but the block table maps them to other
  content, so the model reads other tokens' keys and values, as a block-table or hash bug would make it.
- ``shift-under-load``: the same, but only while another request holds blocks (is running or waiting with
  its blocks allocated), as a race between requests would corrupt a cache: a request sent alone, like a
  probe after the run, gets the right content.
- ``slow-hit``: every hit is served right and counted right, but costs the engine as long as computing its
  tokens would (``PYTEST_APC_TEST_FAULT_HIT_US`` microseconds per hit token, 60 by default: about what a
  2-core CPU takes to compute one with the tiny model), as a cache whose blocks come back by a slow copy
  would: APC that hits exactly and saves no prefill time. Only the timing shows it.

Counters and the reset stay exactly as on a healthy server; so does the timing, except under ``slow-hit``.
(Blocks merely reordered would not do: the keys carry their positions, and attention over a set of keys
does not depend on where they are stored.)
"""

from __future__ import annotations

import os
import sys
from typing import Any

FAULT_ENV = "PYTEST_APC_TEST_FAULT"
SHAPES = ("shift", "shift-under-load", "slow-hit")
HIT_US_ENV = "PYTEST_APC_TEST_FAULT_HIT_US"
DEFAULT_HIT_US = 60


def seconds_per_hit_token(environ: Any = os.environ) -> float:
    """What ``slow-hit`` holds the engine for each hit token."""
    return float(environ.get(HIT_US_ENV) or DEFAULT_HIT_US) / 1e6


def _others_hold_blocks(manager: Any, request_id: str) -> bool:
    """Whether a request other than ``request_id`` holds KV blocks on this engine now."""
    return any(
        any(rid != request_id for rid in single.req_to_blocks) for single in manager.coordinator.single_type_managers
    )


def register() -> None:
    shape = os.environ.get(FAULT_ENV)
    if shape not in SHAPES:
        return
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    print(f"pytest-apc test fault active: {shape} (pid {os.getpid()})", file=sys.stderr, flush=True)

    if getattr(KVCacheManager.get_computed_blocks, "_apc_fault", False):
        return
    original = KVCacheManager.get_computed_blocks
    if shape == "slow-hit":
        _slow_every_hit(KVCacheManager, original, seconds_per_hit_token())
        return

    # vLLM 0.33 passes a cache-hit length limit after the request: take whatever follows it along.
    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        if shape == "shift-under-load" and not _others_hold_blocks(self, request.request_id):
            return result
        blocks = result[0]
        groups = tuple([g[0], *g[:-1]] if len(g) >= 2 else g for g in blocks.blocks)
        return (type(blocks)(groups), *result[1:])

    get_computed_blocks._apc_fault = True  # type: ignore[attr-defined]
    KVCacheManager.get_computed_blocks = get_computed_blocks  # type: ignore[method-assign]


def _slow_every_hit(manager_class: Any, original: Any, seconds_per_token: float) -> None:
    """Hand the scheduler its hit, after holding the engine as long as computing the hit's tokens takes."""
    import time

    def get_computed_blocks(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        time.sleep(result[1] * seconds_per_token)
        return result

    get_computed_blocks._apc_fault = True  # type: ignore[attr-defined]
    manager_class.get_computed_blocks = get_computed_blocks
