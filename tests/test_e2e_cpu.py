"""End to end against real vLLM: the APC suite (tests_apc) on vLLM's CPU build with the generated tiny
model, exactly as a user runs it with ``pytest -m apc --cpu-node``. This is the evidence that the
plugin's verdicts hold on a real server. Minutes, not seconds: one file, so xdist keeps it on one worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TESTS_APC

pytestmark = pytest.mark.e2e


def results(root: Path) -> dict:
    files = sorted(root.glob("apc-results/*/results.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One real run of the whole APC suite, shared by the assertions below."""
    from tests.conftest import InnerRun

    root = tmp_path_factory.mktemp("e2e-full")
    args = [str(TESTS_APC), "-m", "apc", "--cpu-node", "-v", "-rA", f"--apc-results-dir={root}/apc-results"]
    inner = InnerRun(args, root, timeout=3000).wait()
    yield inner, results(root)
    left = inner.leftovers()
    for proc in left:
        proc.kill()
    assert not left, f"left behind: {[p.cmdline() for p in left]}"


def test_suite_passes_on_a_healthy_server(full_run) -> None:
    inner, _ = full_run
    assert inner.ret == 0, inner.output[-20000:]
    assert " failed" not in inner.output.splitlines()[-1]


def test_one_launch_per_mode(full_run) -> None:
    _, data = full_run
    assert data["server_launches"] == {"apc-off": 1, "apc-on": 1}


def test_every_verdict_recorded_and_passed(full_run) -> None:
    _, data = full_run
    names = {v["name"] for v in data["verdicts"]}
    assert names == {"bench_clean", "apc_really_off", "cached_tokens_match", "prefill_saved", "ttft_gain", "not_slower"}
    assert all(v["passed"] for v in data["verdicts"])


def test_hits_do_not_depend_on_concurrency(full_run) -> None:
    _, data = full_run
    runs = {r["id"]: r for r in data["runs"]}
    for case in "DF":
        hits = {runs[f"{case}-c{c}"]["prefix_cache_hits"] for c in (1, 2, 4, 8)}
        assert len(hits) == 1, (case, hits)
    assert {r["case"] for r in data["runs"]} == set("ABCDEF")


def test_pure_hits_are_29_times_the_block_aligned_prefix(full_run) -> None:
    _, data = full_run
    runs = {r["id"]: r for r in data["runs"]}
    on, off = runs["D-c8"], runs["C-c8"]
    block = on["block_size"]
    shared = on["header_tokens"] + on["prefix_len"]
    assert block == 128  # vLLM's CPU default, read from cache_config_info
    assert on["prefix_cache_hits"] == 29 * (shared // block) * block
    assert on["prefix_cache_queries"] == on["total_input_tokens"]
    assert off["prefix_cache_hits"] == 0
    assert off["prefix_cache_queries"] == 0


def test_results_file_has_what_the_issue_lists(full_run) -> None:
    _, data = full_run
    for server in data["servers"]:
        for name in (
            "mode",
            "command",
            "block_size",
            "num_gpu_blocks",
            "prefix_caching_hash_algo",
            "kv_cache_size_tokens",
            "kv_cache_line",
            "startup_s",
        ):
            assert server[name] is not None, name
        assert server["kv_cache_line"].startswith("CPU KV cache size:")
    for run in data["runs"]:
        for name in (
            "case",
            "apc",
            "concurrency",
            "num_prompts",
            "prefix_len",
            "suffix_len",
            "output_len",
            "completed",
            "failed",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_e2el_ms",
            "input_throughput",
            "output_throughput",
            "prefix_cache_queries",
            "prefix_cache_hits",
            "block_size",
            "bench_command",
            "bench_duration_s",
            "wall_s",
        ):
            assert run[name] is not None, (run["id"], name)
        assert Path(run["bench_result_file"]).is_file()
    assert data["timing"]["suite_elapsed_s"] > data["timing"]["server_lifecycle_s"] > 0


def test_subset_starts_only_what_it_needs(tmp_path) -> None:
    from tests.conftest import InnerRun

    args = [str(TESTS_APC), "-m", "pure and not sweep", "--cpu-node", f"--apc-results-dir={tmp_path}/apc-results"]
    inner = InnerRun(args, tmp_path, timeout=900).wait()
    assert inner.ret == 0, inner.output[-5000:]
    data = results(tmp_path)
    assert data["server_launches"] == {"apc-off": 1, "apc-on": 1}
    assert {r["case"] for r in data["runs"]} == {"C", "D"}
    assert not inner.leftovers()


def test_off_server_that_is_not_off_is_refused(tmp_path) -> None:
    """A real vLLM told --enable-prefix-caching after the plugin's --no-enable-prefix-caching runs with APC:
    the OFF server must be refused before anything is measured on it."""
    from tests.conftest import InnerRun

    args = [str(TESTS_APC), "-m", "pure and not sweep", "--cpu-node", "--apc-server-arg=--enable-prefix-caching",
            f"--apc-results-dir={tmp_path}/apc-results"]  # fmt: skip
    inner = InnerRun(args, tmp_path, timeout=900).wait()
    assert inner.ret == 1
    assert "apc-off server reports vllm:cache_config_info{enable_prefix_caching='True'}" in inner.output
    assert "does not run in the mode it was started for" in inner.output
    assert "--no-enable-prefix-caching --enable-prefix-caching" in inner.output  # the command line
    assert not inner.leftovers()
