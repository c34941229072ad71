"""Faults a real server can have, injected with tests/fake_vllm.py: each is a loud, exact failure
that leaves no process behind. (What works is proven against real vLLM in test_e2e_cpu.py.)"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAKE_VLLM

SUITE = """
import pytest
from pytest_apc import verdicts

pytestmark = pytest.mark.apc

@pytest.mark.apc_cases("CD")
def test_measured(apc_run):
    assert apc_run.repeats

@pytest.mark.apc_cases("C")
def test_off(apc_run, apc_assert):
    apc_assert(verdicts.apc_really_off(apc_run))
"""


def fake_args(*fake_flags: str) -> list[str]:
    args = [
        "--cpu-node",
        f"--apc-set=server_command={{python}} {FAKE_VLLM}",
        "--apc-set=num_prompts=4",
        "--apc-length-scale=0.01",
        "--apc-set=startup_timeout=20",
        "--apc-set=stop_timeout=3",
        "-p",
        "no:randomly",
    ]
    return args + [f"--apc-server-arg={flag}" for flag in fake_flags]


def one_verdict_test(tmp_path, cases: str, fixture: str, check: str) -> None:
    """A suite of one test: ``@pytest.mark.apc_cases(<cases>)`` asserting ``verdict.<check>(<fixture>)``."""
    (tmp_path / "test_one.py").write_text(
        "import pytest\nfrom pytest_apc import verdicts\n\n"
        f"@pytest.mark.apc_cases({cases})\ndef test_one({fixture}, apc_assert):\n"
        f"    apc_assert(verdicts.{check}({fixture}))\n"
    )


@pytest.fixture
def suite(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    return tmp_path


def test_healthy_fake_passes_and_records_launches(suite, run_inner) -> None:
    inner = run_inner(*fake_args(), "-v")
    assert inner.ret == 0, inner.output
    assert "3 passed" in inner.output


def test_crash_on_start_fails_fast_with_log_tail_and_command(suite, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(*fake_args("--fake-crash-on-start"))
    assert inner.ret == 1
    assert time.monotonic() - started < 60
    assert "server exited with code 3 while starting" in inner.output
    assert "CUDA out of memory (fake)" in inner.output  # the log tail
    assert "command: " in inner.output
    assert "fake_vllm.py" in inner.output


def test_never_ready_times_out_and_is_killed(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-never-ready"), "--apc-set=startup_timeout=4")
    assert inner.ret == 1
    assert "was not ready after 4 s (still waiting for /health to return 200)" in inner.output


def test_server_in_the_wrong_mode_is_refused(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-wrong-mode"))
    assert inner.ret == 1
    assert "does not run in the mode it was started for" in inner.output


def test_reset_failure_is_never_measured_warm(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-reset", "false"))
    assert inner.ret == 1
    assert "did not reset its prefix cache" in inner.output
    assert "reset_running_requests=true" in inner.output  # escalated before giving up
    assert "run D-c8 failed" in inner.output


def test_reset_escalation_to_running_requests_succeeds(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-reset", "false-then-ok"))
    assert inner.ret == 0, inner.output


def test_a_vllm_that_refuses_reset_external_is_reset_plainly(suite, run_inner) -> None:
    """vLLM without a KV connector answered false to reset_external before vllm#42693: the plugin then
    resets without it, and says so in runs[].reset."""
    inner = run_inner(*fake_args("--fake-reset", "external-false"))
    assert inner.ret == 0, inner.output
    runs = json.loads(next(suite.glob("apc-results/*/results.json")).read_text())["runs"]
    reset = next(r["reset"] for r in runs if r["apc"])
    assert reset == (
        "POST /reset_prefix_cache?reset_external=true -> HTTP 200 {'success': False}; "
        "POST /reset_prefix_cache -> HTTP 200 {'success': True}"
    )


def test_reset_endpoint_missing(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-reset", "404"))
    assert inner.ret == 1
    assert "has no /reset_prefix_cache (HTTP 404)" in inner.output
    assert "VLLM_SERVER_DEV_MODE=1" in inner.output


def test_failed_requests_fail_the_run_with_rerun_command(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-fail-requests"))
    assert inner.ret == 1
    assert "had failed requests: completed 0 of 4, failed 4" in inner.output
    assert "re-run: " in inner.output
    assert "-m pytest_apc.measure.bench" in inner.output
    assert "0.0x" not in inner.output
    assert "apc: last 40 lines of the apc-on server log" in inner.output  # a live server's log too


def test_some_failed_requests_fail_every_test_of_their_run(suite, run_inner) -> None:
    """One failed request in a run is enough: the run is not measured, so every test that uses it fails
    (with the counts), whatever it checks; no verdict averages the failure away."""
    inner = run_inner(*fake_args("--fake-fail-every", "2"), "-rA")
    assert inner.ret == 1
    assert "3 errors" in inner.output
    assert "passed" not in inner.output.splitlines()[-1]
    for test in ("test_measured[C-c8]", "test_measured[D-c8]", "test_off[C-c8]"):
        assert f"ERROR test_suite.py::{test}" in inner.output
    assert "had failed requests: completed 2 of 4, failed 2" in inner.output
    assert "re-run: " in inner.output


def test_missing_prefix_metrics_fail_the_server_at_once(suite, run_inner) -> None:
    """A server whose /metrics lacks the prefix-cache counters would never let a run be verified: it fails
    as soon as it answers, not after its runs (or the startup timeout)."""
    started = time.monotonic()
    inner = run_inner(*fake_args("--fake-no-prefix-metrics"), "--apc-set=startup_timeout=300", "-rA")
    assert inner.ret == 1
    assert time.monotonic() - started < 120
    assert "apc-off server answers but its /metrics has no prefix_cache_queries, prefix_cache_hits counter" in (
        inner.output
    )
    assert "vllm:prefix_cache_queries_total" in inner.output  # what it looked for
    # Below the failure: how to start its server, and the server log's tail.
    failure = inner.output[inner.output.index("ERROR at setup of test_off[C-c8]") :]
    assert "apc: reproduce" in failure
    assert "apc-off server: " in failure
    assert "fake_vllm.py" in failure
    assert "apc: last 40 lines of the apc-off server log" in failure


def test_a_server_restarted_mid_run_is_named_not_counted(suite, run_inner) -> None:
    """A restart between the scrapes around a run (a pod rescheduled, a supervisor's restart) begins the
    counters again from zero: the run's cached tokens cannot be known, and the failure says why."""
    inner = run_inner(*fake_args("--fake-restart-after-requests=1"), "-rA")
    assert inner.ret == 1
    assert "cannot verify the prefix cache of run C-c8: the server restarted during the run " in inner.output
    assert "(process_start_time_seconds 1700000000.00 -> 1700000060.00)" in inner.output


def test_missing_cache_config_fails_the_server_at_once(suite, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(*fake_args("--fake-no-cache-config"), "--apc-set=startup_timeout=300")
    assert inner.ret == 1
    assert time.monotonic() - started < 120
    assert "server answers but its /metrics has no vllm:cache_config_info" in inner.output
    assert "--disable-log-stats" in inner.output  # the probable cause


def test_a_server_that_serves_another_model_fails_at_once(suite, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(*fake_args("--served-model-name", "other-model"), "--apc-set=startup_timeout=300")
    assert inner.ret == 1
    assert time.monotonic() - started < 120
    assert "server answers but serves ['other-model'], not 'apc-model'" in inner.output


def test_fatal_log_line_while_starting_fails_in_seconds_with_the_first_error(suite, run_inner) -> None:
    """The API process lives on while its worker crashed: the log says so, and the plugin stops waiting."""
    started = time.monotonic()
    inner = run_inner(*fake_args("--fake-fatal-on-start"), "--apc-set=startup_timeout=300")
    assert inner.ret == 1
    assert time.monotonic() - started < 120  # not the 300 s startup timeout
    assert "server will not become ready: its log shows a fatal error: " in inner.output
    assert "WorkerProc hit an exception" in inner.output
    first = inner.output[inner.output.index("--- first error in the server log (line ") :]
    assert "Traceback (most recent call last):" in first
    assert "CUDA error: an illegal memory access was encountered" in first
    assert "likely cause and fix: a multi-GPU all-reduce crash" in inner.output
    assert "--disable-custom-all-reduce" in inner.output
    assert '"fuse_allreduce_rms":false' in inner.output


def test_engine_process_exit_while_starting_fails_in_seconds(suite, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(
        *fake_args("--fake-engine-exit-after", "1", "--fake-startup-delay", "600"), "--apc-set=startup_timeout=300"
    )
    assert inner.ret == 1
    assert time.monotonic() - started < 120
    assert "its engine process VLLM::EngineCore_DP0" in inner.output
    assert "exited while the API server kept running" in inner.output


def test_engine_death_mid_run_stops_the_benchmark_in_seconds(suite, run_inner) -> None:
    """The engine dies during a benchmark but the API process answers /health: its log tells, the
    benchmark is stopped at once (not after --apc-set bench_timeout) and the runs after it error naming it."""
    started = time.monotonic()
    # 30 prompts at concurrency 8: after 2 answers the rest hang, as requests to a dead engine do.
    inner = run_inner(
        *fake_args("--fake-fatal-after-requests", "2"), "--apc-set=num_prompts=30", "--apc-set=bench_timeout=600"
    )
    assert inner.ret == 1
    assert time.monotonic() - started < 150
    assert "benchmark stopped after" in inner.output
    assert "its log shows a fatal error: (EngineCore_DP0 pid=" in inner.output, inner.output[-4000:]
    assert "EngineCore encountered a fatal error" in inner.output
    assert "RuntimeError: fake engine step failed" in inner.output


def test_hung_server_mid_run_stops_the_benchmark(suite, run_inner) -> None:
    """Everything hangs, /health too: after the health grace period the benchmark is stopped."""
    started = time.monotonic()
    inner = run_inner(
        *fake_args("--fake-hang-after-requests", "2"), "--apc-set=num_prompts=30", "--apc-set=bench_timeout=600"
    )
    assert inner.ret == 1
    assert time.monotonic() - started < 200
    assert "has not answered /health with 200 for 3" in inner.output
    assert "its engine is hung or dead" in inner.output


def test_tokenize_failure_is_a_warning_and_names_itself_where_predictions_fail(tmp_path, run_inner) -> None:
    one_verdict_test(tmp_path, "'D'", "apc_run", "cached_tokens_match")
    inner = run_inner(*fake_args("--fake-no-tokenize"))
    assert inner.ret == 1
    assert "WARNING apc-on: /tokenize failed: 404" in inner.output
    assert "cannot predict the hits of run D-c8: block size 16, chat header tokens unknown (/tokenize failed: 404" in (
        inner.output
    )


def test_an_offload_tier_is_reset_too(tmp_path, run_inner) -> None:
    """A server with a KV offload tier keeps prefixes through a plain reset (vllm#57727): the plugin
    asks for reset_external, so D at 1 and 2 (same prefix, one after the other) both start cold and
    hit alike (a tier left warm gives the second run one more request's share)."""
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n@pytest.mark.apc_cases('D', sweep=True)\ndef test_one(apc_run):\n    assert apc_run.repeats\n"
    )
    inner = run_inner(*fake_args("--fake-external-tier"), "--apc-set=sweep_concurrency=1,2")
    assert inner.ret == 0, inner.output
    runs = json.loads(next(tmp_path.glob("apc-results/*/results.json")).read_text())["runs"]
    reset = "POST /reset_prefix_cache?reset_external=true -> HTTP 200 {'success': True}"
    assert [r["reset"] for r in runs] == [reset, reset]
    assert runs[0]["prefix_cache_hits"] == runs[1]["prefix_cache_hits"] > 0


def test_server_death_fails_that_run_and_the_rest_fast(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-die-after-requests", "2"))
    assert inner.ret == 1
    assert "fake engine died" in inner.output
    assert "the server died" in inner.output


def test_sigterm_ignoring_server_with_children_leaves_nothing(suite, run_inner) -> None:
    inner = run_inner(*fake_args("--fake-ignore-sigterm", "--fake-children", "3"))
    assert inner.ret == 0, inner.output  # run_inner checks that no process is left behind


# SIGKILL (a scheduler's kill after its grace period, a crash, the OOM killer): pytest runs no teardown, and
# the server, its children and the benchmark worker are in process groups of their own; the run's guard
# stops them.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
@pytest.mark.parametrize(
    ("phase", "extra"),
    [
        # Ctrl-C while the server loads (it never gets ready); its children must go too.
        ("startup", ("--fake-never-ready", "--fake-children", "2")),
        # Ctrl-C while the benchmark runs (30,000 output tokens at 1 ms each).
        ("bench", ("--fake-children", "2", "--fake-ignore-sigterm")),
    ],
)
def test_interrupted_pytest_leaves_nothing(suite, run_inner, sig, phase, extra) -> None:
    if signal.getsignal(sig) is signal.SIG_IGN:
        # A background job of a non-interactive shell (`cmd &`) ignores SIGINT, and so does every process it
        # starts, the inner pytest included: a Ctrl-C cannot reach it from here.
        pytest.skip(f"{signal.Signals(sig).name} is ignored by this process (a background job?)")
    inner = run_inner(*fake_args(*extra), "--apc-set=output_len=3000000", "--apc-set=startup_timeout=300", wait=False)
    marker = "apc-results/*/server-*.log" if phase == "startup" else "apc-results/*/bench/*.log"
    inner.wait_for(suite, marker, f"the {phase} phase")
    time.sleep(1.5)
    running = [" ".join(proc.cmdline()) for proc in inner.leftovers(settle=0)]
    assert any("fake_vllm.py --model" in cmd for cmd in running), running  # the server, its guard beside it
    assert any("pytest_apc.serving.guard" in cmd for cmd in running), running
    inner.proc.send_signal(sig)
    inner.wait()
    assert inner.ret != 0, inner.output[-4000:]
    if sig == signal.SIGKILL:
        assert inner.ret == -signal.SIGKILL
    assert not inner.leftovers(), "interrupted run left processes behind"


def test_a_flag_the_server_does_not_know_fails_at_once_with_its_complaint(suite, run_inner) -> None:
    started = time.monotonic()
    inner = run_inner(*fake_args("--fake-refuse=--no-such-flag", "--no-such-flag"), "--apc-set=startup_timeout=300")
    assert inner.ret == 1
    assert time.monotonic() - started < 60
    assert "server exited with code 2 while starting" in inner.output
    assert "error: unrecognized arguments: --no-such-flag" in inner.output  # the log tail


def fake_worker(tmp_path, *flags: str) -> None:
    """The inner run's benchmark worker is tests/fake_vllm.py --fake-bench-worker with ``flags``: a conftest.py
    sets the worker's command (the worker has no setting of its own)."""
    (tmp_path / "conftest.py").write_text(
        "import sys\nfrom pytest_apc.measure import bench\n\n"
        f"bench.WORKER_COMMAND = (sys.executable, {str(FAKE_VLLM)!r}, '--fake-bench-worker', *{flags!r})\n"
    )


def test_a_benchmark_worker_that_crashes_at_start_fails_its_runs_with_its_log(suite, run_inner) -> None:
    fake_worker(suite, "--fake-crash-on-start")
    inner = run_inner(*fake_args())
    assert inner.ret == 1
    assert "benchmark process died with exit code 3" in inner.output
    assert "bench-worker.log\n--- last lines of the benchmark worker log ---" in inner.output
    assert "RuntimeError: CUDA out of memory (fake)" in inner.output  # why, from the worker's own log


def test_sigterm_ignoring_benchmark_worker_with_children_leaves_nothing(suite, run_inner) -> None:
    fake_worker(suite, "--fake-ignore-sigterm", "--fake-children", "3")
    inner = run_inner(*fake_args())
    assert inner.ret == 0, inner.output  # run_inner checks that no process is left behind
    assert (
        "fake benchmark worker: the real worker takes over"
        in next(suite.glob("apc-results/*/bench-worker/*.log")).read_text()
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_hung_benchmark_leaves_no_worker(suite, run_inner, sig) -> None:
    """Ctrl-C (or SIGTERM) while the benchmark worker hangs, ignoring SIGTERM, with children."""
    if signal.getsignal(sig) is signal.SIG_IGN:
        pytest.skip(f"{signal.Signals(sig).name} is ignored by this process (a background job?)")
    fake_worker(suite, "--fake-hang", "--fake-children", "2", "--fake-ignore-sigterm")
    inner = run_inner(*fake_args(), wait=False)
    inner.wait_for(suite, "apc-results/*/bench/*.log", "the benchmark")
    time.sleep(1.5)
    inner.proc.send_signal(sig)
    signalled = time.monotonic()
    inner.wait()
    assert inner.ret != 0, inner.output[-4000:]
    assert time.monotonic() - signalled < 60
    assert not inner.leftovers(), "interrupted run left its benchmark worker behind"


def _start_fake(tmp_path, *flags: str, api_key: str = ""):
    """A fake server started by the test itself, as a server run elsewhere would be (with ``api_key``, its
    /v1 routes want it, as vLLM's with VLLM_API_KEY)."""
    import re
    import subprocess
    import sys

    log = tmp_path / f"external-{len(list(tmp_path.glob('external-*')))}.log"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **({"VLLM_API_KEY": api_key} if api_key else {})}
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_VLLM), "--model", "m", "--served-model-name", "apc-model", "--port", "0",
         "--max-model-len", "100000", *flags],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = re.search(r"Starting vLLM server on (https?://\S+)", log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(log.read_text())


def test_external_servers_are_validated_and_never_stopped(suite, run_inner) -> None:
    on, on_url = _start_fake(suite, "--enable-prefix-caching")
    off, off_url = _start_fake(suite, "--no-enable-prefix-caching")
    try:
        inner = run_inner(*fake_args(), f"--apc-url-on={on_url}", f"--apc-url-off={off_url}")
        assert inner.ret == 0, inner.output
        assert on.poll() is None, "the plugin stopped a server it did not launch"
        assert off.poll() is None, "the plugin stopped a server it did not launch"
        data = json.loads(next(suite.glob("apc-results/*/results.json")).read_text())
        assert data["server_launches"] == {}
        assert {s["url"] for s in data["servers"]} == {on_url, off_url}
    finally:
        on.kill()
        off.kill()


def test_external_servers_serve_the_name_they_list_when_none_is_given(suite, run_inner) -> None:
    """No --apc-set served_model_name: the benchmark requests what the servers' /v1/models lists (the fake
    answers 404 to any other name, so a run that passes requested it)."""
    on, on_url = _start_fake(suite, "--enable-prefix-caching", "--served-model-name", "llama-8b")
    off, off_url = _start_fake(suite, "--no-enable-prefix-caching", "--served-model-name", "llama-8b")
    try:
        inner = run_inner(*fake_args(), f"--apc-url-on={on_url}", f"--apc-url-off={off_url}")
        assert inner.ret == 0, inner.output[-3000:]
        data = json.loads(next(suite.glob("apc-results/*/results.json")).read_text())
        assert [server["served_model_name"] for server in data["servers"]] == ["llama-8b", "llama-8b"]
    finally:
        on.kill()
        off.kill()


def test_gpu_node_measures_servers_run_elsewhere_with_a_tokenizer_alone(suite, run_inner) -> None:
    """--gpu-node without a model: nothing is launched, and the benchmark loads the tokenizer it is given."""
    from pytest_apc.workload.models import ensure_tiny_model

    tokenizer = str(ensure_tiny_model())
    on, on_url = _start_fake(suite, "--enable-prefix-caching")
    off, off_url = _start_fake(suite, "--no-enable-prefix-caching")
    try:
        args = [arg.replace("--cpu-node", "--gpu-node") for arg in fake_args()]
        inner = run_inner(
            *args, f"--apc-tokenizer={tokenizer}", f"--apc-url-on={on_url}", f"--apc-url-off={off_url}", "-m", "apc",
            env={"MODEL_70B": ""},  # -m apc: nothing to launch, so no GPU node lock
        )  # fmt: skip
        assert inner.ret == 0, inner.output[-3000:]
        data = json.loads(next(suite.glob("apc-results/*/results.json")).read_text())
        assert data["server_launches"] == {}
        assert data["model"] == f"served elsewhere (tokenizer {Path(tokenizer).name})"
    finally:
        on.kill()
        off.kill()


def only_d(tmp_path):
    """A suite of one test, on D alone: only the APC-on server is needed."""
    (tmp_path / "test_d.py").write_text(
        "import pytest\n\n@pytest.mark.apc_cases('D')\ndef test_d(apc_run):\n    assert apc_run.repeats\n"
    )
    return tmp_path


def test_external_server_without_the_named_model_fails_in_seconds_naming_what_it_serves(tmp_path, run_inner) -> None:
    suite = only_d(tmp_path)
    on, on_url = _start_fake(suite, "--enable-prefix-caching")
    try:
        started = time.monotonic()
        inner = run_inner(
            *fake_args(), f"--apc-url-on={on_url}", "--apc-set=served_model_name=llama-70b",
            "--apc-set=startup_timeout=1800",
        )  # fmt: skip
        assert time.monotonic() - started < 30
        assert inner.ret == 1
        assert "apc-on server answers but serves ['apc-model'], not 'llama-70b'" in inner.output
    finally:
        on.kill()


def test_external_server_with_a_short_context_fails_in_seconds_with_both_numbers(tmp_path, run_inner) -> None:
    """Case D scaled by 0.01: prompt 338 (prefix 328 + suffix 10) and output 3, plus 256 for the template."""
    suite = only_d(tmp_path)
    on, on_url = _start_fake(suite, "--enable-prefix-caching", "--max-model-len", "500")
    try:
        started = time.monotonic()
        inner = run_inner(*fake_args(), f"--apc-url-on={on_url}", "--apc-set=startup_timeout=1800")
        assert time.monotonic() - started < 30
        assert inner.ret == 1
        assert (
            f"apc-on server {on_url} serves 'apc-model' with max_model_len 500, but the longest request of its runs "
            "needs 597 tokens (run D-c8: prompt 338 + output 3 + 256 for the chat template): restart it with "
            "--max-model-len 597 or more"
        ) in inner.output
        assert not list(suite.glob("apc-results/*/bench/*.json")), "measured on a server too short for its runs"
    finally:
        on.kill()


def test_external_server_url_where_nothing_listens_fails_in_seconds(tmp_path, run_inner) -> None:
    from tests.test_fleet_faults import _free_url

    only_d(tmp_path)
    dead = _free_url()
    started = time.monotonic()
    inner = run_inner(*fake_args(), f"--apc-url-on={dead}", "--apc-set=startup_timeout=1800")
    assert time.monotonic() - started < 30
    assert inner.ret == 1
    assert (
        f"apc-on server (external, {dead}) does not answer: GET {dead}/health: connection refused (nothing listens "
        "there) (for 10 s; a server run elsewhere must be up already)"
    ) in inner.output


def test_external_server_with_a_private_ca_needs_the_ca_bundle(tmp_path, run_inner) -> None:
    """An https server whose certificate no public CA signed: without --apc-set ca_bundle it fails in seconds
    naming TLS and the option; with it the plugin's requests and the benchmark's (aiohttp, through
    SSL_CERT_FILE) both verify it, and the run passes."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    suite = only_d(tmp_path)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    on, on_url = _start_fake(suite, "--enable-prefix-caching", f"--fake-tls={cert},{key}")
    try:
        assert on_url.startswith("https://")
        started = time.monotonic()
        refused = run_inner(*fake_args(), f"--apc-url-on={on_url}", "--apc-set=startup_timeout=1800")
        assert time.monotonic() - started < 30
        assert refused.ret == 1
        assert f"does not answer: GET {on_url}/health: TLS failed (" in refused.output
        assert "a private CA needs --apc-set ca_bundle" in refused.output
        verified = run_inner(
            *fake_args(), f"--apc-url-on={on_url}", f"--apc-set=ca_bundle={cert}", "--apc-results-dir=ok"
        )
        assert verified.ret == 0, verified.output[-3000:]
    finally:
        on.kill()


def test_external_servers_that_differ_beyond_apc_cannot_be_compared(tmp_path, run_inner) -> None:
    """--apc-url-on/off at two different deployments: the pair is refused, not judged."""
    one_verdict_test(tmp_path, "'D'", "apc_pair", "prefill_saved")
    on, on_url = _start_fake(tmp_path, "--enable-prefix-caching")
    off, off_url = _start_fake(tmp_path, "--no-enable-prefix-caching", "--max-model-len", "50000")
    try:
        inner = run_inner(*fake_args(), f"--apc-url-on={on_url}", f"--apc-url-off={off_url}")
        assert inner.ret == 1
        assert "runs C-c8 and D-c8 cannot be compared, so no verdict on them can be trusted:" in inner.output
        assert "- max model length 50000 on apc-off vs 100000 on apc-on" in inner.output
    finally:
        on.kill()
        off.kill()


def test_external_server_in_the_wrong_mode_is_refused(suite, run_inner) -> None:
    off, off_url = _start_fake(suite, "--enable-prefix-caching")  # claims to be the OFF server but is on
    try:
        inner = run_inner(*fake_args(), f"--apc-url-off={off_url}", "-k", "test_off")
        assert inner.ret == 1
        assert "apc-off server reports vllm:cache_config_info{enable_prefix_caching='True'}" in inner.output
    finally:
        off.kill()


def test_launcher_prefix_and_api_key_redaction(suite, run_inner) -> None:
    inner = run_inner(*fake_args(), "--apc-launcher=env APC_LAUNCHED_BY=wrapper", "--apc-api-key=sekrit-123", "-v")
    assert inner.ret == 0, inner.output
    data_text = next(suite.glob("apc-results/*/results.json")).read_text()
    data = json.loads(data_text)
    command = data["servers"][0]["command"]
    assert command[:2] == ["env", "APC_LAUNCHED_BY=wrapper"]
    assert "--api-key" not in command  # the key travels as VLLM_API_KEY: `ps` shows command lines
    for path in suite.glob("apc-results/**/*"):
        if path.is_file() and path.suffix in (".json", ".md", ".log"):
            assert "sekrit-123" not in path.read_text(errors="replace"), path
    assert "sekrit-123" not in inner.output


def test_unknown_case_is_a_collection_error(tmp_path, run_inner) -> None:
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n@pytest.mark.apc_cases('G')\ndef test_x(apc_run):\n    pass\n"
    )
    inner = run_inner("--cpu-node")
    assert inner.ret == pytest.ExitCode.INTERRUPTED
    expected = "apc_cases('G') on test_bad.py::test_x: unknown case G; cases are A, B, C, D, E, F, R, N, O, L, M"
    assert expected in inner.output


def test_killed_xdist_worker_leaves_nothing(suite, run_inner) -> None:
    import psutil

    inner = run_inner(*fake_args("--fake-children", "2"), "-n", "2", "--apc-set=output_len=3000000", wait=False)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(suite.glob("apc-results/*/bench/*.log")):
        time.sleep(0.2)
    assert list(suite.glob("apc-results/*/bench/*.log")), "never reached the benchmark"
    workers = [p for p in psutil.Process(inner.pid).children() if "pytest" in " ".join(p.cmdline())]
    assert workers
    for worker in workers:
        worker.kill()  # an xdist worker killed outright: no teardown of its own runs
    inner.proc.send_signal(signal.SIGTERM)
    inner.wait()
    assert not inner.leftovers(settle=15), "killed workers left servers behind"


def test_killed_xdist_controller_leaves_no_worker_and_no_server(suite, run_inner) -> None:
    """The controller SIGKILLed while its workers benchmark: the guard stops the servers, and the workers,
    whose controller is gone, must not live on."""
    import psutil

    inner = run_inner(*fake_args("--fake-children", "2"), "-n", "2", "--apc-set=output_len=3000000", wait=False)
    inner.wait_for(suite, "apc-results/*/bench/*.log", "the benchmark", timeout=120)
    children = psutil.Process(inner.pid).children()
    workers = [
        p for p in children if "pytest" in " ".join(p.cmdline()) and "serving.guard" not in " ".join(p.cmdline())
    ]
    assert len(workers) == 2, workers
    inner.proc.send_signal(signal.SIGKILL)
    inner.wait()
    assert inner.ret == -signal.SIGKILL
    assert not inner.leftovers(settle=15), "the killed controller left servers behind"
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"xdist workers outlived their killed controller: {alive}"


def test_benchmark_exception_is_a_failure_with_its_traceback(suite, run_inner) -> None:
    """What a non-zero exit of `vllm bench serve` would be: here its tokenizer cannot be loaded."""
    inner = run_inner(*fake_args(), "--apc-tokenizer=/nonexistent/tokenizer")
    assert inner.ret == 1
    assert "benchmark exited with an error (what a non-zero exit of `vllm bench serve` would be)" in inner.output
    assert "/nonexistent/tokenizer" in inner.output
    assert "re-run: " in inner.output


def test_finished_runs_are_on_disk_when_a_later_one_fails(tmp_path, run_inner) -> None:
    (tmp_path / "test_sweep.py").write_text(SUITE.replace('apc_cases("C")', 'apc_cases("C", sweep=True)'))
    inner = run_inner(*fake_args("--fake-die-after-requests", "5"), "--apc-set=sweep_concurrency=1,2", "-k", "test_off")
    assert inner.ret == 1
    data = json.loads(next(tmp_path.glob("apc-results/*/results.json")).read_text())
    assert [r["id"] for r in data["runs"]] == ["C-c1"]
    assert "C-c2" in data["errors"]
    assert len(list((tmp_path / "apc-results").glob("*/bench/C-c1.json"))) == 1


def test_missing_xxhash_is_named_before_launching(pytester, tmp_path, monkeypatch) -> None:
    import importlib.util

    from pytest_apc import config as apc_config
    from pytest_apc.serving.preflight import missing_requirement
    from pytest_apc.workload.cases import ServerMode

    settings = apc_config.resolve(pytester.parseconfig("--cpu-node"), environ={})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xxhash" else real(name, *a))
    message = missing_requirement(ServerMode(True, "xxhash_cbor"), settings)
    assert message is not None
    assert "needs the Python package 'xxhash' for --prefix-caching-hash-algo xxhash_cbor" in message
    assert "pip install xxhash" in message
    assert missing_requirement(ServerMode(True, "sha256_cbor"), settings) is None


def test_a_tokenizer_alone_launches_nothing_and_says_so(pytester, tmp_path) -> None:
    """--gpu-node with a tokenizer and an external fleet: a test that would still launch a server (A-F
    without --apc-url-on/off) fails its runs naming the missing model, before any command line is built."""
    from pytest_apc import config as apc_config
    from pytest_apc.serving.deployment import deployment_for
    from pytest_apc.serving.interface import ServerError
    from pytest_apc.workload.cases import ServerMode

    fleet = ("--apc-fleet-url=http://gw:80", "--apc-metrics-url=http://r1:8000", "--apc-metrics-url=http://r2:8000")
    settings = apc_config.resolve(pytester.parseconfig("--gpu-node", "--apc-tokenizer=/tok", *fleet), environ={})
    with pytest.raises(ServerError, match="no model to launch the apc-on server with: --apc-tokenizer alone"):
        deployment_for(ServerMode(True), settings, "", tmp_path, lambda message: None)


def test_only_servers_run_elsewhere_are_held_to_the_context_of_their_runs(pytester, tmp_path) -> None:
    """A launched server gets its --max-model-len from the plugin (the selected runs are checked against it at
    collection): only a server run elsewhere is held to the longest request of its runs at readiness."""
    from pytest_apc import config as apc_config
    from pytest_apc.serving.deployment import deployment_for
    from pytest_apc.workload.cases import RunKey, ServerMode, workload_for
    from pytest_apc.workload.plan import PlannedRun

    settings = apc_config.resolve(pytester.parseconfig("--cpu-node", "--apc-url-on=http://on:8000"), environ={})
    d8, c8 = (PlannedRun(RunKey(case, 8), workload_for("pure", settings)) for case in "DC")
    on = deployment_for(ServerMode(True), settings, "/m", tmp_path, lambda message: None, [d8])
    off = deployment_for(ServerMode(False), settings, "/m", tmp_path, lambda message: None, [c8])
    assert (on.how.min_model_len, on.how.min_model_len_why) == (  # type: ignore[attr-defined]
        2048 + 64 + 16 + 256,
        "run D-c8: prompt 2112 + output 16 + 256 for the chat template",
    )
    assert off.how.min_model_len == 0  # type: ignore[attr-defined]


def test_two_runs_on_one_node_do_not_collide(tmp_path, run_inner) -> None:
    """Two pytest runs at once on one machine (CPU profile): own ports, own run folders, own processes."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "test_suite.py").write_text(SUITE)
    runs = [
        run_inner(str(tmp_path / name), *fake_args(), f"--apc-results-dir={tmp_path / name}/r", wait=False)
        for name in ("a", "b")
    ]
    for inner in runs:
        inner.wait()
        assert inner.ret == 0, inner.output
    urls = [json.loads(next((tmp_path / n).glob("r/*/results.json")).read_text())["servers"][0]["url"] for n in "ab"]
    assert urls[0] != urls[1]


FAKE_CONTAINER = FAKE_VLLM.with_name("fake_container.py")


def test_a_container_launcher_gets_the_servers_environment_through_env(suite, run_inner) -> None:
    """A launcher that starts the server in an environment of its own (a fake container that passes only the
    variables it is told to) with {env}: the server runs in dev mode, so every reset works; {python} in the
    server command is the container's interpreter (python3), in the launcher this one."""
    launcher = f"--apc-launcher={{python}} {FAKE_CONTAINER} {{env}} --"
    inner = run_inner(*fake_args(), launcher, "--apc-repeats=2")
    assert inner.ret == 0, inner.output[-4000:]
    data = json.loads(next(suite.glob("apc-results/*/results.json")).read_text())
    on = next(s for s in data["servers"] if s["mode"] == "apc-on")
    command = on["command"]
    assert command[:5] == [sys.executable, str(FAKE_CONTAINER), "-e", "HF_HUB_OFFLINE", "-e"]  # runs here
    passed = {command[i + 1] for i, word in enumerate(command) if word == "-e"}
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE"} <= passed
    assert command[command.index("--") + 1 : command.index("--") + 3] == ["python3", str(FAKE_VLLM)]
    d8 = next(r for r in data["runs"] if r["id"] == "D-c8")
    assert all("HTTP 200" in str(d8["reset"]) for _ in d8["repeat_counters"])


def test_a_container_launcher_without_env_fails_its_reset_naming_the_fix(suite, run_inner) -> None:
    inner = run_inner(*fake_args(), f"--apc-launcher=python3 {FAKE_CONTAINER} --")
    assert inner.ret == 1
    assert "has no /reset_prefix_cache (HTTP 404): it must run with VLLM_SERVER_DEV_MODE=1" in inner.output
    assert "it was started through --apc-launcher without {env}: a launcher that starts it in an environment" in (
        inner.output
    )


def test_the_gate_under_xdist_compares_what_the_workers_measured(suite, run_inner) -> None:
    """The controller gates runs its workers measured: it reads their store before it builds the document."""
    first = run_inner(*fake_args(), "--apc-repeats=3")
    assert first.ret == 0, first.output[-3000:]
    (baseline,) = suite.glob("apc-results/*/results.json")
    gated = run_inner(*fake_args(), "-n", "2", f"--apc-baseline={baseline}", "--apc-results-dir=gated")
    assert gated.ret == 0, gated.output[-3000:]
    data = json.loads(next(suite.glob("gated/*/results.json")).read_text())
    assert (data["gate"]["compared"], data["gate"]["failures"]) == (2, [])
    assert [row["repeats"] for row in data["gate"]["rows"]] == [[3, 3], [3, 3]]


def test_a_baseline_of_another_block_size_stops_the_run_once_the_server_says_so(suite, run_inner) -> None:
    """The block size is known once the APC-on server is up: from then on nothing is measured (the rest of
    the matrix would be judged against a baseline it cannot be compared with), and the gate says why."""
    first = run_inner(*fake_args(), "--apc-repeats=3")
    assert first.ret == 0, first.output[-3000:]
    (measured,) = suite.glob("apc-results/*/results.json")
    doc = json.loads(measured.read_text())
    for server in doc["servers"]:
        server["block_size"] = 32
    baseline = suite / "baseline-32.json"
    baseline.write_text(json.dumps(doc))
    gated = run_inner(*fake_args(), f"--apc-baseline={baseline}", "--apc-results-dir=gated")
    assert gated.ret == 4  # a usage error, as when pytest starts: the baseline, not the build, failed
    refusal = f"not comparable with baseline {baseline}: block_size 16 here vs 32 there"
    data = json.loads(next(suite.glob("gated/*/results.json")).read_text())
    assert data["errors"] == {"D-c8": f"run D-c8 was not measured: {refusal}"}
    assert [run["id"] for run in data["runs"]] == ["C-c8"]  # measured on the OFF server, before the ON one was up
    assert data["gate"]["failures"] == [refusal]
    assert f"FAIL baseline: {refusal}" in gated.output


def test_short_lived_forks_of_an_engine_are_not_its_death(suite, run_inner) -> None:
    """A compiler subprocess is a fork of the engine or worker that carries its title until it execs; when it
    exits, the engine lives on, and the server must still start and pass."""
    inner = run_inner(*fake_args("--fake-engine-forks", "4", "--fake-startup-delay", "4"), "-v")
    assert inner.ret == 0, inner.output
    assert "3 passed" in inner.output
    assert "exited while the API server kept running" not in inner.output
