"""What pytest prints: the header lines, progress lines, the validation and hash-algorithm tables, the
server lines and the terminal summary; and the number formatters every output shares."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from tabulate import tabulate

from pytest_apc.config import Settings, model_path_for_display
from pytest_apc.redaction import redact
from pytest_apc.report.rows import ReportData
from pytest_apc.session import ApcSession

if TYPE_CHECKING:
    from pytest_apc.report.gate import Gate


def _num(value: Any, spec: str | None = None) -> str:
    """One number for a table cell or a message: counts with thousands separators, other quantities whole
    from 100 up and to three significant digits below; ``spec`` where a column needs its own."""
    if value is None:
        return "-"
    if spec is not None:
        return format(value, spec)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _k(value: float | None) -> str:
    """Compact throughput: 78.2k, 1.3M."""
    if value is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def header_lines(settings: Settings, verbose: bool) -> list[str]:
    lines = [
        f"apc: profile={settings.profile} model={settings.model_label} "
        f"prompts={settings.num_prompts} concurrency={settings.concurrency} "
        f"sweep={','.join(map(str, settings.sweep_concurrency))} length_scale={settings.length_scale:g}"
    ]
    if verbose:
        lines += [
            redact(f"apc: {name}={value!r} ({settings.sources.get(name)})")
            for name, value in settings.as_dict().items()
        ]
    return lines


def progress_writer(config: pytest.Config, tr: Any) -> Callable[[str], None]:
    """Progress lines while servers start and runs measure: shown on a terminal or with -v."""
    show = tr is not None and (config.get_verbosity() > 0 or getattr(tr, "isatty", lambda: sys.stdout.isatty())())
    started = time.monotonic()

    capman = config.pluginmanager.getplugin("capturemanager")

    def write(message: str) -> None:
        if not show:
            return
        line = f"[apc {time.monotonic() - started:7.1f}s] {message}"
        if capman is not None:
            # Progress happens inside fixture setup, where output is captured: let it through.
            with capman.global_and_fixture_disabled():
                tr.write_line(line)
        else:
            tr.write_line(line)

    return write


def table(data: ReportData, verbose: bool = False) -> str:
    """The validation table; fits 120 columns, -v adds columns."""
    body = []
    for row in data.pairs:
        n = row.numbers
        line = [
            n["pair"], n["concurrency"],
            "yes" if n["cache_hit_observed"] else ("NO" if n["expected_cached_tokens"] else "no"),
            f"{_num(n['cached_tokens'])}/{_num(n['expected_cached_tokens'])}", _num(n["hit_ratio"], ".0%"),
            f"{_num(n['median_ttft_off_ms'])}>{_num(n['median_ttft_on_ms'])}",
            f"{_num(n['ttft_speedup'], '.2f')}x/{_num(n['prefill_bound'], '.3g')}x",
            f"{_k(n['input_throughput_off'])}>{_k(n['input_throughput_on'])}",
            f"{_k(n['output_throughput_off'])}>{_k(n['output_throughput_on'])}",
            f"{_num(n['median_e2el_off_ms'])}>{_num(n['median_e2el_on_ms'])}",
            n["verdict"],
        ]  # fmt: skip
        if verbose:
            line.insert(7, f"[{_num(n['ttft_speedup_low'], '.2f')},{_num(n['ttft_speedup_high'], '.2f')}]")
        body.append(line)
    headers = ["pair", "c", "hit", "cached/expected", "ratio", "TTFT ms", "gain/bound", "in tok/s", "out tok/s",
               "E2E ms", "verdict"]  # fmt: skip
    if verbose:
        headers.insert(7, "gain CI")
    return tabulate(body, headers=headers, disable_numparse=True)


def algo_table(data: ReportData) -> str:
    """Each hash algorithm against the default one: same cached tokens, TTFT and duration within tolerance."""
    body = []
    for row in data.algos:
        n = row.numbers
        body.append([
            f"{n['case']} {n['hash_algo']}", n["concurrency"],
            f"{_num(n['cached_tokens'])}/{_num(n['default_cached_tokens'])}",
            f"{_num(n['median_ttft_default_ms'])}>{_num(n['median_ttft_ms'])}",
            f"{_num(n['ttft_ratio'], '.2f')}x [{_num(n['ttft_ratio_low'], '.2f')},{_num(n['ttft_ratio_high'], '.2f')}]",
            f"{_num(n['duration_default_s'])}>{_num(n['duration_s'])}", n["verdict"],
        ])  # fmt: skip
    headers = ["case algorithm", "c", "cached/default", "TTFT ms default>algo", "TTFT algo/default",
               "duration s", "verdict"]  # fmt: skip
    return tabulate(body, headers=headers, disable_numparse=True)


def gate_table(rows: list[dict[str, Any]]) -> str:
    """Every row the baseline gate compared: each metric baseline -> now (limit), and whether it regressed."""
    body = []
    for row in rows:
        cells = []
        for m in row["metrics"]:
            text = f"{_num(m['was'])} -> {_num(m['now'])}"
            if m["limit"] is not None:
                text += f" ({'<=' if m['metric'] == 'ttft_on' else '>='} {_num(m['limit'])})"
            if m["result"] == "REGRESSED":
                text += " !"
            cells.append(text)
        body.append([row["pair"], row["concurrency"], *cells, row["result"]])
    headers = ["pair", "c", "TTFT ON ms", "gain OFF/ON", "cached tokens", "vs baseline"]
    return tabulate(body, headers=headers, disable_numparse=True)


def server_lines(apc: ApcSession) -> list[str]:
    lines = []
    for info in apc.servers.values():
        tp = next((info.command[i + 1] for i, a in enumerate(info.command[:-1]) if a == "--tensor-parallel-size"), "1")
        lines.append(
            f"{info.mode}: vLLM {info.version}, TP {tp}, block size {info.block_size}, "
            f"{_num(info.num_gpu_blocks)} blocks = {_num(info.kv_cache_size_tokens)} KV tokens, "
            f"hash {info.prefix_caching_hash_algo}, ready in {_num(info.startup_s, '.0f')} s, "
            f"launches {apc.launches.get(info.mode, 0)}"
        )
    return lines


def terminal_summary(tr: Any, apc: ApcSession, data: ReportData, gate: Gate | None = None) -> None:
    tr.write_sep("=", "apc validation")
    model = model_path_for_display(apc.json_model())
    tr.write_line(f"model {model} ({apc.settings.profile} profile); TTFT OFF>ON; gain = median TTFT OFF/ON")
    for line in server_lines(apc):
        tr.write_line(line)
    if data.pairs:
        tr.write_line(table(data, verbose=tr.config.get_verbosity() > 0))
    if data.algos:
        default = data.algos[0].default.server.prefix_caching_hash_algo or "not reported"
        tr.write_line(f"hash algorithms vs the default ({default}): cached tokens must be equal")
        tr.write_line(algo_table(data))
    for key, error in sorted(apc.errors.items()):
        tr.write_line(f"NOT MEASURED {key.id}: {error.splitlines()[0]}", red=True)
    for line in apc.warnings:
        tr.write_line(f"WARNING {line}", yellow=True)
    if gate is not None and gate.rows:
        tr.write_line(
            f"baseline {gate.baseline}: {gate.compared} row{'' if gate.compared == 1 else 's'} compared, "
            f"{gate.regressed} regressed (baseline -> now (limit))"
        )
        tr.write_line(gate_table(gate.rows))
    for line in gate.failures if gate is not None else []:
        tr.write_line(f"FAIL baseline: {line}", red=True, bold=True)
    tr.write_line(f"results: {apc.json_path}")
