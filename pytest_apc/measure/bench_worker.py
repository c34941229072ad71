"""The benchmark's child process: vLLM's ``bench serve`` run in this interpreter, patched to reuse prompts.

* ``python -m pytest_apc.measure.bench_worker ARGS`` runs it once, exactly like ``vllm bench serve ARGS``
  (``python -m pytest_apc.measure.bench ARGS``, the command the plugin prints, runs this);
* ``python -m pytest_apc.measure.bench_worker --worker`` is the long-lived worker ``bench.BenchRunner``
  starts: it imports vLLM once and runs one benchmark per request line on its standard input, so a run
  costs its benchmark and not a fresh vLLM import (20-30 s on a GPU node). It reuses generated prompts
  between runs with identical dataset arguments (the ON and OFF run of a pair, every level of the sweep:
  the dataset is seeded, so they are identical anyway), sends the multi-turn case's message lists
  (``chat_samples``), and answers each request with a status file (and the prompts it sent, for the
  answers probe).

``--cache-salt-per-request PREFIX`` (this module's own option, taken out before vLLM parses the rest) gives
every request a ``cache_salt`` of its own (``PREFIX-<index>``, through the benchmark's per-request
overrides): vLLM then hashes each request's blocks apart from every other's, so the run is computed without
the prefix cache, at the same concurrency and in the same order (the answers' same-server reference).

``--answer-logprobs K`` (also this module's own) asks every request for its tokens as ids with their top-K
logprobs (per-request overrides again) and keeps them: vLLM's chat request function reads each streamed
chunk and keeps only its text, so the worker wraps that function (a context variable names the request in
flight) and the JSON parser it reads chunks with, and writes each request's answer, in sending order, to
``<result file>.answers.json`` beside the benchmark's result. The requests, their timing and vLLM's result
are vLLM's own; only what the chunks carried is kept as well.

Imported only in the child: the parent (``bench``) never imports vLLM.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import gc
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from pytest_apc.measure.answers import NO_LOGPROBS, Answer, logprob_tokens

# Arguments that do not change the generated prompts (everything else is part of the prompt-cache key).
_NOT_DATASET = {
    "base_url", "host", "port", "max_concurrency", "result_dir", "result_filename", "request_id_prefix",
    "metadata", "label", "disable_tqdm", "save_result", "save_detailed", "percentile_metrics",
    "metric_percentiles", "request_rate", "burstiness", "ready_check_timeout_sec", "num_warmups", "header",
}  # fmt: skip


def _parser() -> Any:
    from vllm.benchmarks.serve import add_cli_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # older vLLM
        from argparse import ArgumentParser as Parser  # type: ignore[assignment]
    parser = Parser(
        prog="python -m pytest_apc.measure.bench", description="vLLM's `bench serve`, as pytest-apc runs it"
    )
    add_cli_args(parser)
    return parser


# Characters of a prompt that tell its prefix group (a prefix is thousands of random tokens).
GROUP_KEY_CHARS = 64


def prompt_groups(prompts: list[str]) -> list[int]:
    """Each prompt's prefix group, numbered in order of first appearance."""
    seen: dict[str, int] = {}
    return [seen.setdefault(prompt[:GROUP_KEY_CHARS], len(seen)) for prompt in prompts]


def chat_samples(args: Any) -> list[Any] | None:
    """The requests of a ``custom`` dataset file whose ``prompt`` is a whole message list (the multi-turn
    case), as vLLM's ``SampleRequest`` with its ``chat_messages``: vLLM's openai-chat backend sends such a
    list as the request's messages, but its custom dataset takes a prompt string only (it wraps it in one
    user message). Each line gives ``prompt_len`` (what the server's ``/tokenize`` counted) and
    ``output_tokens``, and may give the ``request_id`` (sent as ``x-request-id``; case M behind a router: the
    conversation's, its routing key). None for any other dataset, which vLLM loads itself."""
    path = getattr(args, "dataset_path", None)
    if getattr(args, "dataset_name", "") != "custom" or not path or not str(path).endswith(".jsonl"):
        return None
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows or not all(isinstance(row.get("prompt"), list) for row in rows):
        return None
    from vllm.benchmarks.datasets import SampleRequest

    prefix = getattr(args, "request_id_prefix", "") or ""
    return [
        SampleRequest(
            prompt=row["prompt"],
            prompt_len=int(row["prompt_len"]),
            expected_output_len=int(row["output_tokens"]),
            request_id=str(row.get("request_id") or f"{prefix}{i}"),
            chat_messages=row["prompt"],
        )
        for i, row in enumerate(rows)
    ]


SALT_OPTION = "--cache-salt-per-request"


LOGPROBS_OPTION = "--answer-logprobs"


def split_option(argv: list[str], option: str) -> tuple[list[str], str | None]:
    """``argv`` without ``option`` (one of this module's own) and its value, and that value (None where it is
    not given)."""
    if option not in argv:
        return argv, None
    at = argv.index(option)
    return argv[:at] + argv[at + 2 :], argv[at + 1]


