"""The offload case: sizes from the model's KV bytes per token, the verdicts on both tiers, and vLLM's
re-queue over-count named rather than blamed on APC. Records are built by hand (vLLM's CPU build has no
offload tier); the H200 run is in docs/results/h200-offload."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_apc import verdicts
from pytest_apc.measure.records import MeasurementError, Repeat, RunRecord
from pytest_apc.measure.repeat import note_tier
from pytest_apc.serving import metrics
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.metrics import Delta
from pytest_apc.verdicts import tiers
from pytest_apc.workload import offload
from pytest_apc.workload.cases import OFFLOAD_TIER, SMALL_CACHE, RunKey, ServerMode, Workload, predict
from tests.conftest import FAKE_VLLM

LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 4096, "torch_dtype": "bfloat16"}  # fmt: skip
WORKLOAD = Workload("offload", 32768, 1024, 64, 28, 0, 4)
HEADER, TOKENS = 26, 947_023


def test_kv_bytes_per_token_follow_the_config_and_the_kv_dtype() -> None:
    assert offload.kv_bytes_per_token(LLAMA_8B) == 2 * 32 * 8 * 128 * 2 == 131_072  # 128 KiB
    assert offload.kv_bytes_per_token(LLAMA_8B, ("--kv-cache-dtype", "fp8_e4m3")) == 65_536
    assert offload.kv_bytes_per_token({**LLAMA_8B, "torch_dtype": "float32"}) == 262_144
    assert offload.kv_bytes_per_token({**LLAMA_8B, "torch_dtype": "float32"}, ("--dtype=bfloat16",)) == 131_072
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert offload.kv_bytes_per_token(mla) == 61 * 576 * 2
    with pytest.raises(offload.OffloadSizeError, match="num_hidden_layers"):
        offload.kv_bytes_per_token({"hidden_size": 4096})


def test_sizes_hold_one_request_on_the_gpu_and_the_working_set_in_the_tier() -> None:
    sizes = offload.sizes(WORKLOAD, LLAMA_8B, (), 256)
    assert sizes.request_blocks == -(-(256 + 33_792 + 64) // 16) == 2132
    assert sizes.gpu_blocks == 3198  # 1.5 requests: one fits, two groups do not
    assert sizes.gpu_blocks * 16 < 2 * (256 + 32_768)
    # Every group's prefix and every request's own blocks, 1.5 times, in whole GiB.
    assert sizes.working_set_tokens == 4 * (256 + 32_768) + 28 * 1104
    assert sizes.tier_gib == 30.0
    assert sizes.tier_tokens >= sizes.working_set_tokens
    assert sizes.warnings(tier=True) == []
    assert sizes.server_args(ServerMode(True, cache=SMALL_CACHE)) == ("--num-gpu-blocks-override", "3198")
    assert sizes.server_args(ServerMode(True, cache=OFFLOAD_TIER)) == (
        "--num-gpu-blocks-override", "3198", "--kv-offloading-size", "30",
    )  # fmt: skip


def test_every_tensor_parallel_rank_holds_a_kv_head() -> None:
    """The tier holds what the ranks hold: at least one KV head each; one copy of an MLA latent (vLLM 0.33)."""
    assert offload.kv_bytes_per_token(LLAMA_8B, ("--tensor-parallel-size", "8")) == 131_072  # 8 heads, 8 ranks
    assert offload.kv_bytes_per_token(LLAMA_8B, ("-tp", "16")) == 2 * 131_072  # 8 heads on 16 ranks: copies
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert offload.kv_bytes_per_token(mla, ("--tensor-parallel-size=8",)) == 61 * 576 * 2


TINY = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 24,
        "hidden_size": 96, "torch_dtype": "float32"}  # fmt: skip


def test_the_tier_holds_whole_blocks_each_rounded_up_to_a_page() -> None:
    per_token = offload.kv_bytes_per_token(TINY)
    assert per_token == 2 * 3 * 1 * 24 * 4 == 576
    sizes = offload.OffloadSizes(per_token, 16, 10, 15, 100_000, 1.0, page_bytes=4096)
    assert sizes.block_bytes == 12_288  # 9,216 bytes of KV in a block of 16 tokens, rounded up to 3 pages
    assert sizes.tier_tokens == 2**30 // 12_288 * 16 == 1_398_096
    assert sizes.tier_tokens < 2**30 // per_token  # what bytes per token alone would promise
    assert offload.OffloadSizes.of(sizes.as_dict()) == sizes
    # A derived tier is sized in those rounded blocks, so it still holds 1.5 working sets.
    derived = offload.sizes(WORKLOAD, TINY, (), 256)
    assert derived.tier_tokens >= 1.5 * derived.working_set_tokens


def test_the_tier_the_server_reports_is_the_one_diagnosed() -> None:
    """vLLM 0.33+ says what its tier allocated (vllm:kv_offload_config_info, after the first request): the run
    records it, and a shortfall is explained with it rather than with the GiB it was given."""
    text = (
        "# HELP vllm:kv_offload_config_info Information of the KV offloading configuration\n"
        "# TYPE vllm:kv_offload_config_info gauge\n"
        'vllm:kv_offload_config_info{cpu_blocks_per_chunk="1",cpu_kv_cache_size_bytes="3355443200",'
        'cpu_kv_cache_size_tokens="None",cpu_num_chunks="1600",engine="0",model_name="m"} 1.0\n'
    )
    after = metrics.parse(text)
    assert after.offload_config["cpu_num_chunks"] == "1600"
    short = run("O", 1, 274_864, 456_560)
    sizes = offload.OffloadSizes.of(short.server.offload)
    assert sizes.tier_tokens >= sizes.working_set_tokens  # 30 GiB, as worked out, holds it all
    note_tier(short.server, after)
    told = offload.OffloadSizes.of(short.server.offload)
    assert told.reported_tier_tokens == told.tier_tokens == 1600 * 16
    assert told.tokens_short == sizes.working_set_tokens - 25_600
    result = tiers.hits_across_tiers(short)
    assert not result.passed
    assert "the CPU tier holds 25,600 tokens, less than the working set of 163,008" in result.message
    # Chunks of the server's blocks: a backend that chose 64-token blocks has four times the tokens.
    assert sizes.reported(after.offload_config, 64).tier_tokens == 1600 * 64
    # Labels that do not say (an older or another connector) change nothing.
    assert sizes.reported({"engine": "0"}) is sizes


def test_a_tier_too_small_is_a_warning_that_states_the_tokens_short() -> None:
    sizes = offload.sizes(WORKLOAD, LLAMA_8B, (), 256, tier_gib=16)
    (warning,) = sizes.warnings(tier=True)
    short = sizes.working_set_tokens - 16 * 2**30 // 131_072
    assert f"holds {16 * 2**30 // 131_072:,} tokens" in warning
    assert f"{short:,} short" in warning
    assert sizes.warnings(tier=False) == []  # the server without a tier has nothing to be short of
    roomy = offload.sizes(WORKLOAD, LLAMA_8B, (), 256, gpu_blocks=20_000)
    assert any("holds the whole working set" in w for w in roomy.warnings(tier=False))


RESET = "POST /reset_prefix_cache?reset_external=true -> HTTP 200"


def run(
    case: str, concurrency: int, local: int, tier: int, *, queries: int = 0, ttft_ms: float = 300.0, reset: str = RESET
) -> RunRecord:
    computed = TOKENS - local - tier
    d = Delta(queries or TOKENS, local, TOKENS, computed, local, tier, 0, {})
    rng = np.random.default_rng(concurrency + ord(case))
    bench = {"completed": 28, "failed": 0, "total_input_tokens": TOKENS, "duration": 10.0, "median_ttft_ms": ttft_ms,
             "ttfts": list(rng.normal(ttft_ms, ttft_ms * 0.05, 28) / 1000)}  # fmt: skip
    mode = ServerMode(True, cache=OFFLOAD_TIER if case == "O" else SMALL_CACHE)
    info = ServerInfo(mode.name, [], "", "/tmp/x.log", block_size=16, num_gpu_blocks=3000,
                      offload=offload.sizes(WORKLOAD, LLAMA_8B, (), 256).as_dict())  # fmt: skip
    record = RunRecord(
        RunKey(case, concurrency),
        WORKLOAD,
        info,
        [Repeat(bench, d, None, reset, "r.json", "cmd")],
        HEADER,
        1.0,
    )
    record.prediction = predict(WORKLOAD, HEADER, 16, TOKENS)
    return record


def test_hits_across_tiers_are_one_servers_prediction() -> None:
    expected = 24 * 32_784 + 3 * 16
    assert predict(WORKLOAD, HEADER, 16, TOKENS).expected_hits == expected == 786_864
    good = tiers.hits_across_tiers(run("O", 1, 274_864, expected - 274_864))
    assert good.passed, good.message
    assert "786,864 = 274,864 from the GPU cache + 512,000 from the CPU tier" in good.message


def test_no_tier_hits_fail_naming_the_tier() -> None:
    result = tiers.hits_across_tiers(run("O", 1, 274_864, 0))
    assert not result.passed
    assert "the CPU tier served nothing" in result.message
    assert "short of the prediction" in result.message


def test_a_tier_that_survived_the_reset_is_named() -> None:
    # Every group's first request hit the tier too: 4 more prefixes than a cold server.
    warm = 786_864 + 4 * 32_784 - 3 * 16
    result = tiers.hits_across_tiers(run("O", 8, 288_928, warm - 288_928, reset="POST /reset_prefix_cache -> 200"))
    assert not result.passed
    assert "prefixes survived the reset" in result.message
    assert "LMCache" in result.message


def test_a_tier_too_small_explains_hits_short() -> None:
    short = run("O", 1, 274_864, 456_560)
    short.server.offload = offload.sizes(WORKLOAD, LLAMA_8B, (), 256, tier_gib=16).as_dict()
    result = tiers.hits_across_tiers(short)
    assert not result.passed
    assert "less than the working set" in result.message


def test_the_tier_pays_off_when_it_hits_more_and_ttft_falls(pytester: pytest.Pytester) -> None:
    from pytest_apc import config

    s = config.resolve(pytester.parseconfig("--cpu-node"), environ={})
    without, with_tier = run("N", 1, 274_864, 0, ttft_ms=1309.0), run("O", 1, 274_864, 512_000, ttft_ms=280.0)
    result = tiers.tier_pays_off(verdicts.Pair(without, with_tier, s))
    assert result.passed, result.message
    same = tiers.tier_pays_off(verdicts.Pair(without, run("O", 1, 274_864, 0, ttft_ms=1309.0), s))
    assert not same.passed
    assert "the tier did not add hits" in same.message
    assert "not significant" in same.message


def test_eviction_is_judged_exactly_against_the_replay() -> None:
    record = run("N", 1, 274_864, 0)
    record.local_hits_predicted = 274_864
    assert tiers.eviction_predicted(record).passed
    record.local_hits_predicted = 274_848
    result = tiers.eviction_predicted(record)
    assert not result.passed
    assert "+16" in result.message
    record.local_hits_predicted = None
    with pytest.raises(MeasurementError, match="cannot replay the block pool"):
        tiers.eviction_predicted(record)


def test_tiers_cannot_be_told_apart_without_the_by_source_counters() -> None:
    record = run("O", 1, 274_864, 512_000)
    d = record.repeats[0].delta
    assert d is not None
    record.repeats[0] = Repeat(
        record.bench, Delta(TOKENS, 274_864, TOKENS, None, None, None, 0, {}), None, None, "r", "c"
    )
    with pytest.raises(MeasurementError, match="prompt_tokens_by_source"):
        tiers.hits_across_tiers(record)


def test_the_re_queue_over_count_is_named_not_blamed_on_apc() -> None:
    # O-c8 on the H200: queries and hits counted every retry of a waiting request.
    over = Delta(54_453_903, 9_256_048, TOKENS, 160_159, 288_928, 497_936, 0, {})
    note = verdicts.overcount(over, TOKENS)
    assert note is not None
    assert "43736" in note
    assert "not APC misbehaving" in note
    assert verdicts.overcount(Delta(TOKENS, 1, TOKENS, TOKENS - 1, 1, 0, 0, {}), TOKENS) is None
    # Without the by-source counters nothing shows the prompts were counted right: no excuse.
    assert verdicts.overcount(Delta(54_453_903, 9_256_048, TOKENS, None, None, None, 0, {}), TOKENS) is None
    record = run("O", 8, 288_928, 497_936, queries=54_453_903)
    result = tiers.hits_across_tiers(record)
    assert result.passed, result.message
    assert "note: prefix-cache queries 54,453,903" in result.message


# -- the whole offload case against fake servers with a bounded GPU cache and a tier ---------------------

OFFLOAD_SUITE = Path(__file__).parent.parent / "tests_apc" / "test_offload.py"


def offload_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[pytest.RunResult, dict]:
    pytester.makepyfile(test_offload=OFFLOAD_SUITE.read_text())
    # --gpu-node takes the node's GPU lock in the temp folder: a folder of its own, so that another test's
    # --gpu-node run on a parallel worker is not refused while this one holds it.
    own_tmp = pytester.path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(own_tmp))
    # A subprocess: the generated model's tokenizer imports torch, which cannot be imported twice in one process.
    result = pytester.runpytest_subprocess(
        "--gpu-node", "--apc-model-shape=llama-3.1-8b",
        f"--apc-set=server_command={{python}} {FAKE_VLLM}", "--apc-server-arg=--fake-model-tokenizer",
        "--apc-set=num_prompts=8", "--apc-length-scale=0.02", "--apc-set=startup_timeout=20",
        "--apc-set=stop_timeout=3",
        "--apc-results-dir=res", "-p", "no:randomly", "-k", "not tier_pays_off", *extra,
    )  # fmt: skip
    (path,) = Path(pytester.path, "res").glob("*/results.json")
    return result, json.loads(path.read_text())


def test_hits_across_tiers_through_fake_servers(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin launches both servers with the sizes it derives, and the accounting holds end to end; the
    fake's GPU cache is a plain LRU, not vLLM's block pool, and the eviction verdict says so. Concurrency 1
    only: at 8 the fake's threads admit the requests in whatever order they arrive, so which hits come from
    its GPU cache and which from its tier (all of them from the GPU, in one CI run) is not the plugin's doing."""
    result, doc = offload_run(pytester, monkeypatch, "--apc-set=offload_concurrency=1")
    result.assert_outcomes(passed=2, failed=2, deselected=1)  # same_answers passes on the fake, too
    result.stdout.fnmatch_lines(["*N-c1: GPU-cache hits*replay of vLLM's block pool*", "*not the LRU order replayed*"])
    servers = {s["mode"]: s for s in doc["servers"]}
    tier, small = servers["apc-on-offload-tier"], servers["apc-on-small-cache"]
    blocks = str(tier["offload"]["gpu_blocks"])
    assert tier["command"][tier["command"].index("--num-gpu-blocks-override") + 1] == blocks
    assert "--kv-offloading-size" in tier["command"]
    assert "--kv-offloading-size" not in small["command"]
    runs = {r["id"]: r for r in doc["runs"]}
    # One row per run in the offload table (not the OFF/ON pair table), in the file and on the terminal.
    assert [row["id"] for row in doc["offload"]] == ["N-c1", "O-c1"]
    assert not any(row["pair"] == "N/O" for row in doc["pairs"])
    result.stdout.fnmatch_lines(
        ["offload (cases N/O, 4 prefix groups)*", "case*GPU hits*tier hits*", "*O*1*CPU 1 GiB*"]
    )
    assert runs["O-c1"]["external_tokens"] > 0
    assert runs["O-c1"]["hits_all_tiers"] == runs["O-c1"]["prediction"]["expected_hits"]
    assert runs["N-c1"]["external_tokens"] == 0
    assert runs["N-c1"]["hits_all_tiers"] < runs["O-c1"]["hits_all_tiers"]  # the small cache evicted


