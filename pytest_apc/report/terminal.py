"""What pytest prints: the header lines, progress lines, the validation, hash-algorithm and fleet tables,
the server lines and the terminal summary.

The tables and the summary render a :class:`ReportView` (row dicts, as results.json stores them), so
``python -m pytest_apc report`` prints a results file through the same functions."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from tabulate import tabulate

from pytest_apc.config import Settings, flag_value, model_path_for_display
from pytest_apc.measure.estimate import run_seconds
from pytest_apc.measure.provenance import LAYOUT_FLAGS
from pytest_apc.measure.session import ApcSession
from pytest_apc.redaction import redact
from pytest_apc.results.columns import Row, cells
from pytest_apc.results.formatting import ARROW, MISSING, first_line, num, percent, two
from pytest_apc.results.rows import AlgoRow, FleetRow, PairRow, TierRow
from pytest_apc.results.view import ReportView
from pytest_apc.workload.cases import RunKey

R = TypeVar("R", bound=Row)
Markup = dict[str, bool]  # keyword arguments of pytest's TerminalWriter.write_line: red, yellow, bold


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
    """Progress lines while servers start and runs measure: shown on a terminal and in a CI log alike,
    not under -q."""
    show = tr is not None and config.get_verbosity() >= 0
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


# Rows as a session builds them or as results.json stores them (``python -m pytest_apc report``, the docs).
Rows = Sequence[R | Mapping[str, Any]]


def rendered(kind: type[R], rows: Rows[R], verbose: bool = False) -> str:
    """The terminal table of rows of ``kind``: the columns it declares (-v adds its own)."""
    typed = kind.typed(rows)
    headers, body = cells(kind.terminal_columns(typed, verbose), typed)
    return tabulate(body, headers=headers, disable_numparse=True)


def duration(seconds: float) -> str:
    """A rough span of time: ``41 s``, ``6 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class RunProgress:
    """A progress line as each run starts and ends (the session's ``on_run``): "run i of N", what the run
    measured or why it failed, and an estimate of the time left from what was measured so far (each run left
    as ``estimate.run_seconds`` has it, or, while no run is measured, the mean seconds of those that failed;
    plus the mean start-up of the servers started times the servers left to start; stopping servers is not
    counted)."""

    def __init__(self, session: ApcSession, write: Callable[[str], None]) -> None:
        self.session = session
        self.write = write
        self.seconds: list[float] = []  # each run this process measured
        self.numbers: dict[RunKey, str] = {}  # "run i of N" of each run, fixed when it started

    def __call__(self, key: RunKey, seconds: float | None) -> None:
        if seconds is None:
            self.numbers[key] = f"run {len(self._done()) + 1} of {len(self.session.plan.keys)}"
            self.write(f"{key.mode.name}: {self.numbers[key]}: measuring {key.id}")
            return
        self.seconds.append(seconds)
        number = self.numbers.pop(key, f"run {len(self._done())} of {len(self.session.plan.keys)}")
        self.write(f"{key.mode.name}: {number}: {key.id} {self._outcome(key, seconds)}; {self._left()}")

    def _done(self) -> set[RunKey]:
        measured = self.session.measured
        return {k for k in self.session.plan.keys if k in measured.records or k in measured.errors}

    def _outcome(self, key: RunKey, seconds: float) -> str:
        measured = self.session.measured
        record = measured.records.get(key)
        if record is None:
            return f"failed after {duration(seconds)}: {first_line(measured.errors.get(key))}"
        row = record.to_json()
        hits = row["hits_all_tiers"] if key.family == "offload" else row["prefix_cache_hits"]  # the tiers' too
        if not key.apc:  # its prediction is the ON partner's; an OFF server hits nothing
            cached = f"cached {num(hits)} (APC off)"
        else:
            cached = f"cached {two(hits, record.prediction.expected_hits if record.prediction else None, '/')}"
        return f"done in {duration(seconds)}: {cached}, TTFT {num(row['median_ttft_ms'])} ms"

    def _left(self) -> str:
        session = self.session
        done = self._done()
        left = [key for key in session.plan.keys if key not in done]
        runs = len(left)
        if not runs:
            return "nothing left to measure"
        servers = len([m for m in session.plan.modes() if m not in session.measured.done_modes])
        startups = [info.startup_s for info in session.measured.servers.values() if info.startup_s is not None]
        records = session.measured.records.values()
        if records:
            estimate = sum(run_seconds(key, records, session.settings)[0] for key in left)
        else:
            estimate = sum(self.seconds) / len(self.seconds) * runs
        if servers and startups:
            estimate += sum(startups) / len(startups) * servers
        what = _count(runs, "run") + (f", {_count(servers, 'server start')}" if servers else "")
        return f"about {duration(estimate)} left ({what})"