def split_salt(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without :data:`SALT_OPTION` and its value, and that value (None where it is not given)."""
    return split_option(argv, SALT_OPTION)


def _need_overrides(samples: list[Any], what: str) -> None:
    if samples and not hasattr(samples[0], "request_overrides"):
        raise RuntimeError(
            f"this vLLM's benchmark has no per-request overrides (SampleRequest.request_overrides), so it cannot "
            f"{what}: that needs a newer vLLM"
        )


def salted(samples: list[Any], prefix: str) -> list[Any]:
    """Each request with a ``cache_salt`` of its own among its per-request overrides."""
    _need_overrides(samples, "send each request with a cache_salt of its own (the answers' same-server reference)")
    return [
        dataclasses.replace(s, request_overrides={**(s.request_overrides or {}), "cache_salt": f"{prefix}-{i}"})
        for i, s in enumerate(samples)
    ]


def with_logprobs(samples: list[Any], top_k: int) -> list[Any]:
    """Each request asking for its tokens as ids with their top-``top_k`` logprobs (the per-request rule of
    the answers verdict); each with a request id of its own, by which its answer is kept."""
    _need_overrides(samples, "ask each request for its logprobs")
    ids = [s.request_id for s in samples]
    unique = None not in ids and len(set(ids)) == len(ids)
    asked = {"logprobs": True, "top_logprobs": top_k, "return_tokens_as_token_ids": True}
    return [
        dataclasses.replace(
            s,
            request_overrides={**(s.request_overrides or {}), **asked},
            request_id=s.request_id if unique else f"pytest-apc-{i}",
        )
        for i, s in enumerate(samples)
    ]


def chunk_answer(chunks: list[Any]) -> dict[str, Any]:
    """One request's answer out of the chunks its stream carried, as ``measure.answers.Answer``'s JSON: its
    text, token ids and each position's top-k ``[token, logprob]`` pairs (read as the probe reads a reply's,
    ``logprob_tokens``); raises one of ``NO_LOGPROBS`` where a chunk's logprobs have no token or no id."""
    text = ""
    content: list[Any] = []
    for data in chunks:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices:
            continue
        text += (choices[0].get("delta") or {}).get("content") or ""
        content += (choices[0].get("logprobs") or {}).get("content") or []
    tokens, top = logprob_tokens(content)
    return Answer(tokens, text, top).to_json()


_CHUNKS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("pytest_apc_chunks", default=None)
_CHECKING = contextvars.ContextVar("pytest_apc_checking", default=False)


def _keep_answers(answers: dict[str, dict[str, Any]]) -> None:
    """Wrap vLLM's chat request function so that each request's streamed chunks are kept, as its answer, in
    ``answers`` under its request id. vLLM parses each chunk with its module's ``json.loads``; its stream
    handler also parses a chunk's tail only to check that it is whole, which is not kept. A request whose
    stream carried no token logprobs, or tokens that are not ids, keeps no answer: it is written without
    tokens (``_write_answers``), and ``bench.read_answers`` fails the run naming it."""
    from vllm.benchmarks.lib import endpoint_request_func as requests

    if hasattr(requests, "_pytest_apc_answers"):  # wrapped already (an earlier run of this worker)
        requests._pytest_apc_answers = answers
        return
    requests._pytest_apc_answers = answers  # type: ignore[attr-defined]
    real_json = requests.json

    class _Json:
        def __getattr__(self, name: str) -> Any:
            return getattr(real_json, name)

        @staticmethod
        def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
            data = real_json.loads(text, *args, **kwargs)
            chunks = _CHUNKS.get()
            if chunks is not None and not _CHECKING.get():
                chunks.append(data)
            return data

    requests.json = _Json()  # type: ignore[assignment]
    handler = requests.StreamedResponseHandler
    add_chunk = handler.add_chunk

    def checked_add_chunk(self: Any, chunk_bytes: bytes) -> list[str]:
        token = _CHECKING.set(True)
        try:
            return add_chunk(self, chunk_bytes)
        finally:
            _CHECKING.reset(token)

    handler.add_chunk = checked_add_chunk  # type: ignore[method-assign]
    chat = requests.ASYNC_REQUEST_FUNCS["openai-chat"]

    async def request(request_func_input: Any, session: Any, pbar: Any = None, **kwargs: Any) -> Any:
        if requests._pytest_apc_answers is None:  # type: ignore[attr-defined] # a run that keeps none
            return await chat(request_func_input, session, pbar, **kwargs)
        chunks: list[Any] = []
        token = _CHUNKS.set(chunks)
        try:
            return await chat(request_func_input, session, pbar, **kwargs)
        finally:
            _CHUNKS.reset(token)
            with contextlib.suppress(*NO_LOGPROBS):  # no answer kept: read_answers names the request
                requests._pytest_apc_answers[str(request_func_input.request_id)] = chunk_answer(chunks)  # type: ignore[attr-defined]

    requests.ASYNC_REQUEST_FUNCS["openai-chat"] = request