def test_a_tier_that_keeps_its_prefixes_through_the_reset_fails_by_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = offload_run(
        pytester,
        monkeypatch,
        "--apc-server-arg=--fake-tier-survives-reset",
        "--apc-set=offload_tier_gib=0.001",
        "-k",
        "across_tiers",
    )
    result.assert_outcomes(passed=1, failed=1, deselected=6)  # O-c1 ran first, on a tier nothing had filled yet
    result.stdout.fnmatch_lines(["*hits * exceed the prediction by *", "*diagnosis: prefixes survived the reset*"])
    result.stdout.fnmatch_lines(["*the CPU tier of 0.001 GiB holds * tokens*short of the working set*"])


def test_offload_settings_without_an_offload_test_are_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_offload=OFFLOAD_SUITE.read_text())
    result = pytester.runpytest("--cpu-node", "--apc-set=offload_groups=5", "-m", "pure", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*--apc-set offload_groups=5*no selected test measures the offload tier*"])


def test_offload_tests_skip_on_the_cpu_build_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_offload=OFFLOAD_SUITE.read_text())
    result = pytester.runpytest("--cpu-node", "-m", "offload", "-rs", "-p", "no:randomly")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *vLLM's CPU build has no KV offload tier*--gpu-node"])


def test_the_pair_without_and_with_a_tier_may_differ_in_what_sets_the_tier() -> None:
    without, with_tier = run("N", 1, 274_864, 0), run("O", 1, 274_864, 512_000)
    without.server.cache_config.update(
        kv_offloading_size="None", simple_cpu_offload_num_blocks="None", cache_dtype="auto"
    )
    with_tier.server.cache_config.update(
        kv_offloading_size="30", simple_cpu_offload_num_blocks="15360", cache_dtype="auto"
    )
    assert verdicts.not_comparable(without, with_tier) == []
    with_tier.server.cache_config["cache_dtype"] = "fp8"
    assert verdicts.not_comparable(without, with_tier) == [
        "cache config cache_dtype=auto on apc-on-small-cache vs fp8 on apc-on-offload-tier"
    ]
