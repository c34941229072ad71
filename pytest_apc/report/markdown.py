"""``summary.md``: the validation, hash-algorithm and fleet tables in GitHub Markdown, the cases' purpose
and the failures.

It renders a :class:`ReportView`, so ``python -m pytest_apc report --markdown`` writes the same summary
from a results file."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from pytest_apc.report.terminal import fleet_lead, fleet_requests, fleet_verdict, offload_lead, server_lines
from pytest_apc.results.formatting import first_line, num
from pytest_apc.results.view import ReportView
from pytest_apc.workload.cases import CASE_PURPOSE

# (key of a pair row, column header), in the order of ReportData.pair_numbers()
PAIR_COLUMNS = (
    ("pair", "pair"), ("concurrency", "conc"), ("cache_hit_observed", "hit?"), ("cached_tokens", "cached tokens"),
    ("expected_cached_tokens", "expected"), ("hit_ratio", "hit ratio"), ("median_ttft_off_ms", "TTFT OFF ms"),
    ("median_ttft_on_ms", "TTFT ON ms"), ("ttft_speedup", "gain"), ("ttft_speedup_low", "gain CI low"),
    ("ttft_speedup_high", "gain CI high"), ("prefill_bound", "prefill bound"),
    ("input_throughput_off", "in tok/s OFF"), ("input_throughput_on", "in tok/s ON"),
    ("output_throughput_off", "out tok/s OFF"), ("output_throughput_on", "out tok/s ON"),
    ("median_e2el_off_ms", "E2E OFF ms"), ("median_e2el_on_ms", "E2E ON ms"), ("verdict", "verdict"),
)  # fmt: skip
# (key of a hash-algorithm row, column header), in the order of ReportData.algo_numbers()
ALGO_COLUMNS = (
    ("case", "case"), ("concurrency", "conc"), ("hash_algo", "hash"), ("default_hash_algo", "default hash"),
    ("cached_tokens", "cached tokens"), ("default_cached_tokens", "default cached tokens"),
    ("median_ttft_default_ms", "TTFT default ms"), ("median_ttft_ms", "TTFT ms"), ("ttft_ratio", "ratio"),
    ("ttft_ratio_low", "ratio CI low"), ("ttft_ratio_high", "ratio CI high"),
    ("duration_default_s", "duration default s"), ("duration_s", "duration s"), ("verdict", "verdict"),
)  # fmt: skip

# (key of a fleet row, column header), in the order of ReportData.fleet_numbers()
FLEET_COLUMNS = (
    ("route", "route"), ("concurrency", "conc"), ("replicas", "replicas"),
    ("requests_per_replica", "requests per replica"), ("cold_prefills", "cold prefills"),
    ("ideal_cold_prefills", "ideal"), ("hits", "hits"), ("ideal_hits", "ideal hits"),
    ("extra_prefill_tokens", "extra prefill tokens"), ("routing_cost", "routing cost"),
    ("median_ttft_ms", "TTFT ms"), ("median_ttft_low_ms", "TTFT CI low"), ("median_ttft_high_ms", "TTFT CI high"),
    ("p99_ttft_ms", "p99 TTFT ms"), ("output_throughput", "out tok/s"), ("request_throughput", "req/s"),
    ("passed", "verdict"),
)  # fmt: skip


# (key of an offload row, column header), in the order of ReportData.offload_numbers()
OFFLOAD_COLUMNS = (
    ("case", "case"), ("concurrency", "conc"), ("tier_gib", "tier GiB"), ("gpu_blocks", "GPU blocks"),
    ("input_tokens", "prompt tokens"), ("gpu_cache_hits", "GPU cache hits"), ("tier_hits", "tier hits"),
    ("computed_tokens", "computed"), ("hits_all_tiers", "hits, all tiers"), ("expected_hits", "predicted"),
    ("gpu_cache_hits_replayed", "GPU hits replayed"), ("prefix_cache_queries", "queries counted"),
    ("median_ttft_ms", "TTFT ms"), ("p99_ttft_ms", "p99 TTFT ms"), ("verdict", "verdict"),
)  # fmt: skip


def markdown(view: ReportView) -> str:
    lines = ["# APC validation", "", f"Model `{view.model}`, profile `{view.profile}`.", ""]
    lines += [f"- {line}" for line in server_lines(view.servers, view.launches)]
    columns = list(PAIR_COLUMNS)
    if any("hash_algo" in n for n in view.pairs):  # schema_version 1 kept hash-algorithm rows among the pairs
        columns.insert(2, ("hash_algo", "hash"))
    rows = [[_md_cell(k, n.get(k)) for k, _ in columns] for n in view.pairs]
    if rows:
        headers = [h for _, h in columns]
        lines += ["", tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True), ""]
    algos = [[_md_cell(k, n.get(k)) for k, _ in ALGO_COLUMNS] for n in view.algos]
    if algos:
        headers = [h for _, h in ALGO_COLUMNS]
        lines += ["", "Hash algorithms against the default (equal cached tokens; TTFT ratio algorithm/default):"]
        lines += ["", tabulate(algos, headers=headers, tablefmt="github", disable_numparse=True), ""]
    fleet = [[_fleet_cell(k, n) for k, _ in FLEET_COLUMNS] for n in view.fleet]
    if fleet:
        headers = [h for _, h in FLEET_COLUMNS]
        lines += ["", f"{fleet_lead(view.fleet)}:"]
        lines += ["", tabulate(fleet, headers=headers, tablefmt="github", disable_numparse=True), ""]
        lines += [f"- FLEET {n.get('id')}: {first_line(n['error'])}" for n in view.fleet if n.get("error")]
    if view.fleet_without_rows:
        lines += ["", f"Fleet runs {', '.join(view.fleet_without_rows)}: no fleet table in this file.", ""]
    offload = [[num(n.get(k)) if k != "case" else str(n.get(k)) for k, _ in OFFLOAD_COLUMNS] for n in view.offload]
    if offload:
        headers = [h for _, h in OFFLOAD_COLUMNS]
        lines += ["", f"{offload_lead(view.offload)}:"]
        lines += ["", tabulate(offload, headers=headers, tablefmt="github", disable_numparse=True), ""]
    lines += [f"- {case}: {CASE_PURPOSE.get(case, '')}" for case in view.cases()] + [""]
    failed = [v for v in view.verdicts if not v["passed"]]
    lines.append(f"Verdicts: {len(view.verdicts) - len(failed)} passed, {len(failed)} failed.")
    lines += [f"- FAIL `{v.get('test')}`: {first_line(v.get('message'))}" for v in failed]
    lines += [f"- NOT MEASURED {run_id}: {first_line(error)}" for run_id, error in view.errors]
    lines += [f"- FAIL baseline: {line}" for line in view.gate.get("failures") or []]
    return "\n".join(lines) + "\n"


def _md_cell(name: str, value: Any) -> str:
    return num(value, ".1%") if name == "hit_ratio" and value is not None else num(value)


def _fleet_cell(name: str, row: dict[str, Any]) -> str:
    if name == "requests_per_replica":
        return fleet_requests(row)
    if name == "passed":
        return fleet_verdict(row)
    if name == "routing_cost":
        return num(row.get(name), ".1%")
    return num(row.get(name))
