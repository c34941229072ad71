"""What a failed APC test shows below its message: how to reproduce its runs, and its servers' log tails."""

from __future__ import annotations

import shlex
from pathlib import Path

from pytest_apc.measure.records import Measured
from pytest_apc.redaction import redact
from pytest_apc.serving.logwatch import tail
from pytest_apc.workload.cases import RunKey

FAILURE_LOG_LINES = 40


def failure_sections(measured: Measured, run_dir: Path, keys: list[RunKey]) -> list[tuple[str, str]]:
    """What a failed APC test shows below its message, whatever failed (a verdict, a measurement, missing
    metrics): how to re-run each of its runs and start its servers, and the tail of each server's log (a
    server's own log, else ``server-<mode>.log`` in ``run_dir``)."""
    modes = list(dict.fromkeys(k.mode.name for k in keys))
    commands = [f"{k.id}: {measured.records[k].bench_command}" for k in keys if k in measured.records]
    for mode in modes:
        info = measured.servers.get(mode)
        if info is not None and info.external:
            commands.append(f"{mode} server: not started by pytest-apc; it runs at {info.url}")
        elif info is not None and info.command:
            commands.append(f"{mode} server: {shlex.join(info.command)}")
    sections = [("apc: reproduce", redact("\n".join(commands)))] if commands else []
    for mode in modes:
        info = measured.servers.get(mode)
        log = Path(info.log) if info is not None and info.log else run_dir / f"server-{mode}.log"
        if log.is_file():
            sections.append((f"apc: last {FAILURE_LOG_LINES} lines of the {mode} server log {log}",
                             tail(log, FAILURE_LOG_LINES)))  # fmt: skip
        elif info is not None:
            sections.append((f"apc: {mode} server log", f"no log file at {log}"))
    return sections
