"""/metrics parsing with prometheus_client and per-run deltas."""

from __future__ import annotations

import pytest

from pytest_apc.serving import metrics

BEFORE = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0
# HELP vllm:prefix_cache_queries_created created
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# HELP vllm:prompt_tokens_by_source_total by source
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 90.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 10.0
# HELP vllm:cache_config_info info
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="1000"} 1.0
"""
AFTER = (
    BEFORE.replace("} 100.0", "} 1100.0")
    .replace('engine="1",model_name="m"} 50.0', 'engine="1",model_name="m"} 550.0')
    .replace('hits_total{engine="0",model_name="m"} 10.0', 'hits_total{engine="0",model_name="m"} 810.0')
    .replace('source="local_compute"} 90.0', 'source="local_compute"} 790.0')
    .replace('source="local_cache_hit"} 10.0', 'source="local_cache_hit"} 810.0')
)


def test_counters_are_summed_over_engines_and_created_ignored() -> None:
    snap = metrics.parse(BEFORE)
    assert snap.counter("prefix_cache_queries") == 150.0
    assert snap.counter("prefix_cache_hits") == 10.0
    assert not any(name.endswith("_created") for name, _ in snap.samples)


def test_cache_config_labels() -> None:
    snap = metrics.parse(BEFORE)
    assert snap.cache_config["block_size"] == "16"
    assert snap.cache_config["enable_prefix_caching"] == "True"


def test_delta_of_counters_and_sources() -> None:
    d = metrics.delta(metrics.parse(BEFORE), metrics.parse(AFTER))
    assert d.prefix_cache_queries == 1500
    assert d.prefix_cache_hits == 800
    assert d.computed_tokens == 700
    assert d.cached_tokens == 800
    assert d.hit_ratio == pytest.approx(800 / 1500)
    assert d.missing() == []
    assert d.metric_names["prefix_cache_hits"] == "vllm:prefix_cache_hits_total"


STARTED = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}\n"


def test_a_restart_between_the_scrapes_is_named_not_counted() -> None:
    """A restarted server's counters begin again from zero: after - before would be garbage (or negative)."""
    before = metrics.parse(STARTED.format("1.7e+09") + BEFORE)
    assert metrics.delta(before, metrics.parse(STARTED.format("1.7e+09") + AFTER)).prefix_cache_hits == 800
    with pytest.raises(metrics.MetricsError, match=r"the server restarted during the run \(process_start_time_seconds "
                       r"1700000000.00 -> 1700000060.00\)"):  # fmt: skip
        metrics.delta(before, metrics.parse(STARTED.format("1.70000006e+09") + AFTER))


def test_counters_that_went_backwards_are_a_restart_even_without_a_start_time() -> None:
    with pytest.raises(metrics.MetricsError) as err:
        metrics.delta(metrics.parse(AFTER), metrics.parse(BEFORE))
    assert "the server restarted during the run (counters went backwards: prefix_cache_queries by 1,500, " in str(
        err.value
    )


def test_the_replica_that_restarted_is_named() -> None:
    """In a fleet the sum over replicas can still rise while one replica began again from zero."""
    up = metrics.parse(BEFORE)
    before = metrics.merge({"replica 1": up, "replica 2": up})
    after = metrics.merge(
        {"replica 1": metrics.parse(AFTER), "replica 2": metrics.parse(BEFORE.replace("} 100.0", "} 0.0"))}
    )
    assert metrics.delta(before, after).prefix_cache_queries == 1400  # the sum alone would not tell
    with pytest.raises(metrics.MetricsError) as err:
        metrics.part_deltas(before, after)
    assert "replica 2 restarted during the run (counters went backwards: prefix_cache_queries by 100" in str(err.value)


def test_older_gpu_prefixed_names_are_the_fallback() -> None:
    old_before = BEFORE.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    old_after = AFTER.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    d = metrics.delta(metrics.parse(old_before), metrics.parse(old_after))
    assert d.prefix_cache_hits == 800
    assert d.metric_names["prefix_cache_hits"] == "vllm:gpu_prefix_cache_hits_total"


def test_missing_counters_are_none_never_zero() -> None:
    text = '# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine="0"} 5.0\n'
    d = metrics.delta(metrics.parse(text), metrics.parse(text.replace("5.0", "9.0")))
    assert d.prefix_cache_hits is None
    assert d.prefix_cache_queries is None
    assert d.hit_ratio is None
    assert d.prompt_tokens == 4
    assert d.missing() == ["prefix_cache_queries", "prefix_cache_hits"]


@pytest.mark.parametrize("garbage", ["<html>oops</html>\x00\x01 {{{", "", 'vllm:x{a="b" 1\nvllm:y{{{ 2'])
def test_garbage_is_a_metrics_error(garbage: str) -> None:
    with pytest.raises(metrics.MetricsError):
        metrics.parse(garbage)
