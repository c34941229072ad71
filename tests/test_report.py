"""The report's rows: which verdicts colour which row, and how numbers read.

Records are built by hand (as in test_verdict.py) so that a failing comparison can be placed exactly; the
real-vLLM rows are checked in test_e2e_cpu.py."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import numpy as np

from pytest_apc import verdicts
from pytest_apc.gate import compare as gate
from pytest_apc.measure.answers import Probe
from pytest_apc.measure.records import Measured
from pytest_apc.report import markdown, terminal
from pytest_apc.report.controller import report_blocks
from pytest_apc.results import document as results
from pytest_apc.results import formatting, rows
from pytest_apc.results.view import ReportView
from pytest_apc.verdicts import figures
from pytest_apc.workload.cases import RunKey
from tests.test_verdict import delta, off_delta, record, settings


def _session(s, runs):
    return SimpleNamespace(settings=s, measured=Measured(records={r.key: r for r in runs}),
                           json_path="results.json", json_model=lambda: "tiny")  # fmt: skip


def _data(apc, verdicts=(), failed=()) -> rows.ReportData:
    """The report's rows, computed once, as the controller does after the tests ran."""
    return rows.ReportData.build(apc.measured.records, rows.Outcomes(list(verdicts), set(failed)), apc.settings)


def _document(apc, data) -> dict:
    """The session's results document, as the controller builds it for every report."""
    doc = results.document(apc.settings, apc.measured, apc.json_model(), "2026-12-01T00:00:00+00:00", 1.0)
    return {**doc, **report_blocks(data, gate.Gate())}


def _view(apc, data) -> ReportView:
    return ReportView.from_document(_document(apc, data), apc.json_path)


def _algo_run(s, base, algo: str, ttft_ms: float, hits: int | None = None):
    """``base`` measured again on the server of hash algorithm ``algo``."""
    run = record(s, base.key.case, base.key.concurrency, delta(base.bench["total_input_tokens"],
                 base.delta.prefix_cache_hits if hits is None else hits), ttft_ms)  # fmt: skip
    server = dataclasses.replace(run.server, mode=f"apc-on-{algo}", prefix_caching_hash_algo=algo)
    return dataclasses.replace(run, key=RunKey(base.key.case, base.key.concurrency, algo), server=server)


def _judged(v: verdicts.Verdict, test: str) -> dict:
    return {**v.to_json(), "test": test, "outcome": "passed" if v.passed else "failed"}


def test_number_format_reads_at_every_magnitude() -> None:
    assert formatting.num(31224.8) == "31,225"  # no 3.122e+04
    assert formatting.num(950736) == "950,736"
    assert formatting.num(1.4944) == "1.49"
    assert formatting.num(47.404) == "47.4"
    assert formatting.num(None) == "n/a"  # not measured, in every column
    assert formatting.num(True) == "yes"
    assert formatting.num(0.478, ".1%") == "47.8%"


