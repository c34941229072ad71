"""Strict validation of vLLM benchmark results, and identical arguments for ON and OFF."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_apc.measure import bench
from pytest_apc.workload.cases import RunKey, Workload

GOOD = {"completed": 30, "failed": 0, "total_input_tokens": 1000, "duration": 1.5, "median_ttft_ms": 12.0}
WORKLOAD = Workload("pure", 2048, 64, 16, 30, 0)


def write(tmp_path: Path, payload) -> Path:
    path = tmp_path / "r.json"
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def validate(tmp_path: Path, path: Path) -> dict:
    log = tmp_path / "bench.log"
    log.write_text("Starting main benchmark run...\nUserWarning: All requests failed. Check the server.\n")
    return bench.validate(path, 30, "python -m pytest_apc.measure.bench --x", log)


def test_good_result_passes(tmp_path: Path) -> None:
    assert validate(tmp_path, write(tmp_path, GOOD))["completed"] == 30


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (None, "wrote no result file"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "holds list, not an object"),
        ({**GOOD, "median_ttft_ms": None}, "no numeric 'median_ttft_ms'"),
        ({**GOOD, "failed": 3, "completed": 27, "errors": ["HTTP 400 Bad Request"] * 3},
         "completed 27 of 30, failed 3"),
        ({**GOOD, "completed": 29}, "completed 29 of 30, failed 0"),
    ],
)  # fmt: skip
def test_bad_results_fail_with_command_and_log(tmp_path: Path, payload, message: str) -> None:
    path = tmp_path / "missing.json" if payload is None else write(tmp_path, payload)
    with pytest.raises(bench.BenchError) as err:
        validate(tmp_path, path)
    text = str(err.value)
    assert message in text
    assert "re-run: python -m pytest_apc.measure.bench --x" in text
    assert "All requests failed" in text  # the benchmark's own error line


def test_request_errors_are_quoted(tmp_path: Path) -> None:
    payload = {**GOOD, "failed": 1, "completed": 29, "errors": ["", "Bad Request: prompt too long"]}
    with pytest.raises(bench.BenchError, match="prompt too long"):
        validate(tmp_path, write(tmp_path, payload))


D8 = RunKey("D", 8)


def args_for(url: str, name: str, key: RunKey = D8) -> list[str]:
    return bench.bench_args(
        WORKLOAD, key, base_url=url, model="/m", tokenizer="", served_model_name="apc-model",
        result_dir=Path("/r"), result_filename=name,
    )  # fmt: skip


def test_on_and_off_differ_only_in_url_and_file() -> None:
    """C (on the APC-off server) and D (APC on) send byte-identical prompts: same workload, same flags."""
    on = args_for("http://127.0.0.1:1", "D-c8.json", RunKey("D", 8))
    off = args_for("http://127.0.0.1:2", "C-c8.json", RunKey("C", 8))
    diff = [(a, b) for a, b in zip(on, off, strict=True) if a != b]
    assert diff == [("http://127.0.0.1:1", "http://127.0.0.1:2"), ("D-c8.json", "C-c8.json")]


def test_no_warmups_no_ready_check_and_saved_result() -> None:
    argv = args_for("http://h:1", "x.json")
    assert argv[argv.index("--num-warmups") + 1] == "0"
    assert argv[argv.index("--ready-check-timeout-sec") + 1] == "0"
    assert "--save-result" in argv
    assert argv[argv.index("--backend") + 1] == "openai-chat"
    assert argv[argv.index("--endpoint") + 1] == "/v1/chat/completions"
    assert argv[argv.index("--request-rate") + 1] == "inf"


def test_reproduce_command_is_runnable_module() -> None:
    command = bench.reproduce_command(["--num-prompts", "3"])
    assert "-m pytest_apc.measure.bench --num-prompts 3" in command
    assert "vllm bench serve --num-prompts 3" in command


def test_without_a_model_the_tokenizer_names_the_model() -> None:
    """Servers run elsewhere measured with --apc-tokenizer alone: the benchmark's --model (its result's
    model_id) is the tokenizer, never an empty word on the command line."""
    argv = bench.bench_args(
        WORKLOAD, D8, base_url="http://h:1", model="", tokenizer="org/tok", served_model_name="served",
        result_dir=Path("/r"), result_filename="x.json",
    )  # fmt: skip
    assert argv[argv.index("--model") + 1] == "org/tok"
    assert argv[argv.index("--tokenizer") + 1] == "org/tok"
    assert argv[argv.index("--served-model-name") + 1] == "served"


def test_a_salted_run_sends_each_request_with_a_cache_salt_of_its_own() -> None:
    """The salted reference: the worker takes its own option out of vLLM's arguments and gives every
    request a salt of its own through the benchmark's per-request overrides, keeping any it had."""
    from dataclasses import dataclass

    from pytest_apc.measure.bench_worker import SALT_OPTION, salted, split_salt

    argv, salt = split_salt(["--num-prompts", "3", SALT_OPTION, "run-1", "--seed", "0"])
    assert (argv, salt) == (["--num-prompts", "3", "--seed", "0"], "run-1")
    assert split_salt(["--seed", "0"]) == (["--seed", "0"], None)

    @dataclass
    class Sample:  # vLLM's SampleRequest, as far as the worker reads it
        prompt: str
        request_overrides: dict | None = None

    samples = salted([Sample("a"), Sample("b", {"tools": []})], "run-1")
    assert [s.request_overrides for s in samples] == [{"cache_salt": "run-1-0"}, {"tools": [], "cache_salt": "run-1-1"}]

    @dataclass
    class Old:  # a vLLM whose benchmark has no per-request overrides
        prompt: str

    with pytest.raises(RuntimeError, match="no per-request overrides"):
        salted([Old("a")], "run-1")


