"""The verdict on a --apc-hash-algos server: a hash algorithm changes how blocks are named, not which, so
its runs hit what the default algorithm's did, as fast (``same_as_default``)."""

from __future__ import annotations

from pytest_apc.config import Settings
from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts import figures
from pytest_apc.verdicts.timing import slower_problems
from pytest_apc.verdicts.verdict import Verdict


def same_as_default(run: RunRecord, default: RunRecord, settings: Settings) -> Verdict:
    """A hash algorithm changes how blocks are named, not which: identical hits in every repeat, timing within
    tolerance."""
    run.require_counters(), default.require_counters()  # a "cannot verify" failure where counters are missing
    hits, base = figures.hash_hits(run, default)
    problems = []
    if hits != base:
        problems.append(f"cached tokens {hits:,} differ from the default's {base:,}")
    slowdown = figures.ttft_ratio(run, default, settings)
    throughput = run.duration_s / default.duration_s if default.duration_s else float("inf")
    problems += slower_problems(
        slowdown.low, throughput, settings.overhead_tolerance, "than the default", "than with the default"
    )
    algo = run.key.hash_algo
    message = (
        f"{run.key.id} vs {default.key.id} ({algo} vs {default.server.prefix_caching_hash_algo}): cached tokens "
        f"{hits:,} vs {base:,}; median TTFT {run.median_ms():,.1f} vs {default.median_ms():,.1f} ms "
        f"(ratio {slowdown}); duration {run.duration_s:.2f} vs {default.duration_s:.2f} s"
    )
    message += "".join(f"\n- {p}" for p in problems)
    return Verdict(
        "same_as_default",
        [default.key.id, run.key.id],
        not problems,
        message,
        {
            "hits": hits,
            "default_hits": base,
            "ttft_ratio": slowdown.estimate,
            "ttft_ratio_low": slowdown.low,
            "duration_ratio": throughput,
        },
    )
