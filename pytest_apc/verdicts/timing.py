"""The verdicts on an OFF/ON pair: the prefill APC saved (``prefill_saved``), a significant TTFT gain
(``ttft_gain``), not slower beyond the tolerance (``not_slower``), and which of the two a pair is held to
(``pure_effect``, ``rag_effect``)."""

from __future__ import annotations

from typing import Any

from pytest_apc.config import gain_required
from pytest_apc.verdicts import figures
from pytest_apc.verdicts.diagnoses import diagnose_short_hits
from pytest_apc.verdicts.pairs import Pair
from pytest_apc.verdicts.verdict import FASTER, NOT_SLOWER, Verdict


def prefill_saved(pair: Pair) -> Verdict:
    """The prefill the ON server computed is what the prediction leaves, so APC saved what it should."""
    p = figures.prediction_of(pair.on)  # raises the "cannot predict" failure
    (_, off), (_, on) = pair.off.require_counters()[0], pair.on.require_counters()[0]
    computed_off, computed_on = off.prefill_computed, on.prefill_computed
    ok = computed_off is not None and computed_on is not None and computed_on <= p.computed_tokens_on + p.tolerance
    ratio = (computed_off / computed_on) if computed_off and computed_on else None
    message = (
        f"{pair.id}: prefill computed OFF {_tokens(computed_off)} tokens, ON {_tokens(computed_on)} tokens: "
        f"{ratio or 0:.2f}x less work (bound from the workload {p.prefill_bound:.2f}x, "
        f"predicted ON {p.computed_tokens_on:,}, at most {p.tolerance:,} more)"
    )
    if not ok:
        message += "\ndiagnosis: " + diagnose_short_hits(pair.on, on)
    return Verdict(
        "prefill_saved",
        [pair.off.key.id, pair.on.key.id],
        ok,
        message,
        {"computed_off": computed_off, "computed_on": computed_on, "ratio": ratio, "bound": p.prefill_bound},
    )


