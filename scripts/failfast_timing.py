#!/usr/bin/env python3
"""How fast a doomed server fails the suite: a benchmark, not a test (numbers for docs/troubleshooting.md).

Runs pytest-apc against the fault-injecting fake server (tests/fake_vllm.py) with one APC-off server and
a 600 s startup timeout, and times, from the server log and the pytest process:

* fatal-on-start: from the first fatal line in the server log (a worker traceback, the API process alive)
  to the end of the pytest run that fails on it;
* incomplete-metrics: from the server's first 200 on /health (it answers, but /metrics has no
  vllm:cache_config_info) to the end of the pytest run;
* engine-death-mid-run: from the engine's fatal line during a benchmark to the end of the pytest run.

    python scripts/failfast_timing.py [--repeat N] [--json OUT]

The end of the pytest run includes stopping the server and writing the results: the times are upper
bounds of the time to the failed test. Without the watchdog each of the first two waited for the startup
timeout, the third for the benchmark timeout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fake_vllm.py"
SUITE = "import pytest\n\n@pytest.mark.apc_cases('C')\ndef test_off(apc_run):\n    assert apc_run.repeats\n"
SCENARIOS = {
    # name: (fake switches, extra options, the log line the clock starts at)
    "fatal-on-start": (["--fake-fatal-on-start"], [], "WorkerProc hit an exception"),
    "incomplete-metrics": (["--fake-no-cache-config"], [], '"GET /health HTTP/1.1" 200'),
    "engine-death-mid-run": (
        ["--fake-fatal-after-requests", "2"],
        ["--apc-set=num_prompts=30", "--apc-set=bench_timeout=3600"],
        "EngineCore encountered a fatal error",
    ),
}


LABELS = {
    "fatal-on-start": "a fatal line in the log while starting",
    "incomplete-metrics": "answers, but /metrics lacks vllm:cache_config_info",
    "engine-death-mid-run": "the engine dies during a benchmark",
}


def markdown_rows(scenarios: dict[str, dict[str, Any]]) -> list[str]:
    """The rows of the table in docs/troubleshooting.md (a docs test compares them with the page)."""
    return [
        f"| {LABELS[name]} (`{name}`) | {found['median_s']} | {', '.join(map(str, found['seconds']))} |"
        for name, found in scenarios.items()
    ]


def run_once(name: str) -> float:
    switches, extra, start_line = SCENARIOS[name]
    with tempfile.TemporaryDirectory(prefix="apc-failfast-") as tmp:
        root = Path(tmp)
        (root / "test_suite.py").write_text(SUITE)
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py", "--cpu-node",
                f"--apc-set=server_command={{python}} {FAKE}", "--apc-length-scale=0.01", "--apc-set=num_prompts=4",
                "--apc-set=startup_timeout=600", "--apc-set=stop_timeout=3", *extra,
                *(f"--apc-server-arg={s}" for s in switches)]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen: float | None = None
        while proc.poll() is None:
            if seen is None:
                logs = list(root.glob("apc-results/*/server-apc-off.log"))
                if logs and start_line in logs[0].read_text(errors="replace"):
                    seen = time.monotonic()
            time.sleep(0.05)
        ended = time.monotonic()
        if proc.returncode != 1 or seen is None:
            raise SystemExit(f"{name}: pytest exited {proc.returncode}, start line seen: {seen is not None}")
        return ended - seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here (docs/results/failfast/failfast.json)")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        times = [run_once(name) for _ in range(args.repeat)]
        results[name] = {"seconds": [round(t, 2) for t in times], "median_s": round(float(np.median(times)), 2)}
        print(f"{name}: median {results[name]['median_s']} s over {args.repeat} runs {results[name]['seconds']}")
    if args.json:
        document = {
            "what": "seconds from the first sign (log line) to the end of the failing pytest run",
            "command": f"python scripts/failfast_timing.py --repeat {args.repeat}",
            "startup_timeout_s": 600,
            "scenarios": results,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    print("\n".join(markdown_rows(results)))


if __name__ == "__main__":
    main()