def test_a_failed_algorithm_comparison_fails_its_row_not_the_default_pair(pytester) -> None:
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    on.server.prefix_caching_hash_algo = "sha256"
    short = _algo_run(s, on, "xxhash", 41.0, hits=on.delta.prefix_cache_hits - 128)
    same = _algo_run(s, on, "sha256_cbor", 40.5)
    judged = [
        _judged(verdicts.prefill_saved(verdicts.Pair(off, on, s)), "test_pure[D-c8]"),
        _judged(verdicts.same_as_default(short, on, s), "test_same_as_default[D-c8-xxhash]"),
        _judged(verdicts.same_as_default(same, on, s), "test_same_as_default[D-c8-sha256_cbor]"),
    ]
    apc = _session(s, [off, on, short, same])
    data = _data(apc, judged)

    pairs = {row.name: row.verdict for row in data.pairs}
    assert pairs == {"C/D": "PASS"}  # judged by its own verdicts; the algorithms have their own table
    algos = {row.run.key.id: row.numbers for row in data.algos}
    assert algos["D-c8-xxhash"]["verdict"] == "FAIL"
    assert algos["D-c8-xxhash"]["cached_tokens"] == algos["D-c8-xxhash"]["default_cached_tokens"] - 128
    assert algos["D-c8-sha256_cbor"]["verdict"] == "PASS"
    assert algos["D-c8-sha256_cbor"]["default_hash_algo"] == "sha256"
    assert 0.9 < algos["D-c8-sha256_cbor"]["ttft_ratio"] < 1.1

    table = terminal.algo_table(data.algo_numbers()).splitlines()
    assert any(line.startswith("D xxhash") and line.endswith("FAIL") for line in table)
    assert any(line.startswith("D sha256_cbor") and line.endswith("PASS") for line in table)
    summary = markdown.markdown(_view(apc, data))
    algo_lines = [line for line in summary.splitlines() if line.startswith("| D ") and "| sha256 " in line]
    assert [("xxhash" in line, line.split("|")[-2].strip()) for line in algo_lines] == [(False, "PASS"), (True, "FAIL")]


def test_a_test_that_failed_before_its_verdict_fails_the_algorithm_row(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, delta(1000, 512), 40.0)
    algo = _algo_run(s, on, "xxhash", 40.0)
    data = _data(_session(s, [on, algo]), failed={"D-c8-xxhash"})
    assert [row.verdict for row in data.algos] == ["FAIL"]
    assert data.pairs == []  # no OFF run: no pair row


def test_latencies_and_throughputs_cover_every_repeat(pytester) -> None:
    """With --apc-repeats, the row's E2E latency and throughputs come from all repeats, not the first;
    with one repeat they are vLLM's own numbers."""
    s = settings(pytester)
    run = record(s, "D", 8, delta(1000, 512), 40.0)
    first = run.repeats[0]
    first.bench.update(latencies=[0.1, 0.2, 0.3], duration=2.0, completed=3, total_output_tokens=30,
                       median_e2el_ms=200.0, output_throughput=15.0)  # fmt: skip
    one = run.to_json()
    assert one["median_e2el_ms"] == first.bench["median_e2el_ms"]
    assert one["output_throughput"] == first.bench["output_throughput"]

    second = dataclasses.replace(first, bench={**first.bench, "latencies": [0.7, 0.8, 0.9], "duration": 4.0})
    both = dataclasses.replace(run, repeats=[first, second]).to_json()
    assert both["median_e2el_ms"] == 500.0  # median of 100, 200, 300, 700, 800, 900 ms
    assert both["output_throughput"] == 60 / 6.0
    assert both["request_throughput"] == 6 / 6.0
    assert both["bench_duration_s"] == 3.0


def test_an_algorithm_row_without_per_request_samples_shows_n_a(pytester) -> None:
    s = settings(pytester)
    on = record(s, "D", 8, delta(1000, 512), 40.0)
    algo = _algo_run(s, on, "xxhash", 40.0)
    algo.repeats[0].bench["ttfts"] = []
    data = _data(_session(s, [on, algo]))
    row = data.algos[0].numbers
    assert row["ttft_ratio"] is None
    header, _, line = terminal.algo_table(data.algo_numbers()).splitlines()
    cells = dict(zip(re.split(r"\s{2,}", header), re.split(r"\s{2,}", line), strict=True))
    assert cells["TTFT algo/default"] == "n/a"  # the one mark of a figure not measured, not "-x [-,-]"