def table(rows: Rows[PairRow], verbose: bool = False) -> str:
    """The validation table of pair rows (results.json's ``pairs``; a file first written by schema_version 1
    also keeps the rows of hash-algorithm servers there, named e.g. ``E/F xxhash``); fits 150 columns, -v adds
    columns."""
    return rendered(PairRow, rows, verbose)


def pair_legend(rows: Rows[PairRow]) -> str | None:
    """The line below the validation table that says what its verdicts held each pair to (None when no timing
    verdict judged a pair)."""
    if not any(row.timing for row in PairRow.typed(rows)):
        return None
    return (
        "verdict: the pair's tests; its TTFT held to faster (a significant gain) or only to not slower (within the "
        "overhead tolerance)"
    )


def algo_lead(rows: Rows[AlgoRow]) -> str:
    """The line above the hash-algorithm table: what each row is held to."""
    default = AlgoRow.typed(rows)[0].default_hash_algo or "not reported"
    return (
        f"hash algorithms vs the default ({default}): cached tokens must be equal, TTFT and duration (default"
        f"{ARROW}algorithm) not slower beyond the overhead tolerance"
    )


def algo_table(rows: Rows[AlgoRow]) -> str:
    """Each hash algorithm against the default one (results.json's ``hash_algos``): same cached tokens, TTFT
    and duration within tolerance."""
    return rendered(AlgoRow, rows)


def fleet_lead(rows: Rows[FleetRow]) -> str:
    """The line above the fleet table: the concurrency and prefix groups of its runs, and what it compares."""
    typed = FleetRow.typed(rows)
    parts = []
    for case, what in (("R", "prefix group"), ("M", "conversation")):
        of_case = [n for n in typed if n.case == case]
        if not of_case:
            continue
        levels = "/".join(str(c) for c in sorted({int(n.concurrency) for n in of_case}))
        groups = sorted({int(n.prefix_groups) for n in of_case})
        parts.append(f"case {case}, c{levels}, {'/'.join(map(str, groups))} {what}{'' if groups == [1] else 's'}")
    ideal = "one per group" + ("; case M: one per conversation" if any(n.case == "M" for n in typed) else "")
    return f"fleet ({'; '.join(parts)}): cold prefills vs ideal ({ideal}); cost = extra prefill / APC's saving"


def fleet_table(rows: Rows[FleetRow], verbose: bool = False) -> str:
    """One row per fleet run (results.json's ``fleet``): where the requests landed, cold prefills and hits
    against the ideal, the routing cost, TTFT and output throughput; -v adds the p90 TTFT. The concurrency
    is in :func:`fleet_lead` (and in a row's route where the runs have several)."""
    return rendered(FleetRow, rows, verbose)


