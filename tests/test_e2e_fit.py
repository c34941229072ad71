"""End to end against real vLLM: the APC suite on a model whose context is too short for its lengths, fitted
as a user's 32K model is. The CPU profile measures at 1/16 of the full lengths, so the tiny-32k shape (the
tiny model with a context of 2,288 tokens: 32768 / 16, and the chat template's room, which is not scaled) is
to it what a 32K-context model is to the full workload: A-F need up to 4,320 tokens there, and the suite
scales every length by 1/2, as on a 32K model, says so above the table and in results.json, and passes.
One server pair, one repeat."""

from __future__ import annotations

import json

import pytest

from tests.conftest import TESTS_APC

pytestmark = pytest.mark.e2e

LINE = (
    "lengths scaled by 1/2 to fit a 2,288-token context (max_position_embeddings 2288 in the tiny-32k shape): "
    "length scale 0.03125 in place of 0.0625 (set --apc-length-scale to choose one)"
)


def test_the_suite_passes_on_a_32k_context_shape_fitted_by_scaling(tmp_path) -> None:
    from tests.conftest import InnerRun

    args = [str(TESTS_APC), "-m", "apc and not sweep", "--cpu-node", "--apc-model-shape=tiny-32k", "-rA",
            f"--apc-results-dir={tmp_path}/apc-results"]  # fmt: skip
    inner = InnerRun(args, tmp_path, timeout=1800).wait()
    try:
        assert inner.ret == 0, inner.output[-20000:]
        assert " failed" not in inner.output.splitlines()[-1]
        assert f"FITTED TO THE CONTEXT: {LINE}" in inner.output  # at collection, before any server starts
        table = inner.output.split("apc validation", 1)[1]
        assert f"\n{LINE}\n" in table
        (path,) = tmp_path.glob("apc-results/*/results.json")
        data = json.loads(path.read_text())
        assert data["fit"]["rule"] == "scaled"
        assert data["fit"]["summary"] == LINE
        assert data["settings"]["length_scale"] == 0.03125
        assert data["server_launches"] == {"apc-off": 1, "apc-on": 1}
        assert all(server["max_model_len"] == 2288 for server in data["servers"])  # E/F's 2288 exactly
        runs = {run["id"]: run for run in data["runs"]}
        assert sorted(runs) == ["A-c8", "B-c8", "C-c8", "D-c8", "E-c8", "F-c8"]
        assert (runs["D-c8"]["prefix_len"], runs["D-c8"]["suffix_len"]) == (1024, 32)  # 32768 and 1024 x 1/32
        assert (runs["F-c8"]["prefix_len"], runs["F-c8"]["suffix_len"]) == (1000, 1024)  # 32000 and 32768 x 1/32
        assert data["verdicts"]
        assert all(v["passed"] for v in data["verdicts"]), [v["message"] for v in data["verdicts"] if not v["passed"]]
        hits = next(v for v in data["verdicts"] if v["name"] == "cached_tokens_match" and "D-c8" in v["runs"])
        assert hits["passed"]  # the prediction, from the scaled lengths, held on the real server
        assert f"**{LINE}**" in (path.parent / "summary.md").read_text()
    finally:
        inner.require_nothing_left()