def test_the_rows_are_computed_once_whatever_reads_them(pytester, monkeypatch, tmp_path) -> None:
    """The bootstrap behind a row runs when the rows are built, not again for the table, Markdown or gate."""
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    calls = []
    real = figures.ttft_gain
    monkeypatch.setattr(
        figures, "ttft_gain", lambda off, on, s: calls.append(f"{off.key.id}/{on.key.id}") or real(off, on, s)
    )
    apc = _session(s, [off, on])
    data = _data(apc)
    assert calls == ["C-c8/D-c8"]

    baseline = _document(apc, data)
    baseline["runs"][1]["repeat_counters"][0]["delta"]["prefix_cache_hits"] *= 2
    assert "C/D" in terminal.table(data.pair_numbers())
    assert "| C/D " in markdown.markdown(_view(apc, data))
    failures = gate.compare_documents(baseline, _document(apc, data), str(tmp_path), 0.01, 1).failures
    assert len(failures) == 1
    assert failures[0].startswith("D-c8: cached tokens ")
    assert calls == ["C-c8/D-c8"]  # nothing recomputed


def test_one_rule_judges_every_kind_of_row() -> None:
    """A row fails when a verdict about its runs failed, or a test about them did; whatever the verdict or
    the test is called. A verdict is about the row when it names one of its runs and nothing beyond the
    runs the row compares them with."""
    passed = {"passed": True, "outcome": "passed", "name": "anything"}
    outcomes = rows.Outcomes([
        {**passed, "runs": ["C-c8", "D-c8"]},
        {**passed, "runs": ["D-c8-xxhash", "D-c8"], "passed": False, "outcome": "failed"},
        {**passed, "runs": ["R-c8-round_robin"], "outcome": "failed"},  # the verdict passed, its test failed
    ], failed_runs={"O-c1"})  # fmt: skip
    assert outcomes.verdict_label({"C-c8", "D-c8"}) == "PASS"  # the algorithm's comparison is not the pair's
    assert outcomes.verdict_label({"D-c8-xxhash"}, compared_with={"D-c8"}) == "FAIL"
    assert outcomes.verdict_label({"D-c8-xxhash"}) == "-"  # a verdict naming a run beyond the row's
    assert outcomes.verdict_label({"R-c8-round_robin"}) == "FAIL"
    assert outcomes.verdict_label({"O-c1"}, compared_with={"N-c1"}) == "FAIL"  # its test failed before a verdict
    assert outcomes.verdict_label({"N-c1"}, compared_with={"O-c1"}) == "-"  # the run it is compared with failed


def test_every_row_reads_back_from_what_results_json_stores(pytester) -> None:
    """``report FILE`` rebuilds the rows from the file: each kind reads back equal to the row the session
    built."""
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    data = _data(_session(s, [off, on, _algo_run(s, on, "xxhash", 41.0)]))
    for built in [*data.pairs, *data.algos]:
        assert type(built).from_json(built.to_json()) == built
    assert [c.header for c in rows.PairRow.markdown_columns()][:3] == ["pair", "conc", "hit?"]


def test_the_p90_ttft_shows_with_v_and_in_summary_md_where_the_runs_have_it(pytester) -> None:
    """Runs store their p90 TTFT beside the p99; the pair table shows it off -> on with -v, summary.md in two
    columns. A file written before runs stored it prints as it did: no p90 column anywhere."""
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    on = record(s, "D", 8, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), 40.0)
    apc = _session(s, [off, on])
    data = _data(apc)
    p90_off, p90_on = (float(np.percentile(r.samples_ms("ttfts"), 90)) for r in (off, on))
    assert (off.to_json()["p90_ttft_ms"], on.to_json()["p90_ttft_ms"]) == (p90_off, p90_on)
    assert data.pairs[0].p90_ttft_off_ms < off.to_json()["p99_ttft_ms"]

    def header(text: str) -> list[str]:
        return [c.strip() for c in next(line for line in text.splitlines() if line.startswith("pair")).split("  ")
                if c.strip()]  # fmt: skip

    assert "p90 TTFT ms" not in header(terminal.table(data.pair_numbers()))  # the default table keeps 150 columns
    verbose = terminal.table(data.pair_numbers(), verbose=True)
    assert header(verbose)[5:8] == ["TTFT ms", "p90 TTFT ms", "gain/bound"]
    assert f"  {formatting.num(p90_off)} -> {formatting.num(p90_on)}  " in verbose.splitlines()[-1]
    summary = next(line for line in markdown.markdown(_view(apc, data)).splitlines() if line.startswith("| pair"))
    assert [c.strip() for c in summary.split("|")][7:11] == ["TTFT OFF ms", "TTFT ON ms", "p90 TTFT OFF ms",
                                                              "p90 TTFT ON ms"]  # fmt: skip

    older = _document(apc, data)
    for row in older["pairs"]:
        del row["p90_ttft_off_ms"], row["p90_ttft_on_ms"]
    view = ReportView.from_document(older, "results.json")
    assert "p90" not in terminal.table(view.pairs, verbose=True)
    assert "p90" not in markdown.markdown(view)


