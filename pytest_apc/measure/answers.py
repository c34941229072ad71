"""The answers probe: a few of a run's prompts sent again after its last repeat, one at a time, greedy,
with each generated token's top-k logprobs, so that an answer served from the prefix cache can be
compared with the answer the same prompt gets without it.

On an APC-on server every probed prompt is sent twice: plain (its blocks are still cached from the run: the
*cached* answer), then with a ``cache_salt`` of its own (vLLM then hashes its blocks apart from every other
request's, so nothing is served from the cache: the *uncached* answer). On an APC-off server it is
sent once (uncached). Sent after the run's last counter scrape, the probe changes none of the run's
numbers, and every later run starts from a verified cache reset.

Tokens come back as ids (``return_tokens_as_token_ids``), so that a token that is half of a UTF-8
character cannot shift the comparison. The logprobs are what tell a near tie (two tokens about equally
likely, where floating-point noise may pick either) from a wrong answer: ``verdicts/answers.py``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from pytest_apc.config import flag_value
from pytest_apc.serving.deployment import EXACT_DTYPE
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.serving.launch_env import BATCH_INVARIANT

TOKEN_ID_PREFIX = "token_id:"


def server_dtype(command: Sequence[str]) -> str | None:
    """The ``--dtype`` a server command line asks for (the last one given), None where it asks for none."""
    return flag_value(command, ("--dtype",))


def enforce_eager(command: Sequence[str]) -> bool:
    """Whether a server command line runs the model eagerly (``--enforce-eager``, the last word given)."""
    eager = False
    for part in command:
        if part in ("--enforce-eager", "--enforce-eager=true", "--enforce-eager=True"):
            eager = True
        elif part in ("--no-enforce-eager", "--enforce-eager=false", "--enforce-eager=False"):
            eager = False
    return eager


def exact_server(server: ServerInfo, alone: bool = True) -> str | None:
    """Why ``server`` computes the same tokens for a prompt whatever the batch, cached or not, or None where
    that is not known. vLLM's CPU build (its start-up line reports a CPU KV cache) serving float32 does,
    also the same tokens as another such server: its default, bfloat16, parts 1 or 2 requests of 30
    between two uncached runs of 8 concurrent requests. vLLM's batch-invariant mode does on one server
    (``alone``): on a GPU an APC-off server in that mode still parts from an APC-on one. Not with
    --enforce-eager: there (vLLM 0.26, one GPU) 5 of 8 prompts sent alone parted at a near tie between
    their cached and uncached answers, as did 1 or 2 of 16 requests under load, in every session."""
    if (server.kv_cache_line or "").startswith("CPU ") and server_dtype(server.command) == EXACT_DTYPE:
        return f"vLLM's CPU build serving {EXACT_DTYPE}"
    if alone and server.batch_invariant and not enforce_eager(server.command):
        return f"vLLM's batch-invariant mode ({BATCH_INVARIANT}=1)"
    return None


class ProbeError(RuntimeError):
    """A probe request that did not give an answer to compare."""


# What reading a reply's answer raises where it carries no token logprobs, or tokens that are not ids
# (``logprob_tokens``): the probe's reply, or a benchmark request's stream, then has no answer to compare.
NO_LOGPROBS = (KeyError, IndexError, TypeError, ValueError)


@dataclass
class Answer:
    """One greedy answer: its token ids, its text, and each position's top-k token ids with logprobs."""

    tokens: list[int]
    text: str
    top: list[dict[int, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "text": self.text, "top": [[[t, lp] for t, lp in p.items()] for p in self.top]}

    def first(self, count: int) -> Answer:
        """Its first ``count`` tokens with their top-k (the text stays whole): what the near-tie rule judges of
        a benchmark request's answer (``answers_tokens``)."""
        return Answer(self.tokens[:count], self.text, self.top[:count])

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Answer:
        # The results file keeps each position as [token, logprob] pairs; the store (dataclasses.asdict, then
        # JSON) as an object whose keys became strings.
        top = [
            {int(t): float(lp) for t, lp in (position.items() if isinstance(position, dict) else position)}
            for position in data.get("top") or []
        ]
        return cls([int(t) for t in data.get("tokens") or []], str(data.get("text") or ""), top)


@dataclass
class Probe:
    """One probed prompt of a run: where it was in the run's requests, and its answers."""

    index: int
    uncached: Answer
    cached: Answer | None = None  # APC-on servers only
    prompt_chars: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "prompt_chars": self.prompt_chars,
            "uncached": self.uncached.to_json(),
            "cached": self.cached.to_json() if self.cached else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Probe:
        cached = data.get("cached")
        return cls(
            int(data["index"]),
            Answer.from_json(data["uncached"]),
            Answer.from_json(cached) if cached else None,
            int(data.get("prompt_chars") or 0),
        )


def probe_indices(num_prompts: int, count: int) -> list[int]:
    """``count`` request indices spread evenly over a run of ``num_prompts`` (the first and last included)."""
    count = min(count, num_prompts)
    if count <= 1:
        return [0][:count]
    return sorted({round(i * (num_prompts - 1) / (count - 1)) for i in range(count)})


def request_body(
    model: str, prompt: str | list[dict[str, Any]], *, max_tokens: int, top_k: int, salt: str | None = None
) -> dict[str, Any]:
    """The chat request of one probe: the prompt as the benchmark sends it (a text prompt as one user
    message of one text part, a message list as it is), greedy, a fixed length, top-k logprobs, tokens as
    ids."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": top_k,
        "return_tokens_as_token_ids": True,
    }
    if salt is not None:
        body["cache_salt"] = salt
    return body


def curl_command(url: str, body: Mapping[str, Any]) -> str:
    """The probe request as a command to paste (the prompt shortened)."""
    shown = dict(body)
    messages = [dict(m) for m in body.get("messages", [])]
    for message in messages:
        content = json.dumps(message.get("content", ""))
        if len(content) > 60:
            message["content"] = f"<the run's prompt: {content[:40]}... ({len(content)} characters)>"
    shown["messages"] = messages
    return shlex.join(
        ["curl", "-s", f"{url}/v1/chat/completions", "-H", "Content-Type: application/json", "-d", json.dumps(shown)]
    )


def parse_answer(reply: Mapping[str, Any]) -> Answer:
    """An answer out of a chat completion with logprobs and token ids."""
    try:
        choice = reply["choices"][0]
        tokens, top = logprob_tokens(choice["logprobs"]["content"])
        text = str(choice["message"].get("content") or "")
    except NO_LOGPROBS as err:
        raise ProbeError(f"the answer has no token logprobs ({type(err).__name__}: {err}): {str(reply)[:300]}") from err
    return Answer(tokens, text, top)


def logprob_tokens(content: Iterable[Mapping[str, Any]]) -> tuple[list[int], list[dict[int, float]]]:
    """The token ids of an OpenAI ``logprobs.content`` list (one entry a generated token) and each position's
    top-k token ids with their logprobs; an entry without them, or with tokens that are not ids, raises one
    of :data:`NO_LOGPROBS`. Read from a whole reply (the probe) and from a stream's chunks (the
    benchmark worker)."""
    tokens: list[int] = []
    top: list[dict[int, float]] = []
    for item in content:
        tokens.append(token_id(item["token"]))
        top.append({token_id(t["token"]): float(t["logprob"]) for t in item.get("top_logprobs") or []})
    return tokens, top


def token_id(token: str) -> int:
    """A token id out of a logprobs entry's token, as the server writes it with return_tokens_as_token_ids."""
    if not str(token).startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"token {token!r} is not an id (the server ignored return_tokens_as_token_ids)")
    return int(str(token)[len(TOKEN_ID_PREFIX) :])


