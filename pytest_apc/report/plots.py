"""PNG plots next to the results file: median TTFT per pair over concurrency, cached tokens measured vs
predicted, for fleet runs the median TTFT and cold prefills per route, and for the offload case the prompt
tokens each tier served, and for the multi-turn case the median TTFT by turn index, ON vs OFF. Only when
matplotlib (extra ``plot``) is installed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_apc.results.rows import FleetRow, PairRow, ReportData, TierRow, several_levels


def plots(data: ReportData, folder: Path) -> list[str]:
    """The plots written into ``folder`` (none without matplotlib, or without pair and fleet rows)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if data.pairs:
        written += _pair_plots(plt, data.pairs, folder)
    if data.fleet:
        written.append(_fleet_plot(plt, data.fleet, folder))
    if data.offload:
        written.append(_tier_plot(plt, data.offload, folder))
    turns = [r for r in data.pairs if len(r.runs) == 2 and all(run.turns for run in r.runs)]
    if turns:
        written.append(_turn_plot(plt, turns, folder))
    return written


def _turn_plot(plt: Any, rows: Sequence[PairRow], folder: Path) -> str:
    """multiturn.png: the multi-turn pairs' median TTFT by turn index (every repeat pooled), OFF and ON."""
    from pytest_apc.verdicts.multiturn import ttft_by_turn

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        off, on = row.runs
        for run, style, what in ((off, "o--", "OFF"), (on, "o-", "ON")):
            by_turn = ttft_by_turn(run)
            ax.plot(list(by_turn), list(by_turn.values()), style, label=f"{row.pair} c{row.concurrency} {what}")
    ax.set(xlabel="turn", ylabel="median TTFT (ms)", title="Multi-turn: median TTFT by turn, APC off vs on")
    ax.legend(fontsize=8)
    return _save(plt, fig, folder / "multiturn.png")


def _pair_plots(plt: Any, rows: Sequence[PairRow], folder: Path) -> list[str]:
    written = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pair in sorted({r.pair for r in rows}):
        sub = sorted((r for r in rows if r.pair == pair), key=lambda r: r.concurrency)
        x = [r.concurrency for r in sub]
        ax.plot(x, [r.median_ttft_off_ms for r in sub], "o--", label=f"{pair} OFF")
        ax.plot(x, [r.median_ttft_on_ms for r in sub], "o-", label=f"{pair} ON")
    levels = sorted({r.concurrency for r in rows})
    ax.set(xscale="log", xlabel="max concurrency", ylabel="median TTFT (ms)", title="Median TTFT, APC ON vs OFF")
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    written.append(_save(plt, fig, folder / "ttft.png"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"{r.pair} c{r.concurrency}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.expected_cached_tokens or 0 for r in rows], 0.4, label="predicted")
    ax.bar([x + 0.2 for x in xs], [r.cached_tokens or 0 for r in rows], 0.4, label="measured")
    ax.set_xticks(list(xs), labels, rotation=60, fontsize=7)
    ax.set(ylabel="cached tokens", title="Cached tokens: measured vs predicted")
    ax.legend()
    written.append(_save(plt, fig, folder / "cached_tokens.png"))
    return written


def _save(plt: Any, fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _value(value: float | None) -> float:
    """A row's number, NaN where it is null (matplotlib draws nothing there)."""
    return float("nan") if value is None else float(value)


def _gap(high: float, low: float) -> float:
    gap = high - low
    return 0.0 if math.isnan(gap) else gap


def _fleet_plot(plt: Any, rows: Sequence[FleetRow], folder: Path) -> str:
    """fleet.png: median TTFT per route with its bootstrap interval, and cold prefills against the ideal (one
    per prefix group). A run whose cold prefills could not be told has no bar."""
    several = several_levels(rows)
    labels = [f"{r.route} c{r.concurrency}" if several else str(r.route) for r in rows]
    xs = list(range(len(rows)))
    fig, (ttft, cold) = plt.subplots(1, 2, figsize=(10, 4.5))
    medians = [_value(r.median_ttft_ms) for r in rows]
    # Error bars: the distance to each end of the interval (none where the run has no per-request samples).
    below = [_gap(m, _value(r.median_ttft_low_ms)) for m, r in zip(medians, rows, strict=True)]
    above = [_gap(_value(r.median_ttft_high_ms), m) for m, r in zip(medians, rows, strict=True)]
    ttft.bar(xs, medians, 0.6, yerr=[below, above], capsize=4)
    ttft.set_xticks(xs, labels, rotation=30, fontsize=8)
    ttft.set(ylabel="median TTFT (ms)", title="Median TTFT per route (bootstrap CI)")
    cold.bar([x - 0.2 for x in xs], [_value(r.ideal_cold_prefills) for r in rows], 0.4, label="ideal (one per group)")
    cold.bar([x + 0.2 for x in xs], [_value(r.cold_prefills) for r in rows], 0.4, label="measured")
    cold.set_xticks(xs, labels, rotation=30, fontsize=8)
    cold.yaxis.get_major_locator().set_params(integer=True)
    cold.set(ylabel="cold prefills", title="Cold prefills per route vs ideal")
    cold.legend(fontsize=8)
    return _save(plt, fig, folder / "fleet.png")


def _tier_plot(plt: Any, rows: Sequence[TierRow], folder: Path) -> str:
    """offload.png: each offload run's prompt tokens, stacked by where they came from (GPU cache, CPU tier,
    computed), with the prediction across tiers as a line."""
    labels = [f"{r.case} c{r.concurrency}" + (" (tier)" if r.case == "O" else "") for r in rows]
    xs = list(range(len(rows)))
    gpu = [_value(r.gpu_cache_hits) for r in rows]
    tier = [_value(r.tier_hits) for r in rows]
    computed = [_value(r.computed_tokens) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.bar(xs, gpu, 0.6, label="GPU cache hits")
    ax.bar(xs, tier, 0.6, bottom=gpu, label="CPU tier hits")
    ax.bar(xs, computed, 0.6, bottom=[a + b for a, b in zip(gpu, tier, strict=True)], label="computed")
    for x, r in zip(xs, rows, strict=True):
        ax.hlines(_value(r.expected_hits), x - 0.35, x + 0.35, colors="black", linestyles="dashed")
    ax.plot([], [], "k--", label="predicted hits, all tiers")
    ax.set_xticks(xs, labels, fontsize=8)
    tallest = max((a + b + c for a, b, c in zip(gpu, tier, computed, strict=True) if not math.isnan(a + b + c)),
                  default=1.0)  # fmt: skip
    ax.set_ylim(0, tallest * 1.35)  # room for the legend above the bars
    ax.set(ylabel="prompt tokens", title="Prompt tokens by source: GPU cache, CPU tier, computed")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    return _save(plt, fig, folder / "offload.png")