def test_junit_properties_carry_the_p90_ttft(pytester) -> None:
    from pytest_apc.report.junit import record_properties

    s = settings(pytester)
    run = record(s, "D", 8, delta(1000, 512), 40.0)
    node = SimpleNamespace(user_properties=[])
    record_properties(node, run)
    assert dict(node.user_properties)["apc_p90_ttft_ms"] == run.to_json()["p90_ttft_ms"] > 40.0


def _repeats(run, *changes: dict):
    """``run`` with one repeat per ``changes`` (``delta``, ``scale``: its TTFTs multiplied, ``parts``)."""
    first = run.repeats[0]
    repeats = [
        dataclasses.replace(
            first,
            delta=c.get("delta", first.delta),
            parts=c.get("parts", first.parts),
            bench={**first.bench, "ttfts": [t * c.get("scale", 1.0) for t in first.bench.get("ttfts") or []]},
        )
        for c in changes
    ]
    return dataclasses.replace(run, repeats=repeats)


def test_a_row_shows_the_numbers_its_verdict_judged_on_every_repeat(pytester) -> None:
    """A row reads the figures its verdict judged, on every repeat: the gain and its interval, the cached
    tokens of the repeat the verdict shows (the first that failed, not the first), the hash algorithm's
    comparison, where a fleet run's requests landed and the answers; here the first repeat differs from
    what every repeat together says."""
    from tests.test_answers import answer
    from tests.test_fleet_report import ROUND_ROBIN, _measured

    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 120.0)
    tokens, expected = int(off.bench["total_input_tokens"]), off.prediction.expected_hits
    off = _repeats(off, {}, {"scale": 1.5}, {"scale": 0.7})
    good, short = delta(tokens, expected), delta(tokens, expected - 4096)
    on = _repeats(record(s, "D", 8, good, 40.0), {}, {"delta": short, "scale": 2.0}, {"scale": 0.5})
    on.probes = [Probe(0, answer([1, 2, 3]), answer([1, 2, 3])), Probe(1, answer([4, 5, 6]), answer([4, 9, 9]))]
    off.probes = [Probe(0, answer([1, 2, 3])), Probe(1, answer([4, 5, 6]))]
    algo = _algo_run(s, on, "xxhash", 41.0)
    algo = _repeats(algo, {}, {"delta": delta(tokens, expected - 128), "scale": 1.3}, {})
    fleet = _measured()
    rr = fleet.records[ROUND_ROBIN]
    spread = rr.repeats[0].parts
    one_replica = fleet.records[RunKey("R", 8, route="consistent_hash")].repeats[0].parts
    rr = _repeats(rr, {"parts": spread}, {"parts": one_replica})  # round_robin broke its promise in repeat 2
    runs = {r.key: r for r in (off, on, algo, rr)}
    data = rows.ReportData.build(runs, rows.Outcomes(), s)
    pair_row, algo_row, fleet_row = data.pairs[0], data.algos[0], data.fleet[0]

    hits = verdicts.cached_tokens_match(on)
    assert not hits.passed
    assert hits.numbers["hits"] == expected - 4096 != on.repeats[0].delta.cached_tokens
    assert (pair_row.cached_tokens, pair_row.hit_ratio) == (hits.numbers["hits"], hits.numbers["hits"] / tokens)
    gain = verdicts.ttft_gain(verdicts.Pair(off, on, s)).numbers
    first_only = verdicts.ttft_gain(verdicts.Pair(_repeats(off, {}), _repeats(on, {}), s)).numbers
    assert gain["ttft_speedup_low"] != first_only["ttft_speedup_low"]
    shown = (pair_row.ttft_speedup, pair_row.ttft_speedup_low, pair_row.ttft_speedup_high)
    assert shown == (gain["ttft_speedup"], gain["ttft_speedup_low"], gain["ttft_speedup_high"])
    assert pair_row.answers == verdicts.same_answers(verdicts.Pair(off, on, s)).numbers["answers"] == "2 DIFFER"
    assert algo_row.answers == verdicts.same_answers(algo).numbers["answers"]

    same = verdicts.same_as_default(algo, on, s)
    assert not same.passed  # the hits differ in the second repeat only
    assert (algo_row.cached_tokens, algo_row.default_cached_tokens) == (
        same.numbers["hits"],
        same.numbers["default_hits"],
    )
    assert (algo_row.ttft_ratio, algo_row.ttft_ratio_low) == (
        same.numbers["ttft_ratio"],
        same.numbers["ttft_ratio_low"],
    )

    where = verdicts.prefix_locality(rr, s)
    assert not where.passed
    assert where.numbers["cold_prefills"] != where.numbers["repeats"][0]["cold_prefills"]
    assert fleet_row.requests_per_replica == [r["requests"] for r in where.numbers["replicas"]]
    for name in ("cold_prefills", "hits", "ideal_hits", "extra_prefill_tokens", "routing_cost"):
        assert getattr(fleet_row, name) == where.numbers[name], name
    assert fleet_row.ideal_cold_prefills == where.numbers["ideal_cold_prefills"]


