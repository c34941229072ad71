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

Imported only in the child: the parent (``bench``) never imports vLLM.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

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


def split_salt(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without :data:`SALT_OPTION` and its value, and that value (None where it is not given)."""
    if SALT_OPTION not in argv:
        return argv, None
    at = argv.index(SALT_OPTION)
    return argv[:at] + argv[at + 2 :], argv[at + 1]


def salted(samples: list[Any], prefix: str) -> list[Any]:
    """Each request with a ``cache_salt`` of its own among its per-request overrides."""
    if samples and not hasattr(samples[0], "request_overrides"):
        raise RuntimeError(
            "this vLLM's benchmark has no per-request overrides (SampleRequest.request_overrides), so it cannot "
            "send each request with a cache_salt of its own; the answers' same-server reference needs a newer vLLM"
        )
    return [
        dataclasses.replace(s, request_overrides={**(s.request_overrides or {}), "cache_salt": f"{prefix}-{i}"})
        for i, s in enumerate(samples)
    ]


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
        return salted(samples, sent["salt"]) if sent.get("salt") else samples

    serve.get_samples = get_samples


def _worker() -> int:
    parser = _parser()
    sent: dict[str, Any] = {}
    _memoize_prompts(sent)
    from vllm.benchmarks.serve import main

    saved_out, saved_err = os.dup(1), os.dup(2)
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any] = {"ok": True}
        sent.clear()
        argv, sent["salt"] = split_salt(request["argv"])
        with open(request["log"], "ab") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                quiet_heap()
                main(parser.parse_args(argv))
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
        argv, sent["salt"] = split_salt(argv)
        _memoize_prompts(sent)
        from vllm.benchmarks.serve import main as bench_main

        args = _parser().parse_args(argv)
        quiet_heap()
        bench_main(args)
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: triton's bindings print hundreds of "leaked" lines at exit.
    os._exit(code)


if __name__ == "__main__":
    main()
