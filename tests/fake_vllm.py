#!/usr/bin/env python3
"""A fault-injecting fake of vLLM's OpenAI-compatible server, for pytest-apc's own tests.

Standard library only, so it is listening well under a second after launch. The command line mimics
``python -m vllm.entrypoints.openai.api_server``::

    python tests/fake_vllm.py --model PATH --served-model-name NAME --host 127.0.0.1 --port N
        [--enable-prefix-caching | --no-enable-prefix-caching] [--max-model-len N] [--block-size N]
        [unknown vLLM flags are ignored] [fault switches]

Endpoints: GET /health, /v1/models, /version, /metrics; POST /tokenize, /v1/chat/completions (stream or
not), /reset_prefix_cache (with VLLM_SERVER_DEV_MODE=1 only, as vLLM). Requests naming a model other than
the served name get 404, like vLLM (so ``vllm bench serve``, which sends the model *path* to /tokenize,
skips its prompt re-alignment). A ``--port 0`` binds a free port; the log line "Starting vLLM server on
http://HOST:PORT" tells which.

Fake tokenizer: one token per 4 characters (rounded up), id = sum of the characters' ord % 4000 + 7
(with --fake-model-tokenizer: the tokenizer.json of --model, through the ``tokenizers`` package).
Chat template: [1, 3, 10, 11] + tokens of the concatenated message texts + [6, 5].
Prefix cache model: full blocks of --block-size tokens, keyed by a chained hash of the whole prefix.
Finished requests: vllm:request_success_total{finished_reason=...}, "length" for every answered chat
completion, "abort" for one whose client went away.

Fault switches:
    --fake-startup-delay S      sleep S seconds before listening (default 0.2; connections refused)
    --fake-crash-on-start       after the delay, print "RuntimeError: CUDA out of memory (fake)" to stderr
                                and exit with code 3
    --fake-never-ready          listen, but GET /health answers 503 forever
    --fake-hang                 after startup, every request handler sleeps forever
    --fake-die-after-requests N after N answered chat completions, print "fake engine died" and os._exit(1)
    --fake-fail-requests        POST /v1/chat/completions answers 400 {"error": {...}}
    --fake-fail-every N         every Nth chat completion answers 400 (a partial failure; the rest succeed)
    --fake-garbage-metrics      GET /metrics answers 200 with text that is not Prometheus format
    --fake-no-prefix-metrics    /metrics omits vllm:prefix_cache_* and vllm:prompt_tokens_by_source
    --fake-wrong-mode           cache_config_info reports enable_prefix_caching opposite to the flag
    --fake-reset MODE           POST /reset_prefix_cache: ok (default) | 404 | false | false-then-ok |
                                external-false
                                (false-then-ok: {"success": false} unless ?reset_running_requests=true)
                                (external-false: {"success": false} with ?reset_external=true, as vLLM
                                without a KV connector answered before vllm#42693)
    --fake-ignore-sigterm       ignore SIGTERM (callers must escalate to SIGKILL)
    --fake-children N           spawn N sleeper children (stand-ins for EngineCore / TP workers) in the
                                same process group, logging "fake child pid=NNN"
    --fake-log-noise            print 100 noisy lines (blank, non-ASCII, invalid UTF-8) before the ready line
    --fake-no-tokenize          POST /tokenize answers 404 (a server without the tokenizer endpoints)
    --fake-external-tier        a KV offload tier: a reset without ?reset_external=true leaves the cached
                                prefixes in place
    --num-gpu-blocks-override N (vLLM's flag) the prefix cache holds N - 1 blocks, least recently used
                                evicted first (a plain LRU, not vLLM's block pool)
    --kv-offloading-size GIB    (vLLM's flag) a CPU tier that stores every block computed; a lookup
                                continues there where the GPU cache's chain ends (external_kv_transfer)
    --fake-tier-survives-reset  the tier is not emptied even by ?reset_external=true (as LMCache's
                                connectors, which report success and clear nothing)
    --fake-fatal-on-start       after the delay, print what a crashed tensor-parallel worker prints (a
                                traceback, "WorkerProc hit an exception", a CUDA error) and stay alive without
                                ever listening, printing a line a second (the API process of a dead engine)
    --fake-engine-exit-after S  spawn a child titled "VLLM::EngineCore_DP0" that exits with code 1 after S s
    --fake-engine-forks S       spawn a child titled "VLLM::EngineCore_DP0" that lives on and, for S s, keeps
                                forking short-lived copies of itself (same title, as a compiler subprocess is
                                between fork and exec) that exit with code 0
    --fake-no-cache-config      /metrics omits vllm:cache_config_info
    --fake-fatal-after-requests N  after N answered chat completions, print an engine traceback and "EngineCore
                                encountered a fatal error"; later chat completions hang, /health stays 200
    --fake-hang-after-requests N   after N answered chat completions, every request (/health too) hangs
    --fake-no-request-counter   /metrics omits vllm:request_success_total
    --fake-model-tokenizer      tokenize message texts with --model's tokenizer.json, as the benchmark client
                                does: the prefix the benchmark generates is then exactly its tokens, and hits
                                match pytest-apc's prediction (the fake tokenizer's 4 characters per token do not)
    --fake-tls CERT,KEY         serve https with this certificate and key (PEM files)
    --fake-refuse=FLAG          (repeatable) refuse FLAG as vLLM's argument parser refuses a flag it does not
                                know: when FLAG is on the command line, print "error: unrecognized arguments:
                                FLAG" and exit with code 2 at once
    --fake-bench-worker         be pytest-apc's benchmark worker (python -m pytest_apc.measure.bench_worker --worker)
                                instead of a server: after the start-up switches (--fake-startup-delay,
                                --fake-crash-on-start, --fake-children, --fake-ignore-sigterm, --fake-refuse)
                                the real worker takes over (exec), or with --fake-hang it reads the first
                                request and never answers it (a hung benchmark)
    --fake-if-log='TEXT ARGS'   (repeatable) when the path of the file this process's stdout goes to contains
                                TEXT, ARGS are added to the command line: pytest-apc launches fleet replicas
                                with one log each (server-<mode>-r<N>.log), so
                                --fake-if-log='-r2.log --fake-crash-on-start' breaks replica 2 alone

As a stand-in for vllm-router (--apc-set router_command) it takes the router's flags (--worker-urls ...,
--policy, --prometheus-port), answers /health, and breaks with the same switches.

Without --fake-ignore-sigterm, SIGTERM prints "fake vLLM shutting down" and exits 0. The children are
not reaped by the fake itself: like leaked EngineCore processes, they die only when their group is
signalled. They inherit stdout/stderr, so a pipe reader sees EOF only after they are gone.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HEADER_TOKENS = [1, 3, 10, 11]
FOOTER_TOKENS = [6, 5]
KV_CACHE_TOKENS = 4_194_304
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FinishReason
PID = os.getpid()
METRIC_FAMILIES = [  # (name without the "vllm:" prefix, type, help) in vLLM's registration order
    ("cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
    ("num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source."),
    ("generation_tokens_total", "counter", "Number of generation tokens processed."),
    ("external_prefix_cache_hits_total", "counter", "External prefix cache hits from KV connector."),
    ("request_success_total", "counter", "Count of successfully processed requests."),
]


LOG_LOCK = threading.Lock()


def log(line: str) -> None:
    # One write per line under a lock: print() writes the text and the newline apart, so lines of two
    # request threads could interleave and a fatal line would no longer start the line vLLM's would.
    with LOG_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def tokenize_text(text: str) -> list[int]:
    if MODEL_TOKENIZER:
        return list(MODEL_TOKENIZER[0].encode(text, add_special_tokens=False).ids)
    return [sum(map(ord, text[i : i + 4])) % 4000 + 7 for i in range(0, len(text), 4)]


MODEL_TOKENIZER: list[Any] = []  # --fake-model-tokenizer: the tokenizers.Tokenizer of --model


def use_model_tokenizer(model: str) -> None:
    """Tokenize message texts like the benchmark client does (the model's tokenizer.json), as vLLM would."""
    from tokenizers import Tokenizer  # not stdlib: only with --fake-model-tokenizer

    MODEL_TOKENIZER.append(Tokenizer.from_file(os.path.join(model, "tokenizer.json")))


def message_text(messages: list[Any]) -> str:
    parts: list[str] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            texts = (p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            parts += map(str, texts)
    return "".join(parts)


def chat_tokens(messages: list[Any]) -> list[int]:
    return HEADER_TOKENS + tokenize_text(message_text(messages)) + FOOTER_TOKENS


def answer_logprobs(prompt: list[int], max_tokens: int, top: int) -> dict[str, Any]:
    """A greedy answer that depends on the whole prompt, with ``top`` logprobs per token (tokens as ids)."""
    seed = sum((i + 1) * t for i, t in enumerate(prompt))
    tokens = [(seed + 7919 * i) % 4096 for i in range(max_tokens)]
    content = []
    for token in tokens:
        others = [{"token": f"token_id:{(token + k) % 4096}", "logprob": -1.0 - k} for k in range(1, top)]
        content.append(
            {
                "token": f"token_id:{token}",
                "logprob": -0.1,
                "top_logprobs": [{"token": f"token_id:{token}", "logprob": -0.1}, *others],
            }
        )
    return {"content": content}


class Engine:
    """Counters and the prefix-cache model; every method takes the lock (the server is threaded)."""

    hash_algo = "sha256"  # what cache_config_info reports (--prefix-caching-hash-algo); the model is one hash

    def __init__(
        self, prefix_caching: bool, block_size: int, external_tier: bool = False, gpu_blocks: int = 0,
        tier_gib: float = 0.0, tier_survives_reset: bool = False, restart_after: int | None = None,
    ) -> None:  # fmt: skip
        self.prefix_caching = prefix_caching
        self.block_size = block_size
        self.external_tier = external_tier
        self.gpu_blocks, self.tier_gib, self.tier_survives_reset = gpu_blocks, tier_gib, tier_survives_reset
        self.lock = threading.Lock()
        self.blocks: dict[int, None] = {}  # cached block hashes, least recently used first
        self.tier: set[int] = set()
        self.zero_counters()
        self.running = self.running_tokens = self.answered = self.received = 0
        self.hung = False  # every request hangs (--fake-hang-after-requests)
        self.dead = False  # chat completions hang (--fake-fatal-after-requests)
        # --fake-restart-after-requests: after that many admitted requests the counters begin again from zero
        # and the process start time moves on, as when a pod is restarted between two scrapes.
        self.restart_after, self.admitted, self.start_time = restart_after, 0, 1.7e9

    def admit(self, tokens: list[int], salt: str | None = None) -> int:
        """Account a request's prompt; return the number of prefix-cache hit tokens. A ``cache_salt`` is
        part of the first block's hash, as vLLM's: salted requests share blocks only with the same salt."""
        n, bs = len(tokens), self.block_size
        with self.lock:
            self.admitted += 1
            if self.admitted - 1 == self.restart_after:
                self.restart()
            self.prompt_tokens += n
            self.running += 1
            self.running_tokens += n
            if not self.prefix_caching:
                self.by_source["local_compute"] += n
                return 0
            hashes, h = [], hash(salt) if salt else 0
            for start in range(0, n - n % bs, bs):
                h = hash((h, tuple(tokens[start : start + bs])))
                hashes.append(h)
            limit = max(n - 1, 0) // bs
            hit_blocks = 0
            while hit_blocks < min(len(hashes), limit) and hashes[hit_blocks] in self.blocks:
                hit_blocks += 1
            loaded = hit_blocks
            while loaded < min(len(hashes), limit) and hashes[loaded] in self.tier:
                loaded += 1
            hit, external = hit_blocks * bs, (loaded - hit_blocks) * bs
            for h in hashes:  # used now: most recently used
                self.blocks.pop(h, None)
                self.blocks[h] = None
            if self.tier_gib:  # the tier stores every block computed (vLLM's offloading connector does)
                self.tier.update(hashes)
            while self.gpu_blocks and len(self.blocks) > self.gpu_blocks - 1:
                del self.blocks[next(iter(self.blocks))]
            self.queries += n
            self.hits += hit
            self.external += external
            self.by_source["local_cache_hit"] += hit
            self.by_source["external_kv_transfer"] += external
            self.by_source["local_compute"] += n - hit - external
            return hit + external

    def restart(self) -> None:
        """What a restarted server shows (the caller holds the lock): empty cache, counters from zero."""
        log(f"(APIServer pid={PID}) INFO fake restart: counters begin again from zero")
        self.blocks.clear()
        self.zero_counters()
        self.start_time += 60

    def zero_counters(self) -> None:
        """The counters /metrics exports, as a process starts them."""
        self.queries = self.hits = self.prompt_tokens = self.generation_tokens = self.external = 0
        self.by_source = dict.fromkeys(SOURCES, 0)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    def finish(self, prompt_len: int, completion_tokens: int, reason: str = "length") -> None:
        with self.lock:
            self.running -= 1
            self.running_tokens -= prompt_len
            self.generation_tokens += completion_tokens
            self.finished[reason] += 1

    def reset(self, external: bool) -> None:
        """Like vLLM: an offload tier keeps the prefixes unless reset_external=true (they come back as hits)."""
        with self.lock:
            if external or not self.external_tier:
                self.blocks.clear()
            if external and not self.tier_survives_reset:
                self.tier.clear()

    def metrics(self, name: str, report_caching: bool, prefix_metrics: bool, request_counter: bool = True) -> str:
        """Render Prometheus text format 0.0.4, the way prometheus_client does for vLLM."""
        lab, bs = f'engine="0",model_name="{name}"', self.block_size
        info = (
            f'block_size="{bs}",enable_prefix_caching="{report_caching}",engine="0",'
            f'num_gpu_blocks="{self.gpu_blocks or KV_CACHE_TOKENS // bs}",'
            f'kv_cache_size_tokens="{(self.gpu_blocks * bs) or KV_CACHE_TOKENS}",'
            f'kv_offloading_size="{self.tier_gib or None}",'
            f'prefix_caching_hash_algo="{self.hash_algo}",gpu_memory_utilization="0.9"'
        )
        with self.lock:
            by_source: list[tuple[str, float]] = [(f'{lab},source="{s}"', self.by_source[s]) for s in SOURCES]
            finished = [(f'{lab},finished_reason="{r}"', self.finished[r]) for r in FINISH_REASONS]
            values: dict[str, list[tuple[str, float]]] = {
                "cache_config_info": [(info, 1)],
                "num_requests_running": [(lab, self.running)],
                "num_requests_waiting": [(lab, 0)],
                "kv_cache_usage_perc": [(lab, min(1.0, self.running_tokens / KV_CACHE_TOKENS))],
                "prefix_cache_queries_total": [(lab, self.queries)],
                "prefix_cache_hits_total": [(lab, self.hits)],
                "num_preemptions_total": [(lab, 0)],
                "prompt_tokens_total": [(lab, self.prompt_tokens)],
                "prompt_tokens_by_source_total": by_source,
                "generation_tokens_total": [(lab, self.generation_tokens)],
                "external_prefix_cache_hits_total": [(lab, self.external)],  # with or without a connector
                "request_success_total": finished,
            }
        out = [  # prometheus_client's process collector, as on vLLM's /metrics
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.start_time}",
        ]
        for metric, kind, doc in METRIC_FAMILIES:
            if metric == "request_success_total" and not request_counter:
                continue
            if prefix_metrics or not metric.startswith(("prefix_cache_", "prompt_tokens_by_source")):
                out += [f"# HELP vllm:{metric} {doc}", f"# TYPE vllm:{metric} {kind}"]
                out += [f"vllm:{metric}{{{labels}}} {float(value)}" for labels, value in values[metric]]
        return "\n".join(out) + "\n"


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def __init__(self, addr: tuple[str, int], args: argparse.Namespace, engine: Engine) -> None:
        super().__init__(addr, Handler)
        self.args = args
        self.engine = engine
        self.names: list[str] = args.served_model_name or [args.model]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        log(f"INFO:     {self.client_address[0]}:{self.client_address[1]} - {format % args}")

    def send_json(self, status: int, body: Any) -> None:
        self.send_text(status, json.dumps(body), "application/json")

    def send_text(self, status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, kind: str) -> None:
        self.send_json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def read_json(self) -> Any:
        return json.loads(self.body) if self.body else {}

    def do_GET(self) -> None:
        self.dispatch("GET")

    def do_POST(self) -> None:
        self.dispatch("POST")

    def dispatch(self, method: str) -> None:
        args, engine = self.server.args, self.server.engine
        while args.fake_hang or engine.hung:
            time.sleep(3600)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length > 0 else b""  # always drained: keeps keep-alive sane
        url = urlsplit(self.path)
        routes = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("GET", "/version"): lambda: self.send_json(200, {"version": "0.0.0-fake"}),
            ("GET", "/metrics"): self.metrics,
            ("POST", "/tokenize"): self.tokenize,
            ("POST", "/v1/chat/completions"): self.chat,
        }
        if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":  # as vLLM: the dev routes exist in dev mode only
            routes[("POST", "/reset_prefix_cache")] = lambda: self.reset(parse_qs(url.query))
        route = routes.get((method, url.path))
        key = os.environ.get("VLLM_API_KEY")  # as vLLM: the /v1 routes want the bearer token, the rest do not
        if route and key and url.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_json(401, {"error": "Unauthorized"})
            return
        if route is None:
            known = any(path == url.path for _, path in routes)
            self.send_json(405 if known else 404, {"detail": "Method Not Allowed" if known else "Not Found"})
            return
        try:
            route()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def health(self) -> None:
        self.send_text(503 if self.server.args.fake_never_ready else 200, "")

    def models(self) -> None:
        args = self.server.args
        card = dict(object="model", created=int(time.time()), owned_by="vllm", root=args.model, parent=None)
        data = [dict(id=n, **card, max_model_len=args.max_model_len) for n in self.server.names]
        self.send_json(200, {"object": "list", "data": data})

    def metrics(self) -> None:
        args = self.server.args
        if args.fake_garbage_metrics:
            self.send_text(200, "<html>\x00garbage{{ not prometheus\nvllm:cache_config_info{{{ 1.0 2.0 x\n")
            return
        report = args.enable_prefix_caching != args.fake_wrong_mode
        text = self.server.engine.metrics(
            self.server.names[0], report, not args.fake_no_prefix_metrics, not args.fake_no_request_counter
        )
        if args.fake_no_cache_config:
            text = "\n".join(ln for ln in text.splitlines() if "cache_config_info" not in ln) + "\n"
        self.send_text(200, text, "text/plain; version=0.0.4; charset=utf-8")

    def reset(self, query: dict[str, list[str]]) -> None:
        mode = self.server.args.fake_reset
        if mode == "404":
            self.send_json(404, {"detail": "Not Found"})
            return
        running = query.get("reset_running_requests", ["false"])[-1].lower() in ("true", "1", "yes", "on")
        external = query.get("reset_external", ["false"])[-1].lower() in ("true", "1", "yes", "on")
        success = mode == "ok" or (mode == "false-then-ok" and running) or (mode == "external-false" and not external)
        if success:
            self.server.engine.reset(external)
        self.send_json(200, {"success": success})

    def check_model(self, body: dict[str, Any]) -> bool:
        model = body.get("model")
        if model and model not in self.server.names:
            self.send_error_json(404, f"The model `{model}` does not exist.", "NotFoundError")
            return False
        return True

    def parse_body(self) -> dict[str, Any] | None:
        try:
            body = self.read_json()
        except (ValueError, UnicodeDecodeError) as exc:
            self.send_error_json(400, f"Invalid JSON body: {exc}", "BadRequestError")
            return None
        if not isinstance(body, dict):
            self.send_error_json(400, "Request body must be a JSON object.", "BadRequestError")
            return None
        return body if self.check_model(body) else None

    def tokenize(self) -> None:
        if self.server.args.fake_no_tokenize:
            self.send_error_json(404, "Not Found", "NotFoundError")
            return
        body = self.parse_body()
        if body is None:
            return
        if "messages" in body:
            tokens = chat_tokens(body["messages"] or [])
        else:
            tokens = tokenize_text(str(body.get("prompt", "")))
        max_len = self.server.args.max_model_len
        self.send_json(200, dict(count=len(tokens), max_model_len=max_len, tokens=tokens, token_strs=None))

    def chat(self) -> None:
        args, engine = self.server.args, self.server.engine
        while engine.dead:  # the engine is gone: nothing will ever answer
            time.sleep(3600)
        body = self.parse_body()
        if body is None:
            return
        if args.fake_fail_requests:
            self.send_error_json(400, "fake failure (--fake-fail-requests)", "BadRequestError")
            return
        if args.fake_fail_every:
            with engine.lock:
                engine.received += 1
                fail = engine.received % args.fake_fail_every == 0
            if fail:
                self.send_error_json(400, "fake failure (--fake-fail-every)", "BadRequestError")
                return
        self.maybe_die()
        prompt = chat_tokens(body.get("messages") or [])
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        if len(prompt) + max_tokens > args.max_model_len:
            msg = (
                f"This model's maximum context length is {args.max_model_len} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains {len(prompt)} input tokens."
            )
            self.send_error_json(400, msg, "BadRequestError")
            return
        engine.admit(prompt, body.get("cache_salt"))
        done = 0
        answered = False
        try:
            base = dict(id=f"chatcmpl-fake-{time.monotonic_ns()}", created=int(time.time()))
            base["model"] = self.server.names[0]
            n = len(prompt)
            usage = dict(prompt_tokens=n, completion_tokens=max_tokens, total_tokens=n + max_tokens)
            if not body.get("stream"):
                time.sleep(0.001 * max_tokens)
                done = max_tokens
                message = {"role": "assistant", "content": " tok" * max_tokens}
                choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
                if body.get("logprobs"):  # the answers probe: an answer of the prompt's own, as token ids
                    choice["logprobs"] = answer_logprobs(prompt, max_tokens, int(body.get("top_logprobs") or 1))
                reply = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
                self.send_json(200, reply)
            else:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def event(choices: list[Any], **extra: Any) -> None:
                    chunk = {**base, "object": "chat.completion.chunk", "choices": choices, **extra}
                    self.write_chunk(f"data: {json.dumps(chunk)}\n\n")

                # Each token's logprobs in its chunk where they were asked for (the answers' per-request rule).
                asked = (
                    answer_logprobs(prompt, max_tokens, int(body.get("top_logprobs") or 1))["content"]
                    if body.get("logprobs")
                    else None
                )
                event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                for done in range(1, max_tokens + 1):
                    time.sleep(0.001)
                    finish = "length" if done == max_tokens else None
                    choice = {"index": 0, "delta": {"content": " tok"}, "finish_reason": finish}
                    if asked:
                        choice["logprobs"] = {"content": [asked[done - 1]]}
                    event([choice])
                if (body.get("stream_options") or {}).get("include_usage"):
                    event([], usage=usage)
                self.write_chunk("data: [DONE]\n\n")
                self.write_chunk("")
            answered = True
        finally:
            engine.finish(len(prompt), done, "length" if answered else "abort")
        self.maybe_die(answered=1)

    def write_chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def maybe_die(self, answered: int = 0) -> None:
        args, engine = self.server.args, self.server.engine
        with engine.lock:
            engine.answered += answered
            if args.fake_hang_after_requests is not None and engine.answered >= args.fake_hang_after_requests:
                engine.hung = True
            fatal_at = args.fake_fatal_after_requests
            if fatal_at is not None and engine.answered >= fatal_at and not engine.dead:
                engine.dead = True
                core = f"(EngineCore_DP0 pid={PID})"
                log(f"{core} ERROR EngineCore encountered a fatal error.")
                log(f"{core} Traceback (most recent call last):")
                log(f'{core}   File "vllm/v1/engine/core.py", line 1, in run_busy_loop')
                log(f"{core} RuntimeError: fake engine step failed")
        limit = args.fake_die_after_requests
        if limit is None:
            return
        with engine.lock:
            if engine.answered >= limit:
                log(f"(EngineCore pid={PID}) ERROR fake engine died")
                sys.stderr.write("fake engine died\n")
                sys.stderr.flush()
                os._exit(1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fake vLLM server for pytest-apc tests.", allow_abbrev=False)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks-override", type=int, default=0)
    p.add_argument("--prefix-caching-hash-algo", default="sha256")
    p.add_argument("--kv-offloading-size", type=float, default=0.0)
    p.add_argument("--fake-startup-delay", type=float, default=0.2)
    p.add_argument("--fake-die-after-requests", type=int, default=None)
    p.add_argument("--fake-fail-every", type=int, default=None)
    p.add_argument("--fake-reset", choices=["ok", "404", "false", "false-then-ok", "external-false"], default="ok")
    p.add_argument("--fake-children", type=int, default=0)
    p.add_argument("--fake-engine-exit-after", type=float, default=None)
    p.add_argument("--fake-engine-forks", type=float, default=None)
    p.add_argument("--fake-fatal-after-requests", type=int, default=None)
    p.add_argument("--fake-hang-after-requests", type=int, default=None)
    p.add_argument("--fake-restart-after-requests", type=int, default=None)
    for switch in ("crash-on-start", "never-ready", "hang", "fail-requests", "garbage-metrics"):
        p.add_argument(f"--fake-{switch}", action="store_true")
    for switch in ("no-prefix-metrics", "wrong-mode", "ignore-sigterm", "log-noise", "no-tokenize", "external-tier"):
        p.add_argument(f"--fake-{switch}", action="store_true")
    for switch in ("fatal-on-start", "no-cache-config", "no-request-counter", "model-tokenizer", "tier-survives-reset"):
        p.add_argument(f"--fake-{switch}", action="store_true")
    p.add_argument("--fake-if-log", action="append", default=[], metavar="'TEXT ARGS'")
    p.add_argument("--fake-refuse", action="append", default=[], metavar="FLAG")
    p.add_argument("--fake-bench-worker", action="store_true")
    p.add_argument("--fake-tls", default="", metavar="CERT,KEY")
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _unknown = p.parse_known_args(argv)
    extra: list[str] = []
    for spec in args.fake_if_log:
        text, *more = shlex.split(spec)
        if text in stdout_target():
            extra += more
    if extra:
        args, _unknown = p.parse_known_args(argv + extra)
    words = argv + extra
    args.refused = [w for w in words if any(w == flag or w.startswith(f"{flag}=") for flag in args.fake_refuse)]
    return args