def _cells(table: str, first: str) -> dict[str, str]:
    """The cells of the terminal table row that starts with ``first``, by header (cells two spaces apart)."""
    lines = table.splitlines()
    row = next(line for line in lines if line.startswith(first))
    return dict(zip(re.split(r"\s{2,}", lines[0].strip()), re.split(r"\s{2,}", row.strip()), strict=True))


def _md_cells(text: str, first: str) -> dict[str, str]:
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| pair "))
    row = next(line for line in lines if line.startswith(f"| {first} "))
    return dict(zip(*([c.strip() for c in line.split("|")[1:-1]] for line in (header, row)), strict=True))


def test_a_pair_verdict_says_what_its_ttft_was_held_to_in_every_output(pytester) -> None:
    """PASS beside a gain under 1x reads "PASS not slower" when the pair was held only to not being slower,
    in the terminal table, summary.md and results.json alike; a file written before the rule was stored reads
    the same from its verdicts."""
    s = settings(pytester, "--apc-set=low_concurrency=1")
    pairs = []
    for c, ttft_on in ((1, 40.0), (8, 110.0)):
        off = record(s, "E", c, off_delta(s, "E"), 100.0)
        on = record(s, "F", c, delta(int(off.bench["total_input_tokens"]), off.prediction.expected_hits), ttft_on)
        pairs.append((off, on))
    judged = [_judged(verdicts.rag_effect(verdicts.Pair(off, on, s)), f"test_rag[{on.key.id}]") for off, on in pairs]
    apc = _session(s, [run for pair in pairs for run in pair])
    data = _data(apc, judged)
    assert [(row.timing, row.verdict) for row in data.pairs] == [("faster", "PASS"), ("not slower", "PASS")]
    table = terminal.table(data.pair_numbers())
    assert [_cells(table, f"E/F     {c}")["verdict"] for c in (1, 8)] == ["PASS faster", "PASS not slower"]
    assert _cells(table, "E/F     8")["gain/bound"].startswith("0.9")  # a slowdown within the tolerance
    doc = _document(apc, data)
    assert [row["timing"] for row in doc["pairs"]] == ["faster", "not slower"]
    assert [v["held_to"] for v in doc["verdicts"]] == ["faster", "not slower"]
    summary = markdown.markdown(ReportView.from_document(doc, "results.json"))
    assert _md_cells(summary, "E/F")["verdict"] == "PASS faster"
    assert "verdict: the pair's tests; its TTFT held to faster (a significant gain) or only to not slower" in summary
    lines = [text for text, _ in terminal.summary_lines(ReportView.from_document(doc, "results.json"))]
    assert lines[lines.index(table) + 1].startswith("verdict: the pair's tests; its TTFT held to faster")

    older = json.loads(json.dumps(doc))
    for row in older["pairs"]:
        del row["timing"]
    for v in older["verdicts"]:
        del v["held_to"]
    assert terminal.table(ReportView.from_document(older, "results.json").pairs) == table
    assert markdown.markdown(ReportView.from_document(older, "results.json")) == summary


