"""Key numbers of a test's run as JUnit properties (CI systems show them)."""

from __future__ import annotations

import pytest

from pytest_apc.measure.records import RunRecord


def record_properties(node: pytest.Item, record: RunRecord) -> None:
    """Key numbers as JUnit properties (CI systems show them)."""
    row = record.to_json()
    for name in ("id", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "prefix_cache_hits", "prefix_cache_queries",
                 "hit_ratio", "bench_duration_s", "block_size"):  # fmt: skip
        node.user_properties.append((f"apc_{name}", row[name]))
    node.user_properties.append(("apc_server_log", record.server.log))
