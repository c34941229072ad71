"""What people and pipelines read: the report header, progress lines, the validation table, the
Markdown summary, plots, JUnit properties and the baseline gate. Written once, on the controller."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tabulate import tabulate

import pytest_apc
from pytest_apc.cases import CASE_PURPOSE, PAIRS, RunKey
from pytest_apc.config import Settings, model_path_for_display
from pytest_apc.records import RunRecord
from pytest_apc.redaction import redact
from pytest_apc.server import tail
from pytest_apc.session import ApcSession
from pytest_apc.stats import Interval, ratio_of_medians
from pytest_apc.verdict import Pair

SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
FAILURE_LOG_LINES = 40
RUN_ID = re.compile(r"\[([A-F]-c\d+(?:-[a-z0-9_]+)?)\]")


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


def record_properties(node: pytest.Item, record: RunRecord) -> None:
    """Key numbers as JUnit properties (CI systems show them)."""
    row = record.to_json()
    for name in ("id", "median_ttft_ms", "p99_ttft_ms", "prefix_cache_hits", "prefix_cache_queries",
                 "hit_ratio", "bench_duration_s", "block_size"):  # fmt: skip
        node.user_properties.append((f"apc_{name}", row[name]))
    node.user_properties.append(("apc_server_log", record.server.log))


def failure_sections(apc: ApcSession, keys: list[RunKey]) -> list[tuple[str, str]]:
    """What a failed APC test shows below its message, whatever failed (a verdict, a measurement, missing
    metrics): how to re-run each of its runs and start its servers, and the tail of each server's log."""
    modes = list(dict.fromkeys(k.mode.name for k in keys))
    commands = [f"{k.id}: {apc.records[k].bench_command}" for k in keys if k in apc.records]
    for mode in modes:
        info = apc.servers.get(mode)
        if info is not None and info.external:
            commands.append(f"{mode} server: not started by pytest-apc; it runs at {info.url}")
        elif info is not None and info.command:
            commands.append(f"{mode} server: {shlex.join(info.command)}")
    sections = [("apc: reproduce", redact("\n".join(commands)))] if commands else []
    for mode in modes:
        info = apc.servers.get(mode)
        log = Path(info.log) if info is not None and info.log else apc.run_dir / f"server-{mode}.log"
        if log.is_file():
            sections.append((f"apc: last {FAILURE_LOG_LINES} lines of the {mode} server log {log}",
                             tail(log, FAILURE_LOG_LINES)))  # fmt: skip
        elif info is not None:
            sections.append((f"apc: {mode} server log", f"no log file at {log}"))
    return sections


# -- the validation table ------------------------------------------------------------------------------


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


@dataclass
class PairRow:
    """One ON/OFF pair at one concurrency, with everything the review's validation table asks for."""

    off: RunRecord
    on: RunRecord
    verdict: str  # PASS / FAIL / -

    @property
    def name(self) -> str:
        return f"{self.off.key.case}/{self.on.key.case}"

    def numbers(self, settings: Settings) -> dict[str, Any]:
        on, off = self.on.to_json(), self.off.to_json()
        speedup: float | None
        low: float | None
        high: float | None
        try:
            gain = Pair(self.off, self.on, settings).ttft_speedup()
            speedup, low, high = gain.estimate, gain.low, gain.high
        except ValueError:
            speedup = low = high = None
        return {
            "pair": self.name, "concurrency": self.on.key.concurrency,
            "cache_hit_observed": bool(on["prefix_cache_hits"]), "cached_tokens": on["prefix_cache_hits"],
            "expected_cached_tokens": self.on.prediction.expected_hits if self.on.prediction else None,
            "hit_ratio": on["hit_ratio"], "median_ttft_off_ms": off["median_ttft_ms"],
            "median_ttft_on_ms": on["median_ttft_ms"], "ttft_speedup": speedup, "ttft_speedup_low": low,
            "ttft_speedup_high": high,
            "prefill_bound": self.on.prediction.prefill_bound if self.on.prediction else None,
            "input_throughput_off": off["input_throughput"], "input_throughput_on": on["input_throughput"],
            "output_throughput_off": off["output_throughput"], "output_throughput_on": on["output_throughput"],
            "median_e2el_off_ms": off["median_e2el_ms"], "median_e2el_on_ms": on["median_e2el_ms"],
            "verdict": self.verdict,
        }  # fmt: skip