def test_a_row_reads_the_finding_of_its_failed_timing_verdict_else_the_strictest_rule() -> None:
    passed = {"passed": True, "outcome": "passed", "name": "anything", "runs": ["E-c8", "F-c8"]}
    outcomes = rows.Outcomes([
        {**passed, "held_to": "not slower"}, {**passed, "held_to": "faster"}, {**passed, "runs": ["F-c8"]},
    ])  # fmt: skip
    assert outcomes.timing({"E-c8", "F-c8"}) == "faster"
    assert outcomes.timing({"F-c8"}) is None  # the timing verdicts name a run beyond the row's
    failed = rows.Outcomes([{**passed, "held_to": "faster"}, {**passed, "held_to": "not slower", "passed": False}])
    assert failed.timing({"E-c8", "F-c8"}) == "slower"
    assert rows.Outcomes([{**passed, "held_to": "faster", "passed": False}]).timing({"E-c8", "F-c8"}) == "not faster"
    # The cell: the finding beside PASS, and beside FAIL where the timing failed; a row failed on something else
    # reads FAIL alone (its failure lines say what).
    cells = [
        rows.verdict_cell(rows.PairRow.from_json({"verdict": verdict, "timing": timing}))
        for verdict, timing in (("PASS", "not slower"), ("FAIL", "slower"), ("FAIL", "not slower"), ("-", None))
    ]
    assert cells == ["PASS not slower", "FAIL slower", "FAIL", "n/a"]


def test_a_figure_not_measured_reads_n_a_in_every_column() -> None:
    """A multi-turn pair has no E2E latency: its cell reads n/a, not ``->-``; one side missing keeps the other."""
    row = {
        "pair": "L/M", "concurrency": 8, "cache_hit_observed": True, "cached_tokens": 512,
        "expected_cached_tokens": 512, "hit_ratio": 0.5, "median_ttft_off_ms": 338.0, "median_ttft_on_ms": None,
        "ttft_speedup": None, "prefill_bound": None, "input_throughput_off": None, "input_throughput_on": None,
        "output_throughput_off": None, "output_throughput_on": None, "median_e2el_off_ms": None,
        "median_e2el_on_ms": None, "verdict": "-",
    }  # fmt: skip
    cells = _cells(terminal.table([row]), "L/M")
    assert cells["E2E ms"] == cells["in tok/s"] == cells["gain/bound"] == cells["verdict"] == "n/a"
    assert cells["TTFT ms"] == "338 -> n/a"
    assert _md_cells(markdown.markdown(ReportView.from_document({"pairs": [row]}, "x")), "L/M")["E2E ON ms"] == "n/a"