def stdout_target() -> str:
    """The file this process's stdout goes to (its log, when launched by pytest-apc); "" when unknown."""
    try:
        return os.readlink("/proc/self/fd/1")
    except OSError:
        return ""


def log_noise() -> None:
    for i in range(100):
        kind = i % 5
        if kind == 0:
            log("")
        elif kind == 1:
            log(f"WARNING noise {i}: Ünïcödé ✓ 日本語テキスト — ≥ ∞ 🚀")
        elif kind == 2:
            sys.stdout.flush()
            sys.stdout.buffer.write(b"noise %d: invalid utf-8 \xff\xfe\xc3\x28 \x80\x81\n" % i)
            sys.stdout.buffer.flush()
        elif kind == 3:
            log(f"\x1b[33mDEBUG noise {i}\x1b[0m\tcarriage\rreturn {'x' * 300}")
        else:
            log(f"INFO noise {i}: loading weights shard {i}/100 (fake)")


def fatal_on_start() -> None:
    """What vLLM printed on a 2-GPU host whose all-reduce needs NVLink multicast; then it spun forever."""
    worker = f"(Worker_TP0 pid={PID})"
    log(f"{worker} INFO [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)")
    log(f"{worker} ERROR [multiproc_executor.py:1] WorkerProc hit an exception.")
    log(f"{worker} ERROR Traceback (most recent call last):")
    log(f'{worker} ERROR   File "vllm/distributed/device_communicators/custom_all_reduce.py", line 1, in all_reduce')
    log(f"{worker} ERROR torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
    while True:
        log(f"{worker} #0 c10::cuda::CUDAKernelLaunchRegistry (fake C++ frame)")
        time.sleep(1.0)


def on_sigterm(signum: int, frame: Any) -> None:
    os.write(1, b"INFO fake vLLM shutting down\n")  # os.write: print() is not reentrant-safe in handlers
    os._exit(0)


def spawn_engine(code: str, note: str = "") -> None:
    """A child process titled as vLLM's engine (the title is what the plugin watches), running `code`."""
    engine = subprocess.Popen(["VLLM::EngineCore_DP0", "-c", code], executable=sys.executable)
    log(f"INFO fake engine pid={engine.pid}{note}")


def bench_worker(hang: bool) -> int:
    """The benchmark worker's side: the real worker (same pid, so the children and an ignored SIGTERM stay),
    or one that reads a request (one JSON object a line), says so in the run's log and never answers."""
    if not hang:
        log("INFO fake benchmark worker: the real worker takes over")
        os.execv(sys.executable, [sys.executable, "-m", "pytest_apc.measure.bench_worker", "--worker"])
    request = json.loads(sys.stdin.readline() or "{}")
    if "log" in request:
        with open(request["log"], "a") as run_log:
            run_log.write("fake benchmark worker: hung, this request is never answered\n")
    log(f"INFO fake benchmark worker: read {request}, never answering")
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.refused:
        print(f"usage: {sys.argv[0]} [options]", file=sys.stderr)
        print(f"{sys.argv[0]}: error: unrecognized arguments: {' '.join(args.refused)}", file=sys.stderr)
        return 2
    log(f"INFO fake vLLM starting (pid={PID})")
    if os.path.isabs(args.model) and not os.path.isdir(args.model):  # vLLM takes it for a hub id and fails
        print(
            f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{args.model}'",
            file=sys.stderr,
        )
        return 1
    if os.environ.get("VLLM_API_KEY"):
        log("INFO fake: an API key is required on the /v1 routes (VLLM_API_KEY)")
    if args.fake_model_tokenizer:
        use_model_tokenizer(args.model)
    for _ in range(args.fake_children):  # before SIG_IGN: an ignored disposition survives exec
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(100000)"])
        log(f"INFO fake child pid={child.pid}")
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_sigterm)
    if args.fake_engine_exit_after is not None:
        spawn_engine(f"import time; time.sleep({args.fake_engine_exit_after}); raise SystemExit(1)")
    if args.fake_engine_forks is not None:
        code = (
            "import os, time\n"
            f"end = time.monotonic() + {args.fake_engine_forks}\n"
            "while time.monotonic() < end:\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(0.3); os._exit(0)\n"
            "    time.sleep(0.1)\n"
            "    try:\n"
            "        while os.waitpid(-1, os.WNOHANG)[0] > 0: pass\n"
            "    except ChildProcessError: pass\n"
            "time.sleep(100000)\n"
        )
        spawn_engine(code, f" (forking helpers for {args.fake_engine_forks} s)")
    if args.fake_log_noise:
        log_noise()
    time.sleep(max(args.fake_startup_delay, 0.0))
    if args.fake_fatal_on_start:
        fatal_on_start()
    if args.fake_crash_on_start:
        sys.stdout.flush()
        print("Traceback (most recent call last):\nRuntimeError: CUDA out of memory (fake)", file=sys.stderr)
        sys.stderr.flush()
        return 3
    if args.fake_bench_worker:
        return bench_worker(args.fake_hang)
    per_request = KV_CACHE_TOKENS / args.max_model_len
    log(
        f"(EngineCore pid={PID}) INFO [kv_cache_utils.py:1] CPU KV cache size: {KV_CACHE_TOKENS:,} tokens, "
        f"Maximum concurrency for {args.max_model_len:,} tokens per request: {per_request:.2f}x"
    )
    engine = Engine(
        args.enable_prefix_caching, args.block_size, args.fake_external_tier, args.num_gpu_blocks_override,
        args.kv_offloading_size, args.fake_tier_survives_reset, args.fake_restart_after_requests,
    )  # fmt: skip
    engine.hash_algo = args.prefix_caching_hash_algo
    server = FakeServer((args.host, args.port), args, engine)
    scheme = "http"
    if args.fake_tls:  # as vLLM's --ssl-certfile/--ssl-keyfile: https on the same port
        import ssl

        cert, key = args.fake_tls.split(",")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    log(f"INFO Starting vLLM server on {scheme}://{args.host}:{server.server_address[1]}")
    log("INFO:     Application startup complete.")
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        log("INFO fake vLLM shutting down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
