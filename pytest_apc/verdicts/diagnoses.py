"""Why a verdict failed: the likeliest cause of too few or too many cache hits, and of vLLM's prefix-cache
counters over-counting, from what was measured."""

from __future__ import annotations

from pytest_apc.measure.records import RunRecord
from pytest_apc.serving.metrics import Delta
from pytest_apc.workload.cases import Prediction


def overcount(d: Delta, input_tokens: int) -> str | None:
    """Why prefix-cache queries exceed the prompt tokens, when the by-source counters show the prompts
    were counted right: vLLM up to 0.26 recorded a lookup each time the scheduler tried to admit a waiting
    request, so under KV-cache pressure a request that waited was counted again (vLLM issue 43736; later
    versions count at admission, pull request 45202). None when the counters agree, or cannot tell."""
    if d.prefix_cache_queries is None or d.prefix_cache_queries <= input_tokens:
        return None
    sources = (d.computed_tokens, d.cached_tokens)
    if any(v is None for v in sources) or sum(v or 0 for v in sources) + (d.external_tokens or 0) != input_tokens:
        return None
    return (
        f"prefix-cache queries {d.prefix_cache_queries:,} (hits {d.prefix_cache_hits or 0:,}) exceed the "
        f"{input_tokens:,} prompt tokens: vLLM's re-queue over-count (up to vLLM 0.26, a request that waited for "
        "KV-cache space was looked up and counted again on every try; vLLM issue 43736, fixed by pull request "
        "45202), not APC misbehaving; prompt_tokens_by_source adds up to the prompt tokens and is what is judged"
    )


def window_text(p: Prediction) -> str:
    if p.tolerance == p.tolerance_above:
        return f"+/- {p.tolerance:,}"
    return f"-{p.tolerance:,}/+{p.tolerance_above:,}"


def diagnose_extra_hits(run: RunRecord, hits: int) -> str:
    """More hits than a cold cache can give: what was cached before the run."""
    p = run.prediction
    assert p is not None
    per_request = p.shared_blocks * p.block_size
    if per_request and abs(hits - (p.expected_hits + per_request)) <= p.tolerance_above:
        return (
            f"the cache was warm: {hits:,} is about N x {per_request:,} (every request hit the prefix, the first "
            f"one too), as when the prefix cache was not reset before the run or an offloaded KV tier (e.g. "
            f"--kv-transfer-config) kept the prefix; check the reset lines of the run and the server's arguments"
        )
    return (
        "the prompts shared more than the predicted prefix: check the dataset arguments (prefix and suffix "
        "lengths, number of prefixes) against the workload"
    )


def diagnose_short_hits(run: RunRecord, d: Delta | None) -> str:
    """The likeliest cause of too few hits, from what was measured; the most direct evidence first (no
    lookups, preemptions, KV-cache capacity, block size)."""
    info = run.server
    p = run.prediction
    causes = []
    if d is not None and d.prefix_cache_queries == 0:
        causes.append(
            f"APC is off on the server: it made no prefix-cache lookups "
            f"(cache_config_info enable_prefix_caching={info.cache_config.get('enable_prefix_caching')!r})"
        )
    if d is not None and d.preemptions:
        causes.append(f"{d.preemptions} preemptions during the run: blocks were freed and recomputed")
    if p is not None and info.num_gpu_blocks is not None and info.block_size:
        working_set, words = run.workload.kv_working_set(
            run.key.concurrency, run.header_tokens, info.block_size, run.key.apc
        )
        if working_set > info.num_gpu_blocks:
            causes.append(
                f"KV-cache capacity: {words} = {working_set} blocks > the server's {info.num_gpu_blocks} (evictions)"
            )
    if p is not None and p.shared_blocks == 0:
        causes.append(
            f"block size {p.block_size} is larger than the shared prefix of {p.shared_prefix_tokens} tokens: "
            "no whole block can be shared"
        )
    if not causes:
        causes.append(
            "the prompts did not share the predicted prefix: check that the benchmark generated identical "
            "prefixes (dataset, seed, tokenizer) and that the server's tokenizer matches the client's"
        )
    return "; ".join(causes)