def test_a_salted_run_is_reproduced_by_the_plugins_command_alone() -> None:
    from pytest_apc.measure.bench import SALT_OPTION, reproduce_command

    plain = reproduce_command(["--seed", "0"])
    assert "pytest_apc.measure.bench --seed 0" in plain
    assert "(equivalent: vllm bench serve --seed 0)" in plain
    salted = reproduce_command(["--seed", "0", SALT_OPTION, "s"])
    assert salted.endswith(f"pytest_apc.measure.bench --seed 0 {SALT_OPTION} s")
    assert "vllm bench serve" not in salted  # vLLM's own command line cannot salt each request


def test_a_run_keeping_its_answers_asks_each_request_for_token_ids_with_logprobs() -> None:
    """The per-request rule's inputs: the worker takes its own option out of vLLM's arguments, asks every
    request (through the per-request overrides, keeping any it had) for its tokens as ids with top-k
    logprobs, and gives each a request id of its own where the dataset did not, by which it keeps the answer."""
    from dataclasses import dataclass

    from pytest_apc.measure.bench_worker import LOGPROBS_OPTION, split_option, with_logprobs

    assert split_option(["--seed", "0", LOGPROBS_OPTION, "5"], LOGPROBS_OPTION) == (["--seed", "0"], "5")

    @dataclass
    class Sample:
        prompt: str
        request_id: str | None = None
        request_overrides: dict | None = None

    asked = {"logprobs": True, "top_logprobs": 5, "return_tokens_as_token_ids": True}
    samples = with_logprobs([Sample("a", "r0"), Sample("b", "r1", {"cache_salt": "s"})], 5)
    assert [s.request_overrides for s in samples] == [asked, {"cache_salt": "s", **asked}]
    assert [s.request_id for s in samples] == ["r0", "r1"]
    shared = with_logprobs([Sample("a", "x"), Sample("b", "x"), Sample("c")], 5)
    assert [s.request_id for s in shared] == ["pytest-apc-0", "pytest-apc-1", "pytest-apc-2"]


