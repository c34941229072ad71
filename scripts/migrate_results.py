"""Rewrite pytest-apc results files of an older schema_version as the current one, in place.

    python scripts/migrate_results.py FILE...

pytest-apc reads results files of the current schema_version only. Each field a later version added gets
the value the reader of that older version derived from what the file kept, so that
``python -m pytest_apc report FILE`` prints the same table before and after:

- before 4: each repeat's mean TTFT, the mean of its share of the pooled per-request TTFTs (``ttfts_ms``, in
  repeat order, where they split evenly); its median, unknown (null); the GPU model and count, from the
  node's GPUs (``environment.gpus``);
- before 5: the by-source counters of the tiers (``external_tokens``, ``local_hits_predicted``: null) and
  ``hits_all_tiers`` (from the run's counters);
- before 6: each server's ``served_model_name`` ("": not recorded);
- before 7: no answers probe (``answers``: no probes, no error);
- 1: a prediction without ``tolerance_above`` (the window was symmetric: the tolerance below); the pair rows
  of hash-algorithm servers kept their algorithm in the row's name and a ``hash_algo`` field, dropped here;
  ``model_shape`` (a setting added later), "".

A repeat whose counters the file kept only at the run's level (its first) gets them as its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

CURRENT = 9
DELTA_FIELDS = ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "computed_tokens", "cached_tokens",
                "external_tokens", "preemptions", "metric_names")  # fmt: skip


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _shares(values: list[float], k: int) -> list[list[float]] | None:
    if not k or not values or len(values) % k:
        return None
    n = len(values) // k
    return [values[i * n : (i + 1) * n] for i in range(k)]


def _tier_hits(run: dict[str, Any]) -> int | None:
    if run.get("cached_tokens") is not None:
        return int(run["cached_tokens"]) + int(run.get("external_tokens") or 0)
    if run.get("prefix_cache_hits") is None:
        return None
    return int(run["prefix_cache_hits"]) + int(run.get("external_tokens") or 0)


def _run(run: dict[str, Any], version: int) -> None:
    counters = run["repeat_counters"]
    means = [c.get("mean_ttft_ms") for c in counters]
    if not all(_positive(v) for v in means):
        shares = _shares([float(t) for t in run.get("ttfts_ms") or []], len(counters))
        means = [float(np.mean(share)) for share in shares] if shares else [None] * len(counters)
    for i, counter in enumerate(counters):
        counter["mean_ttft_ms"] = means[i]
        counter.setdefault("median_ttft_ms", None)
        if counter.get("delta") is None and i == 0 and run.get("prefix_cache_hits") is not None:
            counter["delta"] = {name: run.get(name) for name in DELTA_FIELDS} | {
                "metric_names": run.get("metric_names") or {}
            }
    if version < 5:
        run.setdefault("external_tokens", None)
        run.setdefault("hits_all_tiers", _tier_hits(run))
        run.setdefault("local_hits_predicted", None)
    if version < 7:
        run.setdefault("answers", {"probes": [], "error": None})
    prediction = run.get("prediction")
    if prediction is not None and "tolerance_above" not in prediction:
        prediction["tolerance_above"] = prediction["tolerance"]


def migrate(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a results document of any schema_version) as the current version writes it."""
    version = int(doc["schema_version"])
    if version >= CURRENT:
        return doc
    for run in doc.get("runs") or []:
        _run(run, version)
    if version < 6:
        for server in doc.get("servers") or []:
            server.setdefault("served_model_name", "")
    env = doc.get("environment")
    if isinstance(env, dict) and "gpu_count" not in env and isinstance(env.get("gpus"), list):
        env["gpu_model"] = ", ".join(sorted(set(map(str, env["gpus"])))) or None
        env["gpu_count"] = len(env["gpus"])
    doc.setdefault("settings", {}).setdefault("model_shape", "")
    for row in doc.get("pairs") or []:
        row.pop("hash_algo", None)  # schema_version 1: the algorithm is in the row's name
    doc["schema_version"] = CURRENT
    return doc


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for name in paths:
        path = Path(name)
        doc = json.loads(path.read_text())
        before = doc.get("schema_version")
        path.write_text(json.dumps(migrate(doc), indent=2) + "\n")
        print(f"{path}: schema_version {before} -> {doc['schema_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