def _keep_no_answers() -> None:
    """A run without logprobs after one with them (the same worker): its requests go to vLLM's function as is."""
    requests = sys.modules.get("vllm.benchmarks.lib.endpoint_request_func")
    if requests is not None and getattr(requests, "_pytest_apc_answers", None) is not None:
        requests._pytest_apc_answers = None  # type: ignore[attr-defined]


def answers_file(result_path: Path) -> Path:
    """Where a run's per-request answers go: beside its result file (``<name>.json`` -> ``<name>.answers.json``)."""
    return result_path.with_name(result_path.name.removesuffix(".json") + ".answers.json")


def answers_path(args: Any) -> Path:
    """:func:`answers_file` of the result the parsed benchmark arguments name (``--result-dir/--result-filename``)."""
    name = str(getattr(args, "result_filename", None) or "result.json")
    return answers_file(Path(getattr(args, "result_dir", None) or ".") / name)


def _write_answers(sent: dict[str, Any], answers: dict[str, dict[str, Any]], args: Any) -> None:
    """Each sent request's answer, in sending order (an empty one where its stream carried none)."""
    empty = {"tokens": [], "text": "", "top": []}
    kept = [answers.get(str(request_id), empty) for request_id in sent.get("request_ids", [])]
    answers_path(args).write_text(json.dumps(kept))


def quiet_heap() -> None:
    """Collect, then freeze what the process holds, before a run: with vLLM imported, a full collection of
    this heap stalls the benchmark for about 300 ms on a 2-core machine, and every request in flight then
    gets its first token that late (vLLM freezes its engine's heap the same way, not its benchmark's)."""
    gc.collect()
    gc.freeze()


def _memoize_prompts(sent: dict[str, Any]) -> None:
    """Reuse generated prompts across runs whose dataset arguments are identical; keep the last run's
    prefix groups (the eviction prediction replays them in this order) and its prompts (the answers probe
    sends some again) in ``sent``."""
    import vllm.benchmarks.serve as serve

    original = serve.get_samples
    cache: dict[str, Any] = {}

    def get_samples(args: Any, tokenizer: Any, *rest: Any, **kwargs: Any) -> Any:
        key = repr(sorted((k, repr(v)) for k, v in vars(args).items() if k not in _NOT_DATASET))
        if key not in cache:
            cache[key] = chat_samples(args) or original(args, tokenizer, *rest, **kwargs)
        samples = list(cache[key])
        is_groups = getattr(args, "dataset_name", "") == "prefix_repetition"
        sent["prompt_groups"] = prompt_groups([str(s.prompt) for s in samples]) if is_groups else []
        sent["prompts"] = [s.prompt for s in samples]
        if sent.get("salt"):
            samples = salted(samples, sent["salt"])
        if sent.get("logprobs"):
            samples = with_logprobs(samples, int(sent["logprobs"]))
        sent["request_ids"] = [s.request_id for s in samples]
        return samples

    serve.get_samples = get_samples


def _worker() -> int:
    parser = _parser()
    sent: dict[str, Any] = {}
    _memoize_prompts(sent)
    from vllm.benchmarks.serve import main

    answers: dict[str, dict[str, Any]] = {}
    saved_out, saved_err = os.dup(1), os.dup(2)
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any] = {"ok": True}
        sent.clear()
        answers.clear()
        argv, sent["salt"] = split_salt(request["argv"])
        argv, sent["logprobs"] = split_option(argv, LOGPROBS_OPTION)
        if sent["logprobs"]:
            _keep_answers(answers)
        else:
            _keep_no_answers()
        with open(request["log"], "ab") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                quiet_heap()
                args = parser.parse_args(argv)
                main(args)
                if sent["logprobs"]:
                    _write_answers(sent, answers, args)
            except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the test
                reply = {"ok": False, "error": "".join(traceback.format_exception(err))}
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved_out, 1)
                os.dup2(saved_err, 2)
        reply["prompt_groups"] = sent.get("prompt_groups", [])
        if request.get("prompts") and "prompts" in sent:  # the answers probe sends some of them again
            Path(request["prompts"]).write_text(json.dumps(sent["prompts"]))
        tmp = request["status"] + ".tmp"
        Path(tmp).write_text(json.dumps(reply))
        os.replace(tmp, request["status"])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        code = _worker()
    else:
        sent: dict[str, Any] = {}
        answers: dict[str, dict[str, Any]] = {}
        argv, sent["salt"] = split_salt(argv)
        argv, sent["logprobs"] = split_option(argv, LOGPROBS_OPTION)
        _memoize_prompts(sent)
        if sent["logprobs"]:
            _keep_answers(answers)
        from vllm.benchmarks.serve import main as bench_main

        args = _parser().parse_args(argv)
        quiet_heap()
        bench_main(args)
        if sent["logprobs"]:
            _write_answers(sent, answers, args)
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: triton's bindings print hundreds of "leaked" lines at exit.
    os._exit(code)


if __name__ == "__main__":
    main()