def offload_lead(rows: Rows[TierRow]) -> str:
    """The line above the offload table: what its columns compare."""
    typed = TierRow.typed(rows)
    groups = "/".join(str(g) for g in sorted({int(n.prefix_groups) for n in typed if n.case != "M"}))
    cases = ([f"cases N/O, {groups} prefix groups"] if groups else []) + (
        ["case M's conversations, every turn together"] if any(n.case == "M" for n in typed) else []
    )
    return (
        f"offload ({'; '.join(cases)}): prompt tokens served by the GPU cache and the CPU tier; "
        "all tiers vs one server's prediction; GPU cache vs the replay of vLLM's block pool (exact at c1)"
    )


def offload_table(rows: Rows[TierRow], verbose: bool = False) -> str:
    """One row per offload run (results.json's ``offload``); -v adds the p90 TTFT."""
    return rendered(TierRow, rows, verbose)


def fleet_lines(view: ReportView, verbose: bool = False) -> list[tuple[str, Markup]]:
    """The fleet table, a line per fleet run whose locality could not be told, and, for a results file
    written before the fleet block, the fleet runs it has no table for."""
    lines: list[tuple[str, Markup]] = []
    if view.fleet:
        lines.append((fleet_lead(view.fleet), {}))
        lines.append((fleet_table(view.fleet, verbose), {}))
        lines += [(f"FLEET {n.id}: {first_line(n.error)}", {"red": True}) for n in view.fleet if n.error]
    return lines


def gate_table(rows: list[dict[str, Any]]) -> str:
    """Every run the baseline gate compared: its repeats (baseline/now), mean TTFT baseline -> now (limit)
    with the change and the smallest slowdown the limit catches, cached tokens, and whether it regressed."""
    body = []
    for row in rows:
        metrics = {m["metric"]: m for m in row["metrics"]}
        ttft, hits = metrics.get("ttft"), metrics.get("cached_tokens")
        ttft_cells = [MISSING, MISSING, MISSING]
        if ttft:
            mark = " !" if ttft["result"] == "REGRESSED" else ""
            ttft_cells = [
                f"{two(ttft['was'], ttft['now'])} (<= {num(ttft['limit'])}){mark}",
                percent(ttft["change"]),
                f">= {percent(ttft['detectable'])}",
            ]
        hits_cell = MISSING
        if hits:
            hits_cell = two(hits["was"], hits["now"]) + (" !" if hits["result"] == "REGRESSED" else "")
        k_base, k_now = row["repeats"]
        body.append([row["run"], f"{k_base}/{k_now}", *ttft_cells, hits_cell, row["result"]])
    headers = ["run", "K", "mean TTFT ms", "change", "catches", "cached tokens", "vs baseline"]
    return tabulate(body, headers=headers, disable_numparse=True)


def gate_rule_lines(gate: Mapping[str, Any]) -> list[str]:
    """The rule the gate applied, the noise it assumed and the versions it compared across."""
    rule = gate.get("rule") or {}
    lines = []
    if rule.get("runs_judged"):
        judged = int(rule["runs_judged"])
        each = f" ({rule['alpha_per_run']:.2%} for each of {judged} runs)" if judged > 1 else ""
        lines.append(
            f"rule: {rule['label']} may rise as far as its noise allows; a build that did not change fails this "
            f"gate with probability <= {rule['false_alarm']:.0%}{each}"
        )
        if rule.get("benchmark_s") is not None:
            lines.append(
                f"cost: the {judged} judged run{'s' * (judged != 1)} took {rule['benchmark_s'] / 60:.1f} min of "
                f"benchmarks here, {rule['extra_s'] / 60:.1f} min more than one repeat each would"
            )
    sources = dict.fromkeys(m["noise"] for row in gate.get("rows") or [] for m in row["metrics"] if m.get("noise"))
    lines += [f"noise: {source}" for source in sources]
    changes = gate.get("changes") or []
    if changes:
        lines.append(
            "compared across "
            + "; ".join(
                f"{c['what']} {c['here']} here vs {c['there']} there" + (f" ({c['note']})" if c.get("note") else "")
                for c in changes
            )
        )
    return lines


