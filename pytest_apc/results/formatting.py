"""How numbers and messages read in every output (terminal tables, summary.md, the gate's messages): one
place, so that a figure reads the same wherever it appears."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MISSING = "n/a"  # a figure that was not measured, or a row nothing judged, in every table and message
ARROW = " -> "  # a figure before and after: APC off -> on, baseline -> now, default -> algorithm


def num(value: Any, spec: str | None = None) -> str:
    """One number for a table cell or a message: counts with thousands separators, other quantities whole
    from 100 up and to three significant digits below; ``spec`` where a column needs its own."""
    if value is None:
        return MISSING
    if spec is not None:
        return format(value, spec)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or abs(value) >= 100 or value == 0:  # a zero limit reads "0", not "0.00"
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def compact(value: float | None) -> str:
    """Compact throughput: 78.2k, 1.3M."""
    if value is None:
        return MISSING
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def first_line(text: Any) -> str:
    """The first line of a message ("" for none)."""
    return (str(text or "").splitlines() or [""])[0]


def percent(ratio: float | None) -> str:
    """A ratio as a signed change: 1.064 -> +6.4%."""
    return MISSING if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def two(left: Any, right: Any, sep: str = ARROW, fmt: Callable[[Any], str] = num) -> str:
    """Two figures of one cell: ``316 -> 286`` (before and after), ``59,392/59,392`` (``sep`` "/": found of
    expected); n/a alone when neither was measured."""
    return MISSING if left is None and right is None else f"{fmt(left)}{sep}{fmt(right)}"