def _row_verdict(apc: ApcSession, runs: set[str], about: str | None = None) -> str:
    """PASS/FAIL from the verdicts about these runs only (every run they name among ``runs``), or about one
    run (every verdict naming ``about``); FAIL when one of ``runs`` failed before any verdict; "-" when
    nothing judged them."""
    outcomes = [
        v["passed"] and v.get("outcome") == "passed"
        for v in apc.verdicts
        if (about in v["runs"] if about else set(v["runs"]) <= runs)
    ]
    outcomes += [False for run_id in apc.failed_runs if run_id in runs]  # failed before any verdict
    return "-" if not outcomes else ("PASS" if all(outcomes) else "FAIL")


def pair_rows(apc: ApcSession) -> list[PairRow]:
    """Every ON run of the default APC server with its OFF partner, in matrix order, with the verdicts'
    outcome (runs on --apc-hash-algos servers are compared with the default's in ``algo_rows``)."""
    rows = []
    for key in sorted(apc.records, key=lambda k: (k.case, k.concurrency)):
        if key.case not in PAIRS or key.hash_algo:
            continue
        off = apc.records.get(RunKey(PAIRS[key.case], key.concurrency))
        if off is None:
            continue
        rows.append(PairRow(off, apc.records[key], _row_verdict(apc, {key.id, off.key.id})))
    return rows


@dataclass
class AlgoRow:
    """One run on a --apc-hash-algos server next to the same run on the default APC-on server."""

    default: RunRecord
    run: RunRecord
    verdict: str

    def numbers(self, settings: Settings) -> dict[str, Any]:
        try:
            ratio: Interval | None = ratio_of_medians(
                self.run.samples_ms(), self.default.samples_ms(),
                samples=settings.bootstrap_samples, confidence=settings.confidence,
            )  # fmt: skip
        except ValueError:  # no per-request samples: the row shows "-"
            ratio = None
        return {
            "case": self.run.key.case, "concurrency": self.run.key.concurrency,
            "hash_algo": self.run.key.hash_algo, "default_hash_algo": self.default.server.prefix_caching_hash_algo,
            "cached_tokens": self.run.to_json()["prefix_cache_hits"],
            "default_cached_tokens": self.default.to_json()["prefix_cache_hits"],
            "median_ttft_default_ms": self.default.median_ms(), "median_ttft_ms": self.run.median_ms(),
            "ttft_ratio": ratio and ratio.estimate, "ttft_ratio_low": ratio and ratio.low,
            "ttft_ratio_high": ratio and ratio.high,
            "duration_default_s": self.default.duration_s, "duration_s": self.run.duration_s,
            "verdict": self.verdict,
        }  # fmt: skip


def algo_rows(apc: ApcSession) -> list[AlgoRow]:
    """Every run measured on a --apc-hash-algos server with its default-algorithm twin."""
    rows = []
    for key in sorted(apc.records, key=lambda k: (k.hash_algo, k.case, k.concurrency)):
        default = apc.records.get(RunKey(key.case, key.concurrency))
        if not key.hash_algo or default is None:
            continue
        # The algorithm's own verdicts and the comparison; the default run's own verdicts belong to its pair.
        rows.append(AlgoRow(default, apc.records[key], _row_verdict(apc, {key.id}, about=key.id)))
    return rows


def table(apc: ApcSession, verbose: bool = False) -> str:
    """The validation table; fits 120 columns, -v adds columns."""
    body = []
    for row in pair_rows(apc):
        n = row.numbers(apc.settings)
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


def algo_table(apc: ApcSession) -> str:
    """Each hash algorithm against the default one: same cached tokens, TTFT and duration within tolerance."""
    body = []
    for row in algo_rows(apc):
        n = row.numbers(apc.settings)
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


def terminal_summary(tr: Any, apc: ApcSession, gate: list[str]) -> None:
    tr.write_sep("=", "apc validation")
    model = model_path_for_display(apc.json_model())
    tr.write_line(f"model {model} ({apc.settings.profile} profile); TTFT OFF>ON; gain = median TTFT OFF/ON")
    for line in server_lines(apc):
        tr.write_line(line)
    if pair_rows(apc):
        tr.write_line(table(apc, verbose=tr.config.get_verbosity() > 0))
    algos = algo_rows(apc)
    if algos:
        default = algos[0].default.server.prefix_caching_hash_algo or "not reported"
        tr.write_line(f"hash algorithms vs the default ({default}): cached tokens must be equal")
        tr.write_line(algo_table(apc))
    for key, error in sorted(apc.errors.items()):
        tr.write_line(f"NOT MEASURED {key.id}: {error.splitlines()[0]}", red=True)
    for line in apc.warnings:
        tr.write_line(f"WARNING {line}", yellow=True)
    for line in gate:
        tr.write_line(f"FAIL baseline: {line}", red=True, bold=True)
    tr.write_line(f"results: {apc.json_path}")


