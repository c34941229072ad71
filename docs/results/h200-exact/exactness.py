"""Does a vLLM server give a prompt the same greedy tokens whatever the batch and whatever its cache?

A measurement, not part of the plugin: each server (already started) gets the same token-id prompts (one
shared prefix, a unique suffix each) several times, at concurrency 8 and alone, plain (served from the
prefix cache after the first request) and with a cache_salt of each request's own (computed without the
cache). Every answer is written as token ids with the top-k logprobs of each position; compare.py says,
per pair of runs, how many requests are identical and where the others part.

usage: exactness.py OUT.json NAME=URL:KIND ...   KIND: on (APC on), off (APC off), fault (APC on, fault)
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import sys
import threading
import time

import requests

PREFIX, SUFFIX, REQUESTS, TOKENS, TOP_K, VOCAB = 8192, 512, 24, 48, 5, 4096


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(16, VOCAB - 16) for _ in range(PREFIX)]
    return [shared + [rng.randrange(16, VOCAB - 16) for _ in range(SUFFIX)] for _ in range(REQUESTS)]


def ask(url: str, prompt: list[int], salt: str | None) -> dict:
    body = {
        "model": "m", "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
        "logprobs": TOP_K, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    if salt:
        body["cache_salt"] = salt
    start = time.monotonic()
    reply = requests.post(f"{url}/v1/completions", json=body, timeout=900).json()
    lp = reply["choices"][0]["logprobs"]
    tokens = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
    top = [{int(k.split(":", 1)[1]): v for k, v in (d or {}).items()} for d in lp["top_logprobs"]]
    return {"tokens": tokens, "top": [[[k, v] for k, v in d.items()] for d in top], "s": time.monotonic() - start}


def run(url: str, concurrency: int, salt: str | None) -> list[dict]:
    with cf.ThreadPoolExecutor(concurrency) as pool:
        jobs = [pool.submit(ask, url, p, f"{salt}-{i}" if salt else None) for i, p in enumerate(prompts())]
        return [j.result() for j in jobs]


def reset(url: str) -> None:
    requests.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()


PLANS = {
    # uncached under load twice, uncached alone, then cached as the pair's D run sends it (cold, then warm), alone
    "on": [("reset", 0, None), ("U8a", 8, "a"), ("U8b", 8, "b"), ("U1", 1, "c"), ("reset", 0, None),
           ("C8", 8, None), ("C8w", 8, None), ("C1", 1, None)],
    "off": [("O8", 8, None), ("O1", 1, None)],
    "fault": [("reset", 0, None), ("F8", 8, None), ("F1", 1, None)],
}  # fmt: skip


def main() -> None:
    out, servers = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    results: dict = {"prompt": [PREFIX, SUFFIX, REQUESTS, TOKENS, TOP_K], "runs": {}}
    lock = threading.Lock()

    def server(name: str, spec: str) -> None:
        url, kind = spec.rsplit(":", 1)
        for step, concurrency, salt in PLANS[kind]:
            if step == "reset":
                reset(url)
                continue
            start = time.monotonic()
            answers = run(url, concurrency, f"{name}-{salt}" if salt else None)
            took = time.monotonic() - start
            with lock:
                results["runs"][f"{name}/{step}"] = answers
                print(f"{name}/{step}: {took:.1f} s", flush=True)
                with open(out, "w") as f:
                    json.dump(results, f)

    with cf.ThreadPoolExecutor(len(servers)) as pool:
        for job in [pool.submit(server, name, spec) for name, spec in servers]:
            job.result()


if __name__ == "__main__":
    main()
