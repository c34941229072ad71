#!/usr/bin/env python3
"""Drive the embedded CPU default's C/D workload against two running servers (APC on and off, started as
pytest-apc starts them) with vLLM's own benchmark, and log per run what the page's tables read.

    python drive.py --on PORT --off PORT --api-pid PID --runs N --levels 1,4,8 --before c --out DIR

Per run and level: what ``--before`` names (a comma-separated list, taken in turn from one run to the
next): ``c``, a C run on the APC-off server; ``idle``, a pause of ``--idle`` seconds; ``none``, nothing;
then a reset of the APC-on server's prefix cache and a D run on it. Each D run's line gives its median and
highest TTFT, the requests past the first batch whose TTFT is over 3x the median (a late burst), the
hypervisor's steal ticks per core, the CPU time of the API server (``--api-pid``) and of this process, and
their minor page faults. Where ftrace is mounted (/sys/kernel/tracing, sched_switch on, clock mono), a run
with a burst or a concurrency-1 median over 25 ms keeps the trace beside its result. The log goes to
standard output; ``collect.py`` reads it with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from pytest_apc.measure import bench_worker
from pytest_apc.workload.models import ensure_tiny_model

TRACE = Path("/sys/kernel/tracing/trace")


def _steal() -> list[int]:
    return [int(line.split()[8]) for line in open("/proc/stat") if line.startswith("cpu") and line[3] != " "]


def _process(pid: int) -> tuple[int, int]:
    """(CPU time in clock ticks, minor faults) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[7])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--on", "--off", "--api-pid", "--runs"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--levels", default="1,4,8")
    parser.add_argument("--before", default="c", help="c, idle or none; a comma-separated list is taken in turn")
    parser.add_argument("--idle", type=float, default=6.0, help="seconds of --before idle")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_tiny_model()
    sent: dict[str, object] = {}
    bench_worker._memoize_prompts(sent)
    from vllm.benchmarks.serve import main as bench

    options = bench_worker._parser()

    def run(port: int, level: int, name: str) -> None:
        argv = (
            f"--backend openai-chat --endpoint /v1/chat/completions --base-url http://127.0.0.1:{port} "
            f"--model {model} --tokenizer {model} --served-model-name apc-model --dataset-name prefix_repetition "
            "--prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 64 --prefix-repetition-num-prefixes 1 "
            f"--prefix-repetition-output-len 16 --num-prompts 30 --max-concurrency {level} --request-rate inf --seed 0 "
            "--num-warmups 0 --ready-check-timeout-sec 0 --ignore-eos --temperature 0 --save-result --save-detailed "
            f"--result-dir {args.out} --result-filename {name}.json --disable-tqdm"
        ).split()
        bench_worker.quiet_heap()
        if TRACE.exists():
            TRACE.write_text("")
        steal0, (api0, faults0), mine0 = _steal(), _process(args.api_pid), os.times()
        client_faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with open(os.devnull, "w") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                bench(options.parse_args(argv))
            finally:
                sys.stdout = stdout
        steal1, (api1, faults1), mine1 = _steal(), _process(args.api_pid), os.times()
        client_faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = json.loads((args.out / f"{name}.json").read_text())
        ttfts = np.array(result["ttfts"]) * 1000
        median = float(np.median(ttfts))
        late = [i for i in range(level, len(ttfts)) if ttfts[i] > max(100, 3 * median)]
        itl_sums = [sum(gaps) * 1000 for gaps in result["itls"]]
        keep = port == args.on and (bool(late) or (level == 1 and median > 25))
        if keep and TRACE.exists():
            (args.out / f"{name}.trace").write_text(TRACE.read_text())
        bursts = [(i, round(ttfts[i]), round(itl_sums[i])) for i in late]
        print(
            f"{name} median {median:.1f} max {ttfts.max():.1f} odd {bursts} "
            f"steal_ticks {[b - a for a, b in zip(steal0, steal1, strict=True)]} api_cpu_ms {(api1 - api0) * 10} "
            f"client_cpu_ms {(mine1.user + mine1.system - mine0.user - mine0.system) * 1000:.0f} "
            f"dur_ms {result['duration'] * 1000:.0f} "
            f"minflt api {faults1 - faults0} client {client_faults1 - client_faults0}" + (" FLAG" if keep else ""),
            flush=True,
        )

    def call(url: str, post: bool = False) -> None:
        urllib.request.urlopen(urllib.request.Request(url, data=b"" if post else None)).read()

    turns = args.before.split(",")
    for i in range(args.runs):
        before = turns[i % len(turns)]
        for level in map(int, args.levels.split(",")):
            if before == "c":
                run(args.off, level, f"i{i:03d}-C-c{level}")
            elif before == "idle":
                time.sleep(args.idle)
            call(f"http://127.0.0.1:{args.on}/reset_prefix_cache", post=True)
            time.sleep(0.2)
            call(f"http://127.0.0.1:{args.on}/metrics")
            run(args.on, level, f"i{i:03d}-D-c{level}")
            call(f"http://127.0.0.1:{args.on}/metrics")
    os._exit(0)  # vLLM's import leaves threads that print at teardown


if __name__ == "__main__":
    raise SystemExit(main())