def ask(
    http: requests.Session, url: str, body: Mapping[str, Any], headers: Mapping[str, str], timeout: float
) -> Answer:
    """One probe request; a failed one is a :class:`ProbeError` naming the status and the request."""
    try:
        response = http.post(f"{url}/v1/chat/completions", json=body, headers=dict(headers), timeout=timeout)
    except requests.RequestException as err:
        raise ProbeError(f"probe request failed: {err}\nrequest: {curl_command(url, body)}") from err
    if response.status_code != 200:
        raise ProbeError(
            f"probe request answered HTTP {response.status_code}: {response.text.strip()[:300]}\n"
            f"request: {curl_command(url, body)}"
        )
    try:
        reply = response.json()
    except ValueError as err:
        raise ProbeError(f"probe answer is not JSON ({err}): {response.text[:300]}") from err
    return parse_answer(reply)


def run_probe(
    http: requests.Session,
    url: str,
    model: str,
    prompts: Sequence[str | list[dict[str, Any]]],
    *,
    apc: bool,
    count: int,
    max_tokens: int,
    top_k: int,
    salt_prefix: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> list[Probe]:
    """Probe ``count`` of the run's ``prompts`` (in the order the benchmark sent them) on the server at ``url``."""
    probes = []
    for index in probe_indices(len(prompts), count):
        prompt = prompts[index]

        def send(salt: str | None, prompt: str | list[dict[str, Any]] = prompt) -> Answer:
            body = request_body(model, prompt, max_tokens=max_tokens, top_k=top_k, salt=salt)
            return ask(http, url, body, headers or {}, timeout)

        # Cached first: the salted request's blocks could evict the run's from a small cache.
        cached = send(None) if apc else None
        uncached = send(f"{salt_prefix}-{index}" if apc else None)
        probes.append(
            Probe(index, uncached, cached, len(json.dumps(prompt)) if isinstance(prompt, list) else len(prompt))
        )
    return probes