def _tokens(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def slower_problems(ttft_slowdown_low: float, duration_ratio: float, tol: float, slower: str, longer: str) -> list[str]:
    """Slower beyond tolerance: the low end of the median-TTFT slowdown interval, or the duration ratio."""
    problems = []
    if ttft_slowdown_low > 1 + tol:
        problems.append(f"median TTFT is slower {slower} by at least {ttft_slowdown_low - 1:.0%} (tolerance {tol:.0%})")
    if duration_ratio > 1 + tol:
        problems.append(f"the run took {duration_ratio - 1:.0%} longer {longer} (tolerance {tol:.0%})")
    return problems


def _timing_numbers(pair: Pair) -> dict[str, Any]:
    speedup = pair.ttft_speedup()
    return {
        "median_ttft_off_ms": pair.off.median_ms(), "median_ttft_on_ms": pair.on.median_ms(),
        "ttft_speedup": speedup.estimate, "ttft_speedup_low": speedup.low, "ttft_speedup_high": speedup.high,
        "confidence": speedup.confidence,
        "prefill_bound": pair.on.prediction.prefill_bound if pair.on.prediction else None,
        "modelled_ttft_bound": pair.modelled_ttft_bound(),
        "duration_off_s": pair.off.duration_s, "duration_on_s": pair.on.duration_s,
        "duration_speedup": pair.off.duration_s / pair.on.duration_s if pair.on.duration_s else None,
    }  # fmt: skip


def _bounds_text(n: dict[str, Any]) -> str:
    text = f"prefill-token bound {n['prefill_bound']:.2f}x" if n["prefill_bound"] else "no prefill bound"
    if n["modelled_ttft_bound"]:
        text += f", modelled TTFT bound {n['modelled_ttft_bound']:.2f}x (cost model fitted on the OFF runs at c1)"
    return text


def diagnose_no_gain(pair: Pair) -> str:
    """Why an ON run is not faster: first whether the cache hit at all, then what else eats the gain."""
    p = pair.on.prediction
    hits = pair.on.delta.prefix_cache_hits if pair.on.delta else None
    if p is not None and p.shared_blocks == 0:
        return diagnose_short_hits(pair.on, pair.on.delta)
    if p is not None and hits is not None and hits < p.expected_hits - p.tolerance:
        return f"too few cache hits ({hits:,} of {p.expected_hits:,} predicted): " + diagnose_short_hits(
            pair.on, pair.on.delta
        )
    return (
        f"the cache hit as predicted ({hits if hits is not None else '?'} tokens), so the prefill it saves is a "
        "small share of TTFT here: queueing at this concurrency, a decode-bound or tiny workload, APC overhead, or "
        "hits that cost as much time as computing their tokens (a slow copy of the cached blocks)"
    )


def ttft_gain(pair: Pair) -> Verdict:
    """Median TTFT improves significantly: the bootstrap interval of OFF/ON lies above 1."""
    n = _timing_numbers(pair)
    low = n["ttft_speedup_low"]
    ok = low > 1.0
    message = (
        f"{pair.id} at concurrency {pair.on.key.concurrency}: median TTFT {n['median_ttft_off_ms']:,.1f} -> "
        f"{n['median_ttft_on_ms']:,.1f} ms, gain {n['ttft_speedup']:.2f}x [{low:.2f}, {n['ttft_speedup_high']:.2f}] "
        f"({n['confidence']:.0%} CI) next to its {_bounds_text(n)}; duration {n['duration_off_s']:.2f} -> "
        f"{n['duration_on_s']:.2f} s"
    )
    fraction = pair.settings.min_bound_fraction
    bound = n["modelled_ttft_bound"] or n["prefill_bound"]
    if ok and fraction and bound:
        target = 1 + fraction * (bound - 1)
        if n["ttft_speedup"] < target:
            ok = False
            message += (
                f"\n- gain {n['ttft_speedup']:.2f}x is below {fraction:.0%} of the way to the bound ({target:.2f}x)"
            )
    if not ok and low <= 1.0:
        message += "\n- the gain is not significant: its interval reaches 1.0 (no improvement)"
    if not ok:
        message += "\ndiagnosis: " + diagnose_no_gain(pair)
    return Verdict("ttft_gain", [pair.off.key.id, pair.on.key.id], ok, message, n, held_to=FASTER)


def not_slower(pair: Pair) -> Verdict:
    """APC on is not slower than off beyond --apc-set overhead_tolerance (median TTFT interval and duration)."""
    n = _timing_numbers(pair)
    tol = pair.settings.overhead_tolerance
    # ON/OFF slowdown interval = 1/speedup; significantly slower when its low end is above 1 + tol.
    slowdown_low = 1 / n["ttft_speedup_high"] if n["ttft_speedup_high"] else float("inf")
    duration_ratio = n["duration_on_s"] / n["duration_off_s"] if n["duration_off_s"] else float("inf")
    problems = slower_problems(slowdown_low, duration_ratio, tol, "with APC", "with APC")
    message = (
        f"{pair.id} at concurrency {pair.on.key.concurrency}: median TTFT {n['median_ttft_off_ms']:,.1f} -> "
        f"{n['median_ttft_on_ms']:,.1f} ms (gain {n['ttft_speedup']:.2f}x [{n['ttft_speedup_low']:.2f}, "
        f"{n['ttft_speedup_high']:.2f}]); duration {n['duration_off_s']:.2f} -> {n['duration_on_s']:.2f} s; "
        f"{_bounds_text(n)}; tolerance {tol:.0%}"
    )
    if problems:
        message += "\n" + "\n".join(f"- {p}" for p in problems)
        message += "\ndiagnosis: APC overhead (hashing, lookups, block management) costs more than it saves here"
    return Verdict("not_slower", [pair.off.key.id, pair.on.key.id], not problems, message, n, held_to=NOT_SLOWER)


def pure_effect(pair: Pair) -> Verdict:
    """C/D: a significant TTFT gain up to pure_gain_concurrency (0: at no level; all, the default: every
    level); above it, not slower."""
    if gain_required(pair.settings.pure_gain_concurrency, pair.on.key.concurrency):
        return ttft_gain(pair)
    return not_slower(pair)


def rag_effect(pair: Pair) -> Verdict:
    """E/F: a significant TTFT gain up to low_concurrency (0: at no level; all: every level); above it,
    queueing dominates TTFT, so not slower."""
    if gain_required(pair.settings.low_concurrency, pair.on.key.concurrency):
        return ttft_gain(pair)
    return not_slower(pair)
