"""The docs cannot drift: the configuration reference is generated from the settings table, and every
option pytest knows appears in it (and nothing else does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_apc import reference

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def test_configuration_reference_is_generated_from_the_code() -> None:
    assert (DOCS / "configuration.md").read_text() == reference.render(), (
        "docs/configuration.md is stale: run `python -m pytest_apc.reference > docs/configuration.md`"
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


def test_fail_fast_table_matches_its_results_file() -> None:
    """The timings on the troubleshooting page are the ones the benchmark script wrote, rendered by it."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("failfast_timing", REPO / "scripts" / "failfast_timing.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
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
    rows = {(p["pair"], p["concurrency"]): p for p in data["pairs"] if p["hash_algo"] is None}
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
    (ab,) = [p for p in data["pairs"] if p["pair"] == "A/B" and p["hash_algo"] is None]
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
    # "consistent_hash had the lowest median TTFT with the narrowest interval"
    assert min(rows.values(), key=lambda r: r["median_ttft_ms"]) is pinned
    assert min(rows.values(), key=lambda r: r["median_ttft_high_ms"] - r["median_ttft_low_ms"]) is pinned