def test_a_requests_answer_is_read_from_the_chunks_its_stream_carried() -> None:
    """vLLM's chat stream: a role chunk, one chunk per token with its logprobs (ids as ``token_id:N``), then
    the usage chunk; the answer is the text, the ids and each position's top-k."""
    from pytest_apc.measure.bench_worker import chunk_answer

    def token(i: int, lp: float) -> dict:
        top = [{"token": f"token_id:{i}", "logprob": lp}, {"token": "token_id:9", "logprob": -4.0}]
        return {"token": f"token_id:{i}", "logprob": lp, "top_logprobs": top}

    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "logprobs": None}]},
        {"choices": [{"delta": {"content": "He"}, "logprobs": {"content": [token(11, -0.5)]}}]},
        {"choices": [{"delta": {"content": "llo"}, "logprobs": {"content": [token(12, -0.25)]}}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    top = [[[11, -0.5], [9, -4.0]], [[12, -0.25], [9, -4.0]]]
    assert chunk_answer(chunks) == {"tokens": [11, 12], "text": "Hello", "top": top}
    with pytest.raises(ValueError, match="not an id"):
        chunk_answer([{"choices": [{"delta": {}, "logprobs": {"content": [{"token": "He", "logprob": 0.0}]}}]}])


@dataclass
class StandInInput:
    """What vLLM's request function is given: here, the chunks its server streams."""

    request_id: str
    chunks: list


def stand_in_requests(monkeypatch) -> types.ModuleType:
    """A stand-in for vLLM's ``endpoint_request_func`` module (its real use is in test_e2e_fault.py): its chat
    request function parses each chunk with the module's ``json``, after its stream handler parsed the tail
    to check that it is whole, and lets another request's chunks arrive in between."""
    module = types.ModuleType("vllm.benchmarks.lib.endpoint_request_func")
    module.json = json

    class StreamedResponseHandler:
        def add_chunk(self, chunk: str) -> list[str]:
            module.json.loads(chunk)  # vLLM checks that a tail is whole JSON; the request parses it again
            return [chunk]

    async def chat(request_func_input, session, pbar=None):
        handler = StreamedResponseHandler()
        for chunk in request_func_input.chunks:
            for message in handler.add_chunk(chunk):
                module.json.loads(message)
                await asyncio.sleep(0)  # the other request's chunks arrive in between
        return "output"

    module.StreamedResponseHandler = StreamedResponseHandler
    module.ASYNC_REQUEST_FUNCS = {"openai-chat": chat}
    for name in ("vllm", "vllm.benchmarks", "vllm.benchmarks.lib"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    sys.modules["vllm.benchmarks.lib"].endpoint_request_func = module
    return module


def stream(*tokens: int | str) -> list[str]:
    """A chat stream of one chunk a token, each with its logprobs (ints as ids, ``token_id:N``)."""
    items = [{"token": f"token_id:{t}" if isinstance(t, int) else t, "logprob": -1.0, "top_logprobs": []}
             for t in tokens]  # fmt: skip
    return [json.dumps({"choices": [{"delta": {"content": str(t)}, "logprobs": {"content": [i]}}]})
            for t, i in zip(tokens, items, strict=True)]  # fmt: skip


def send_at_once(module: types.ModuleType, *inputs: StandInInput) -> list:
    """The requests sent at once through whatever function the stand-in module holds now."""

    async def send() -> list:
        request = module.ASYNC_REQUEST_FUNCS["openai-chat"]
        return await asyncio.gather(*(request(i, None) for i in inputs))

    return asyncio.run(send())


def test_each_requests_stream_is_kept_apart_under_concurrency_and_only_while_asked(monkeypatch) -> None:
    """The worker's wrapper around vLLM's chat request function, on a stand-in for vLLM's module: two requests
    in flight at once each keep their own chunks, by request id; the stream handler's whole-check parse is
    not kept twice; a run without logprobs keeps nothing; asking again wraps nothing twice."""
    from pytest_apc.measure import bench_worker

    module = stand_in_requests(monkeypatch)

    def run_two() -> None:
        send_at_once(module, StandInInput("r0", stream(1, 2, 3)), StandInInput("r1", stream(7, 8)))

    answers: dict = {}
    bench_worker._keep_answers(answers)
    run_two()
    assert {k: v["tokens"] for k, v in answers.items()} == {"r0": [1, 2, 3], "r1": [7, 8]}
    assert answers["r0"]["text"] == "123"
    answers.clear()
    bench_worker._keep_no_answers()
    run_two()
    assert answers == {}
    bench_worker._keep_answers(answers)
    run_two()
    assert answers["r1"]["tokens"] == [7, 8]  # wrapped once: each chunk kept once


def test_a_request_whose_stream_carries_no_token_ids_fails_the_run_naming_it(monkeypatch, tmp_path: Path) -> None:
    """A stream whose logprobs have a token that is not an id, or no token, is no traceback from the worker:
    the request completes, keeps no answer, and the run fails with read_answers' message naming it."""
    from pytest_apc.measure import bench_worker
    from pytest_apc.measure.bench import BenchError, read_answers

    module = stand_in_requests(monkeypatch)
    answers: dict = {}
    bench_worker._keep_answers(answers)
    no_token = json.dumps({"choices": [{"delta": {"content": "x"}, "logprobs": {"content": [{"logprob": -1.0}]}}]})
    sent = [StandInInput("r0", stream(1, 2)), StandInInput("r1", stream(3, "He")), StandInInput("r2", [no_token])]
    assert send_at_once(module, *sent) == ["output"] * 3
    assert list(answers) == ["r0"]
    args = argparse.Namespace(result_dir=str(tmp_path), result_filename="D-c8.json")
    bench_worker._write_answers({"request_ids": ["r0", "r1", "r2"]}, answers, args)
    with pytest.raises(BenchError, match=r"3 requests, 2 without token logprobs \(requests \[1, 2\]\)"):
        read_answers(tmp_path / "D-c8.json", 3, "cmd")


def test_answers_that_were_not_kept_are_a_failure_naming_the_requests(tmp_path: Path) -> None:
    from pytest_apc.measure.answers import Answer
    from pytest_apc.measure.bench import BenchError, read_answers
    from pytest_apc.measure.bench_worker import answers_file

    result = tmp_path / "D-c8.json"
    assert answers_file(result) == tmp_path / "D-c8.answers.json"
    with pytest.raises(BenchError, match="kept no per-request answers"):
        read_answers(result, 2, "cmd")
    answers_file(result).write_text(json.dumps([{"tokens": [1], "text": "a", "top": []}, {"tokens": [], "text": ""}]))
    with pytest.raises(BenchError, match=r"(?s)1 without token logprobs \(requests \[1\]\).*re-run: cmd"):
        read_answers(result, 2, "cmd")
    answers_file(result).write_text(json.dumps([{"tokens": [1], "text": "a", "top": []}]))
    assert read_answers(result, 1, "cmd") == [Answer([1], "a", [])]
    from pytest_apc.measure.bench import LOGPROBS_OPTION, reproduce_command

    assert "vllm bench serve" not in reproduce_command(["--seed", "0", LOGPROBS_OPTION, "5"])


def test_the_benchmark_freezes_its_heap_before_each_run() -> None:
    """A full garbage collection of a process with vLLM imported stalls it for hundreds of milliseconds on a
    small machine; the benchmark process therefore collects and freezes what it holds before each run, so
    that a collection during the run scans only what the run itself allocates."""
    import gc

    from pytest_apc.measure.bench_worker import quiet_heap

    held = [[] for _ in range(1000)]  # lists are tracked by the collector
    try:
        gc.unfreeze()
        quiet_heap()
        assert gc.get_freeze_count() >= len(held)
        assert gc.get_count()[0] < 10  # a fresh youngest generation: the run starts with nothing to scan
    finally:
        gc.unfreeze()
