"""The matrix and the expected hit count."""

from __future__ import annotations

import pytest

from pytest_apc import config
from pytest_apc.workload.cases import FAMILIES, RunKey, Workload, predict, workload_for
from pytest_apc.workload.fit import longest, request_tokens


def test_run_key_ids_round_trip() -> None:
    for text in ("D-c8", "A-c1", "F-c4-xxhash"):
        assert RunKey.parse(text).id == text
    with pytest.raises(ValueError, match="not a run id"):
        RunKey.parse("G-c8")


def test_pairs() -> None:
    assert RunKey("D", 8).pair() == (RunKey("C", 8), RunKey("D", 8))
    assert RunKey("E", 2).pair() == (RunKey("E", 2), RunKey("F", 2))
    assert RunKey("B", 8, "sha256_cbor").pair() == (RunKey("A", 8), RunKey("B", 8, "sha256_cbor"))


def test_prediction_of_the_review_h200_numbers() -> None:
    # 30 x (32K prefix + 1K suffix), block 16, template header of 0 tokens: 29 x 32768 = 950,272.
    w = Workload("pure", 32768, 1024, 256, 30, 0)
    p = predict(w, header_tokens=0, block_size=16, total_input_tokens=30 * (32768 + 1024))
    assert p.expected_hits == 950_272
    assert p.tolerance == 29 * 16
    assert p.computed_tokens_on == 30 * (32768 + 1024) - 950_272
    assert p.prefill_bound == pytest.approx(30 * 33792 / (30 * 33792 - 950_272))


def test_prediction_counts_the_template_header_in_whole_blocks() -> None:
    w = Workload("pure", 2048, 64, 16, 30, 0)
    # 26 header tokens + 2048 = 2074 -> 16 whole blocks of 128.
    assert predict(w, 26, 128, 64263).expected_hits == 29 * 2048
    # Header alone spanning one block of 16 gives hits without a shared prefix (case B).
    assert predict(Workload("overhead", 0, 2048, 16, 30, 0), 26, 16, 0).expected_hits == 29 * 16


def test_longest_request_is_the_longest_family(pytester: pytest.Pytester) -> None:
    settings = config.resolve(pytester.parseconfig("--cpu-node"), environ={})
    lengths = {f: workload_for(f, settings).prompt_len + workload_for(f, settings).output_len for f in FAMILIES}
    # CPU profile, scale 1/16: rag = 2000 prefix + 2048 input + 16 output.
    assert lengths["rag"] == 4064
    assert request_tokens(longest(settings)[1]) == max(lengths.values()) == 4064
    assert longest(settings) == ("rag", workload_for("rag", settings))


def test_kv_working_set_holds_each_shared_prefix_once() -> None:
    """With APC the header's blocks are held once and each prefix group's own blocks once per group in flight;
    without APC every request holds all its blocks."""
    one = Workload("pure", prefix_len=2048, suffix_len=64, output_len=16, num_prompts=30, seed=0)
    assert one.kv_working_set(8, 26, 128, apc=False) == (136, "concurrency 8 x 17 blocks per request")
    assert one.kv_working_set(8, 26, 128, apc=True) == (
        24, "concurrency 8 x 1 blocks per request + 16 shared prefix blocks held once"
    )  # fmt: skip
    groups = Workload("fleet", 2048, 64, 16, 32, 0, prefix_groups=4)  # header 1 block, 16 more per group
    assert groups.kv_working_set(8, 200, 128, apc=True)[0] == 8 * 2 + 1 + 4 * 16  # 19 blocks a request, 17 shared
    assert groups.kv_working_set(2, 200, 128, apc=True)[0] == 2 * 2 + 1 + 2 * 16  # 2 groups in flight at most
    no_shared_block = Workload("overhead", 0, 2048, 16, 30, 0)
    assert no_shared_block.kv_working_set(8, 26, 128, apc=True) == no_shared_block.kv_working_set(8, 26, 128, False)
