"""Progress a person can follow: a line as each run starts and ends, "run i of N", what it measured and
the time left; in a CI log (no terminal) as on a terminal, quiet under -q."""

from __future__ import annotations

import re
from types import SimpleNamespace

from pytest_apc.measure.records import Measured
from pytest_apc.report.terminal import RunProgress, duration
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload.cases import RunKey, workload_for
from pytest_apc.workload.plan import Plan
from tests.test_faults import SUITE, fake_args
from tests.test_verdict import delta, off_delta, record, settings


def _session(keys: list[RunKey], settings_) -> SimpleNamespace:
    return SimpleNamespace(plan=Plan(set(keys)), measured=Measured(), settings=settings_)


def test_each_run_says_which_of_how_many_it_is_what_it_measured_and_the_time_left(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    off.wall_s = 12.0
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    # Runs on servers not started yet: an algorithm's and the small GPU cache's.
    later = [RunKey("D", 8, "xxhash"), RunKey("D", 1, "xxhash"), RunKey("N", 1)]
    session = _session([off.key, on.key, *later], s)
    lines: list[str] = []
    progress = RunProgress(session, lines.append)

    progress(off.key, None)
    session.measured.records[off.key] = off
    session.measured.servers["apc-off"] = ServerInfo("apc-off", [], "", "", startup_s=30.0)
    session.measured.done_modes.add(off.key.mode)
    progress(off.key, 12.0)
    # Each run left as long as C-c8 (12 s), N-c1 scaled to its 28 prompts (11.2 s), + 30 s x 3 servers.
    assert lines == [
        "apc-off: run 1 of 5: measuring C-c8",
        "apc-off: run 1 of 5: C-c8 done in 12 s: cached 0 (APC off), TTFT 120 ms; about 2 min left (4 runs, "
        "3 server starts)",
    ]

    progress(on.key, None)
    session.measured.errors[on.key] = "run D-c8 failed: the benchmark exited with code 1\nits last lines"
    session.measured.servers["apc-on"] = ServerInfo("apc-on", [], "", "", startup_s=90.0)
    session.measured.done_modes.add(on.key.mode)
    progress(on.key, 20.0)
    # 12 + 12 + 11.2 s for the runs left (a failed run counts for nothing), plus the mean start-up (60 s) x 2.
    assert lines[-1] == (
        "apc-on: run 2 of 5: D-c8 failed after 20 s: run D-c8 failed: the benchmark exited with code 1; "
        "about 3 min left (3 runs, 2 server starts)"
    )
    session.measured.records[on.key] = on
    session.measured.errors.clear()
    progress(on.key, 20.0)
    expected = on.prediction.expected_hits
    assert f": D-c8 done in 20 s: cached {expected:,}/{expected:,}, TTFT 40." in lines[-1]

    for key in later:
        session.measured.errors[key] = "not measured"
    progress(later[-1], 5.0)
    assert lines[-1].startswith("apc-on-small-cache: run 5 of 5: N-c1 failed after 5 s: not measured; ")
    assert lines[-1].endswith("; nothing left to measure")
    assert (duration(41), duration(359), duration(5400)) == ("41 s", "6 min", "1.5 h")


def test_the_time_left_scales_a_case_not_measured_yet_and_counts_failed_runs_while_none_is_measured(pytester):
    s = settings(pytester)
    c1, e1, f1 = RunKey("C", 1), RunKey("E", 1), RunKey("F", 1)
    session = _session([c1, e1, f1], s)
    lines: list[str] = []
    progress = RunProgress(session, lines.append)
    session.measured.errors[c1] = "run C-c1 failed: the benchmark exited with code 1"
    progress(c1, 30.0)
    # No run measured: each run left takes the failed one's 30 s.
    assert lines[-1].endswith("; about 60 s left (2 runs, 2 server starts)")
    session.measured.errors.clear()
    off = record(s, "C", 1, off_delta(s, "C"), 120.0)
    off.wall_s = 30.0
    session.measured.records[c1] = off
    progress(c1, 30.0)
    rag, pure = workload_for("rag", s).prompt_len, off.workload.prompt_len
    # E-c1 and F-c1: C-c1 scaled to their prompts, about twice as long.
    assert lines[-1].endswith(f"; about {duration(2 * 30.0 * rag / pure)} left (2 runs, 2 server starts)")
    assert rag > 1.5 * pure


def test_the_progress_lines_show_without_a_terminal_or_v_and_not_with_q(tmp_path, run_inner) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)  # C-c8 on the OFF server, D-c8 on the ON server
    inner = run_inner(*fake_args())  # its output is a pipe, as in CI
    assert inner.ret == 0, inner.output
    lines = [line.split("] ", 1)[1] for line in inner.output.splitlines() if line.startswith("[apc ")]
    runs = [line for line in lines if ": run " in line]
    assert runs[0] == "apc-off: run 1 of 2: measuring C-c8"
    assert re.fullmatch(r"apc-off: run 1 of 2: C-c8 done in \d+ s: cached 0 \(APC off\), TTFT [\d.,]+ ms; "
                        r"about \d+ s left \(1 run, 1 server start\)", runs[1]), runs  # fmt: skip
    assert runs[2] == "apc-on: run 2 of 2: measuring D-c8"
    assert re.fullmatch(r"apc-on: run 2 of 2: D-c8 done in \d+ s: cached [\d,]+/[\d,]+, TTFT [\d.,]+ ms; "
                        r"nothing left to measure", runs[3]), runs  # fmt: skip
    assert len(runs) == 4

    quiet = run_inner(*fake_args(), "-q")
    assert quiet.ret == 0, quiet.output
    assert "[apc " not in quiet.output
