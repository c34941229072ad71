"""PNG plots next to the results file: median TTFT per pair over concurrency, cached tokens measured vs
predicted. Only when matplotlib (extra ``plot``) is installed."""

from __future__ import annotations

from pathlib import Path

from pytest_apc.report.rows import ReportData


def plots(data: ReportData, folder: Path) -> list[str]:
    """The plots written into ``folder`` (none without matplotlib or pair rows)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    rows = data.pair_numbers()
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
    path = folder / "ttft.png"
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
    path = folder / "cached_tokens.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(str(path))
    return written