def server_lines(servers: list[dict[str, Any]], launches: Mapping[str, int]) -> list[str]:
    """One line per server (``ServerInfo`` fields, as results.json stores them)."""
    lines = []
    for info in servers:
        command = [str(a) for a in info.get("command") or []]
        tp = flag_value(command, LAYOUT_FLAGS["tensor_parallel_size"][0]) or "1"
        members = info.get("members") or []  # a fleet: each replica's own (the line shows replica 1's)
        each = f" each of {len(members)} replicas" if members else ""
        lines.append(
            f"{info.get('mode')}: vLLM {info.get('version')}, TP {tp}, block size {info.get('block_size')}, "
            f"{num(info.get('num_gpu_blocks'))} blocks = {num(info.get('kv_cache_size_tokens'))} KV tokens{each}, "
            f"hash {info.get('prefix_caching_hash_algo')}, ready in {num(info.get('startup_s'), '.0f')} s, "
            f"launches {launches.get(str(info.get('mode')), 0)}"
        )
    return lines


def gate_lines(gate: Mapping[str, Any]) -> list[tuple[str, Markup]]:
    """What the baseline gate shows (``Gate.to_json()``, results.json's ``gate``): its rule, every compared
    run, then one line per failure."""
    lines: list[tuple[str, Markup]] = []
    rows = gate.get("rows") or []
    if rows:
        compared = gate.get("compared", len(rows))
        regressed = gate.get("regressed", sum(1 for row in rows if row["result"] != "ok"))
        refused = f", {gate['refused']} refused" if gate.get("refused") else ""  # each also a FAIL line below
        what = "row" if "pair" in rows[0] else "run"
        lines.append(
            (
                f"baseline {gate.get('baseline')}: {compared} {what}{'' if compared == 1 else 's'} compared, "
                f"{regressed} regressed{refused} (baseline{ARROW}now (limit))",
                {},
            )
        )
        lines += [(line, {}) for line in gate_rule_lines(gate)]
        lines.append((gate_table(rows), {}))
    lines += [(f"FAIL baseline: {line}", {"red": True, "bold": True}) for line in gate.get("failures") or []]
    return lines


def summary_lines(view: ReportView, verbose: bool = False) -> list[tuple[str, Markup]]:
    """The terminal summary below its separator, each line with its markup for pytest's terminal writer."""
    lines: list[tuple[str, Markup]] = []
    model = model_path_for_display(view.model)
    fleet_only = not view.pairs and bool(view.fleet or view.offload)
    legend = "" if fleet_only else f"; TTFT, tok/s, E2E: APC off{ARROW}on; gain = median TTFT off/on"
    lines.append((f"model {model} ({view.profile} profile){legend}", {}))
    lines += [(line, {}) for line in server_lines(view.servers, view.launches)]
    if view.fit:
        lines.append((view.fit, {"yellow": True, "bold": True}))
    if view.pairs:
        lines.append((table(view.pairs, verbose=verbose), {}))
        held = pair_legend(view.pairs)
        lines += [(held, {})] if held else []
    if view.algos:
        lines.append((algo_lead(view.algos), {}))
        lines.append((algo_table(view.algos), {}))
    lines += fleet_lines(view, verbose)
    if view.offload:
        lines += [(offload_lead(view.offload), {}), (offload_table(view.offload, verbose), {})]
    lines += [(f"UNPAIRED {line}", {"yellow": True}) for line in view.unpaired]
    for run_id, error in view.errors:
        lines.append((f"NOT MEASURED {run_id}: {first_line(error)}", {"red": True}))
    lines += [(f"WARNING {line}", {"yellow": True}) for line in view.warnings]
    lines += gate_lines(view.gate)
    lines.append((f"results: {view.results}", {}))
    return lines


def terminal_summary(tr: Any, view: ReportView) -> None:
    tr.write_sep("=", "apc validation")
    for text, markup in summary_lines(view, tr.config.get_verbosity() > 0):
        tr.write_line(text, **markup)