def test_no_table_of_the_committed_results_reads_as_a_comparison_or_a_dash() -> None:
    """Every results file under docs/results, as ``report -v`` prints it: two figures read ``off -> on``,
    never ``x>y``, and nothing prints ``->-`` or a bare ``-`` cell."""
    from pathlib import Path

    files = sorted(Path(__file__).parent.parent.glob("docs/results/**/results.json"))
    assert files
    for path in files:
        view = ReportView.from_document(json.loads(path.read_text()), str(path))
        text = "\n".join(text for text, _ in terminal.summary_lines(view, verbose=True))
        assert not re.search(r"\d>\d|->-|-/-", text), path
        for line in text.splitlines():
            if line.startswith(("pair ", "case ", "route ", "---")):
                continue
            assert " - " not in f" {line} ".replace("  ", " "), (path, line)


COUNTED = """
import pytest
from pytest_apc import verdicts
from pytest_apc.verdicts.verdict import NOT_SLOWER

pytestmark = pytest.mark.apc

@pytest.mark.apc_cases("C")
def test_two_verdicts(apc_run, apc_assert):
    apc_assert(verdicts.apc_really_off(apc_run))
    apc_assert(verdicts.apc_really_off(apc_run))

@pytest.mark.apc_cases("D")
def test_held_to(apc_pair, apc_assert):
    ids = [apc_pair.off.key.id, apc_pair.on.key.id]
    apc_assert(verdicts.Verdict("not_slower", ids, True, "held only to not slower", held_to=NOT_SLOWER))

@pytest.mark.apc_cases("C")
def test_fails(apc_run, apc_assert):
    apc_assert(verdicts.Verdict("apc_really_off", [apc_run.key.id], False, "made to fail"))

def test_skipped():
    pytest.skip("not this time")
"""


def test_summary_md_counts_the_tests_as_pytest_does(tmp_path, run_inner) -> None:
    """A test that records two verdicts is one test: summary.md's count is pytest's own summary line, kept in
    results.json; the pair a verdict held only to not slower says so in summary.md."""
    from tests.test_faults import fake_args

    (tmp_path / "test_counted.py").write_text(COUNTED)
    inner = run_inner(*fake_args())
    assert inner.ret == 1, inner.output
    last = inner.output.strip().splitlines()[-1]
    assert re.search(r"\b1 failed, 2 passed, 1 skipped\b", last), last
    summary = next(tmp_path.glob("apc-results/*/summary.md")).read_text()
    assert "Tests: 1 failed, 2 passed, 1 skipped." in summary.splitlines()
    assert "Verdicts" not in summary  # 3 passed, 1 failed: not what pytest counts
    doc = json.loads(next(tmp_path.glob("apc-results/*/results.json")).read_text())
    assert doc["tests"] == {"failed": 1, "passed": 2, "skipped": 1}
    assert _md_cells(summary, "C/D")["verdict"] == "FAIL"  # failed on C's own verdict, not on its timing
    assert doc["pairs"][0]["timing"] == "not slower"


def test_a_run_whose_pair_is_not_measured_yet_is_reported_not_dropped(pytester) -> None:
    """A session stopped between a pair's two runs: the run it measured has no row yet, so the summary says
    what it measured and which run it waits for, in the terminal and in summary.md alike."""
    s = settings(pytester)
    off = record(s, "C", 8, off_delta(s, "C"), 900.0)
    view = _view(_session(s, [off]), _data(_session(s, [off])))
    assert not view.pairs
    waits = "C-c8: measured on apc-off (1 repeat, 30 of 30 requests each); its pair waits for D-c8"
    lines = [text for text, _ in terminal.summary_lines(view)]
    assert [line for line in lines if line.startswith("UNPAIRED")] == [f"UNPAIRED {waits}, not measured yet " \
        "(compare reads the run alone)"]  # fmt: skip
    assert f"- UNPAIRED {waits}" in markdown.markdown(view)
    on = record(s, "D", 8, delta(off.bench["total_input_tokens"], 0), 300.0)
    both = _session(s, [off, on])
    assert _view(both, _data(both)).unpaired == []  # the pair's row shows both
