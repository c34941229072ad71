"""What people read: the report header, progress lines, the validation table, JUnit properties."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from tabulate import tabulate

from pytest_apc.cases import PAIRS, RunKey
from pytest_apc.config import Settings, model_path_for_display
from pytest_apc.session import ApcSession, RunRecord


def header_lines(settings: Settings, verbose: bool) -> list[str]:
    model = settings.model or "generated tiny model"
    lines = [
        f"apc: profile={settings.profile} model={model_path_for_display(model)} "
        f"prompts={settings.num_prompts} concurrency={settings.concurrency} "
        f"sweep={','.join(map(str, settings.sweep_concurrency))} length_scale={settings.length_scale:g}"
    ]
    if verbose:
        lines += [f"apc: {name}={value!r} ({settings.sources.get(name)})" for name, value in settings.values.items()]
    return lines


def progress_writer(config: pytest.Config, tr: Any) -> Callable[[str], None]:
    """Progress lines while servers start and runs measure: shown on a terminal or with -v."""
    show = tr is not None and (config.get_verbosity() > 0 or getattr(tr, "isatty", lambda: sys.stdout.isatty())())
    started = time.monotonic()

    def write(message: str) -> None:
        if show:
            tr.write_line(f"[apc {time.monotonic() - started:7.1f}s] {message}")

    return write


def record_properties(node: pytest.Item, record: RunRecord) -> None:
    """Key numbers as JUnit properties (CI systems show them) and for the xdist controller."""
    row = record.to_json()
    for name in (
        "id",
        "median_ttft_ms",
        "p99_ttft_ms",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "hit_ratio",
        "bench_duration_s",
        "block_size",
    ):
        node.user_properties.append((f"apc_{name}", row[name]))
    node.user_properties.append(("apc_server_log", record.server.log))


def _fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def validation_rows(apc: ApcSession) -> list[list[Any]]:
    """One row per ON/OFF pair and concurrency that has both runs measured."""
    rows = []
    for case, concurrency, algo in sorted({(k.case, k.concurrency, k.hash_algo) for k in apc.records}):
        if case not in PAIRS:
            continue
        on = apc.records.get(RunKey(case, concurrency, algo))
        off = apc.records.get(RunKey(PAIRS[case], concurrency))
        if on is None or off is None:
            continue
        on_j, off_j = on.to_json(), off.to_json()
        hits = on_j["prefix_cache_hits"]
        expected = on.prediction.expected_hits if on.prediction else None
        speedup = off_j["median_ttft_ms"] / on_j["median_ttft_ms"] if on_j["median_ttft_ms"] else None
        bound = on.prediction.prefill_bound if on.prediction else None
        rows.append([
            f"{PAIRS[case]}/{case}", concurrency, algo or "-",
            "yes" if hits else "no",
            f"{_fmt(hits)} / {_fmt(expected)}",
            _fmt(on_j["hit_ratio"], ".1%"),
            _fmt(off_j["median_ttft_ms"], ",.1f"), _fmt(on_j["median_ttft_ms"], ",.1f"),
            f"{_fmt(speedup, '.2f')}x / {_fmt(bound, '.2f')}x",
            f"{_fmt(off_j['input_throughput'])} / {_fmt(on_j['input_throughput'])}",
            f"{_fmt(off_j['output_throughput'])} / {_fmt(on_j['output_throughput'])}",
            f"{_fmt(off_j['median_e2el_ms'], ',.0f')} / {_fmt(on_j['median_e2el_ms'], ',.0f')}",
        ])  # fmt: skip
    return rows


TABLE_HEADERS = [
    "pair", "conc", "hash", "hit?", "cached tok / expected", "hit ratio", "TTFT p50 OFF ms", "TTFT p50 ON ms",
    "TTFT gain / bound", "in tok/s OFF/ON", "out tok/s OFF/ON", "E2E p50 ms OFF/ON",
]  # fmt: skip


def terminal_summary(tr: Any, apc: ApcSession) -> None:
    tr.write_sep("=", "apc validation")
    for info in apc.servers.values():
        tr.write_line(
            f"server {info.mode}: block size {info.block_size}, {info.num_gpu_blocks} blocks, "
            f"KV cache {_fmt(info.kv_cache_size_tokens)} tokens, hash {info.prefix_caching_hash_algo}, "
            f"vLLM {info.version}, started in {_fmt(info.startup_s, '.0f')} s, launches "
            f"{apc.launches.get(info.mode, 0)}"
        )
    rows = validation_rows(apc)
    if rows:
        tr.write_line(tabulate(rows, headers=TABLE_HEADERS, disable_numparse=True))
    for key, error in sorted(apc.errors.items()):
        tr.write_line(f"NOT MEASURED {key.id}: {error.splitlines()[0]}", red=True)
    tr.write_line(f"results: {apc.json_path}")


class ControllerReporter:
    """Registered on the controller only (or the single process): gathers verdicts from every report,
    which is how results cross from xdist workers, and prints the summary once."""

    def __init__(self, config: pytest.Config, apc: ApcSession) -> None:
        self.config = config
        self.apc = apc

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "apc_verdicts" and isinstance(value, list):
                for verdict in value:
                    self.apc.verdicts.append({**verdict, "test": report.nodeid, "outcome": report.outcome})

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.apc.load_store()
        terminal_summary(terminalreporter, self.apc)
