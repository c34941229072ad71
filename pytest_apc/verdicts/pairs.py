"""What verdicts compare: a :class:`Pair` (the OFF and ON run of one pair at one concurrency) and whether two
runs measure the same thing (:func:`not_comparable`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_apc.config import Settings
from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts import figures
from pytest_apc.verdicts.stats import Interval, fit_prefill_cost, prefill_speedup_bound
from pytest_apc.workload.cases import RunKey


@dataclass
class Pair:
    """The OFF and ON run of one pair (A/B, C/D or E/F) at one concurrency, and every other measured run."""

    off: RunRecord
    on: RunRecord
    settings: Settings
    runs: Mapping[RunKey, RunRecord] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.off.key.id}/{self.on.key.id}"

    def ttft_speedup(self) -> Interval:
        """median TTFT OFF / median TTFT ON with its bootstrap interval (> 1: APC is faster)."""
        return figures.ttft_gain(self.off, self.on, self.settings)

    def modelled_ttft_bound(self) -> float | None:
        """The most TTFT can improve for this pair, from a prefill cost model fitted on OFF runs.

        Fitted on the OFF runs measured at concurrency 1 (A, C, E: TTFT is then the prefill of one
        request), T(L) = a*L + b*L^2; the bound is T(L)/(T(L) - T(cached)). None without such runs.
        """
        lengths, seconds = [], []
        for key, run in sorted(self.runs.items()):
            if not key.apc and key.concurrency == 1 and not key.hash_algo:
                lengths.append(float(run.bench["total_input_tokens"]) / run.workload.num_prompts)
                seconds.append(run.median_ms("ttfts") / 1000.0)
        cost = fit_prefill_cost(lengths, seconds)
        p = self.on.prediction
        if cost is None or p is None or self.on.workload.num_prompts < 2:
            return None
        prompt_len = float(self.on.bench["total_input_tokens"]) / self.on.workload.num_prompts
        cached = p.expected_hits / (self.on.workload.num_prompts - 1)
        return prefill_speedup_bound(cost, prompt_len, cached)


# vllm:cache_config_info labels that two comparable servers may differ in: the APC setting itself, and
# what the server measures at start-up (the H200's servers got 58,546 and 58,576 blocks).
CACHE_CONFIG_MAY_DIFFER = {
    "enable_prefix_caching", "prefix_caching_hash_algo", "engine",
    "num_gpu_blocks", "num_cpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency",
}  # fmt: skip
# ... and those that set or size a CPU tier besides kv_offloading_*: the offload case's pair differs in them.
TIER_CONFIG = {"simple_cpu_offload_num_blocks"}


def not_comparable(a: RunRecord, b: RunRecord) -> list[str]:
    """Why two runs that a verdict compares (OFF/ON, default/algorithm) do not measure the same thing:
    other prompts, or servers that differ in more than their APC setting (e.g. --apc-url-on/off
    pointing at different deployments); block size and the rest of the cache come from cache_config_info."""
    problems = []
    tokens_a = [int(r.bench["total_input_tokens"]) for r in a.repeats]
    tokens_b = [int(r.bench["total_input_tokens"]) for r in b.repeats]
    if tokens_a != tokens_b:
        problems.append(f"the benchmark sent other prompts: total input tokens {tokens_a} vs {tokens_b}")
    for label, value_a, value_b in (
        ("vLLM version", a.server.version, b.server.version),
        ("max model length", a.server.max_model_len, b.server.max_model_len),
        ("chat template header tokens", a.server.chat_header_tokens, b.server.chat_header_tokens),
    ):
        if value_a is not None and value_b is not None and value_a != value_b:
            problems.append(f"{label} {value_a} on {a.server.mode} vs {value_b} on {b.server.mode}")
    config_a, config_b = a.server.cache_config, b.server.cache_config
    tier_pair = {a.key.case, b.key.case} == {"N", "O"}  # the offload case compares without and with a tier
    for name in sorted((set(config_a) & set(config_b)) - CACHE_CONFIG_MAY_DIFFER):
        if tier_pair and (name.startswith("kv_offloading") or name in TIER_CONFIG):
            continue
        if config_a[name] != config_b[name]:
            problems.append(
                f"cache config {name}={config_a[name]} on {a.server.mode} vs {config_b[name]} on {b.server.mode}"
            )
    return problems