# -- files ---------------------------------------------------------------------------------------------


def environment(apc: ApcSession) -> dict[str, Any]:
    """Where this ran: versions, devices, commit."""

    def run(*cmd: str) -> str | None:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        return out or None

    versions = sorted({info.version for info in apc.servers.values() if info.version})
    gpus = run("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
    return {
        "pytest_apc": pytest_apc.__version__,
        "vllm": versions[0] if len(versions) == 1 else versions or None,
        "python": platform.python_version(),
        "pytest": pytest.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus.splitlines() if gpus else [],
        "git_commit": run("git", "-C", str(apc.run_dir.parent), "rev-parse", "HEAD"),
        "argv": sys.argv,
    }


def markdown(apc: ApcSession, gate: list[str]) -> str:
    lines = ["# APC validation", "", f"Model `{apc.json_model()}`, profile `{apc.settings.profile}`.", ""]
    lines += [f"- {line}" for line in server_lines(apc)]
    rows = [[_md_cell(k, v) for k, v in r.numbers(apc.settings).items()] for r in pair_rows(apc)]
    if rows:
        lines += ["", tabulate(rows, headers=_md_headers(), tablefmt="github", disable_numparse=True), ""]
    algos = [[_md_cell(k, v) for k, v in r.numbers(apc.settings).items()] for r in algo_rows(apc)]
    if algos:
        lines += ["", "Hash algorithms against the default (equal cached tokens; TTFT ratio algorithm/default):"]
        lines += ["", tabulate(algos, headers=_md_algo_headers(), tablefmt="github", disable_numparse=True), ""]
    cases = sorted({c for r in pair_rows(apc) for c in (r.off.key.case, r.on.key.case)})
    lines += [f"- {case}: {CASE_PURPOSE[case]}" for case in cases] + [""]
    failed = [v for v in apc.verdicts if not v["passed"]]
    lines.append(f"Verdicts: {len(apc.verdicts) - len(failed)} passed, {len(failed)} failed.")
    lines += [f"- FAIL `{v['test']}`: {v['message'].splitlines()[0]}" for v in failed]
    lines += [f"- NOT MEASURED {k.id}: {e.splitlines()[0]}" for k, e in sorted(apc.errors.items())]
    lines += [f"- FAIL baseline: {line}" for line in gate]
    return "\n".join(lines) + "\n"


def _md_cell(name: str, value: Any) -> str:
    return _num(value, ".1%") if name == "hit_ratio" and value is not None else _num(value)


def _md_headers() -> list[str]:
    return ["pair", "conc", "hit?", "cached tokens", "expected", "hit ratio", "TTFT OFF ms", "TTFT ON ms",
            "gain", "gain CI low", "gain CI high", "prefill bound", "in tok/s OFF", "in tok/s ON", "out tok/s OFF",
            "out tok/s ON", "E2E OFF ms", "E2E ON ms", "verdict"]  # fmt: skip


def _md_algo_headers() -> list[str]:
    return ["case", "conc", "hash", "default hash", "cached tokens", "default cached tokens", "TTFT default ms",
            "TTFT ms", "ratio", "ratio CI low", "ratio CI high", "duration default s", "duration s",
            "verdict"]  # fmt: skip


def plots(apc: ApcSession) -> list[str]:
    """PNG plots next to the results file when matplotlib (extra ``plot``) is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    rows = [r.numbers(apc.settings) for r in pair_rows(apc)]
    if not rows:
        return []
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pair in sorted({r["pair"] for r in rows}):
        sub = sorted((r for r in rows if r["pair"] == pair), key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in sub]
        ax.plot(x, [r["median_ttft_off_ms"] for r in sub], "o--", label=f"{pair} OFF")
        ax.plot(x, [r["median_ttft_on_ms"] for r in sub], "o-", label=f"{pair} ON")
    levels = sorted({r["concurrency"] for r in rows})
    ax.set(xscale="log", xlabel="max concurrency", ylabel="median TTFT (ms)", title="Median TTFT, APC ON vs OFF")
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    path = apc.json_path.with_name("ttft.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(str(path))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"{r['pair']} c{r['concurrency']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["expected_cached_tokens"] or 0 for r in rows], 0.4, label="predicted")
    ax.bar([x + 0.2 for x in xs], [r["cached_tokens"] or 0 for r in rows], 0.4, label="measured")
    ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
    ax.set(ylabel="cached tokens", title="Cached tokens: measured vs predicted")
    ax.legend()
    path = apc.json_path.with_name("cached_tokens.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(str(path))
    return written


# -- the baseline gate -------------------------------------------------------------------------------------


def compare_baseline(apc: ApcSession, baseline_path: Path) -> list[str]:
    """Regressions against a stored results file, one message per row and metric."""
    try:
        old = json.loads(baseline_path.read_text())
    except (OSError, ValueError) as err:
        return [f"cannot read baseline {baseline_path}: {err}"]
    if not old.get("pairs"):
        return [f"baseline {baseline_path} has no measured pairs to compare with (an incomplete run?)"]
    old_rows = {(r["pair"], r["concurrency"]): r for r in old["pairs"] if not r.get("hash_algo")}
    tolerances = apc.settings.baseline_tolerance
    failures = []
    rows = [r.numbers(apc.settings) for r in pair_rows(apc)]
    if not rows:
        return [f"nothing was measured to compare with baseline {baseline_path}"]
    for row in rows:
        before = old_rows.get((row["pair"], row["concurrency"]))
        if before is None:
            apc.warnings.append(
                f"baseline {baseline_path} has no row {row['pair']} c{row['concurrency']}: not compared"
            )
            continue
        name = f"{row['pair']} c{row['concurrency']}"
        checks = [
            ("ttft_on", "median TTFT ON (ms)", before["median_ttft_on_ms"], row["median_ttft_on_ms"], +1),
            ("speedup", "TTFT gain OFF/ON", before["ttft_speedup"], row["ttft_speedup"], -1),
            ("cached_tokens", "cached tokens", before["cached_tokens"], row["cached_tokens"], -1),
        ]
        for metric, label, was, now, direction in checks:
            if was is None or now is None:
                continue
            kind, amount = tolerances[metric]
            allowed = abs(was) * amount / 100 if kind == "%" else amount
            worse = (now - was) * direction  # > 0 means a regression
            if worse > allowed:
                limit = f"{amount:g}%" if kind == "%" else f"{amount:g}"
                failures.append(
                    f"{name}: {label} {_num(was)} -> {_num(now)} regressed by {_num(worse)} (allowed {limit}) "
                    f"against {baseline_path}"
                )
    return failures


# -- the controller side -------------------------------------------------------------------------------------


class ControllerReporter:
    """Registered on the controller only (or the single process). Gathers verdicts from every report,
    which is how results cross from xdist workers; gates the exit code; writes every file once."""

    def __init__(self, config: pytest.Config, apc: ApcSession) -> None:
        self.config = config
        self.apc = apc
        self.gate: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            # A test that failed before recording a verdict (cannot verify, not measured) still fails its row.
            found = RUN_ID.search(report.nodeid)
            if found:
                key = RunKey.parse(found.group(1))
                self.apc.failed_runs.update({key.id, *(k.id for k in key.pair())} if "apc_pair" in report.keywords
                                            else {key.id})  # fmt: skip
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == "apc_verdicts" and isinstance(value, list):
                for verdict in value:
                    self.apc.verdicts.append({**verdict, "test": report.nodeid, "outcome": report.outcome})

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # The gate must change testsfailed before pytest_sessionfinish computes the exit status.
        result = yield
        if self.config.option.collectonly:
            return result  # nothing was measured, so there is nothing to gate
        self.apc.load_store()
        if self.apc.settings.baseline:
            self.gate = compare_baseline(self.apc, Path(self.apc.settings.baseline))
            if self.gate:
                session.testsfailed += 1
        return result

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.config.option.collectonly:
            return  # nothing ran: no results to write
        apc = self.apc
        apc.load_store()
        apc.extra_json = {
            "environment": environment(apc),
            "pairs": [r.numbers(apc.settings) for r in pair_rows(apc)],
            "hash_algos": [r.numbers(apc.settings) for r in algo_rows(apc)],
            "gate": {"baseline": apc.settings.baseline or None, "failures": self.gate},
        }
        apc.write_json()
        text = redact(markdown(apc, self.gate))
        md_path = Path(apc.settings.markdown) if apc.settings.markdown else apc.json_path.with_name("summary.md")
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(text)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as handle:
                handle.write(text)
        apc.extra_json["files"] = {"json": str(apc.json_path), "markdown": str(md_path), "plots": plots(apc)}
        apc.write_json()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.config.option.collectonly:
            terminal_summary(terminalreporter, self.apc, self.gate)
