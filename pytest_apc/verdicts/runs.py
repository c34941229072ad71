"""The verdicts on one run's cache counters: an APC-off server looks nothing up (``apc_really_off``), and an
APC-on one hits what the workload predicts (``cached_tokens_match``), in every repeat."""

from __future__ import annotations

from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts import figures
from pytest_apc.verdicts.diagnoses import window_text
from pytest_apc.verdicts.verdict import Repeats, Verdict


def apc_really_off(run: RunRecord) -> Verdict:
    """An APC-off server looks nothing up and hits nothing, while it still counts the prompt tokens."""
    found = Repeats()
    for repeat, d in run.require_counters():
        tokens = int(repeat.bench["total_input_tokens"])
        computed = d.prefill_computed
        good = d.prefix_cache_queries == 0 and d.prefix_cache_hits == 0 and computed == tokens
        line = (
            f"{run.key.id} (APC off): prefix-cache queries {d.prefix_cache_queries}, hits {d.prefix_cache_hits} "
            f"(both must be 0); prompt tokens computed {computed} (must equal the benchmark's {tokens})"
        )
        if not good and (d.prefix_cache_queries or d.prefix_cache_hits):
            line += "\ndiagnosis: the OFF server looked up the prefix cache, so it is not really off"
        elif not good:
            line += "\ndiagnosis: the server did not count every prompt token (requests lost or still running)"
        numbers = {"queries": d.prefix_cache_queries, "hits": d.prefix_cache_hits, "computed_tokens": computed}
        found.add(line, numbers, failed=not good)
    return found.verdict("apc_really_off", [run.key.id])


def cached_tokens_match(run: RunRecord) -> Verdict:
    """Hits equal the prediction (N-1)*floor(S/B)*B within one block per request; the books balance."""
    p = figures.prediction_of(run)  # raises the "cannot predict" failure
    found = Repeats()
    for h in figures.judged_hits(run):
        line = (
            f"{run.key.id}: cached tokens {h.hits:,} of {h.queries:,} queried (hit ratio {h.hit_ratio:.1%}); "
            f"predicted {p.expected_hits:,} = ({run.workload.num_prompts}-1) x floor({p.shared_prefix_tokens}/"
            f"{p.block_size}) x {p.block_size} (shared prefix S = {run.header_tokens} template + "
            f"{run.workload.prefix_len} prefix tokens) {window_text(p)}"
        )
        numbers = {
            "hits": h.hits,
            "queries": h.queries,
            "expected_hits": p.expected_hits,
            "tolerance": p.tolerance,
            "tolerance_above": p.tolerance_above,
            "computed_tokens": h.delta.computed_tokens,
            "cached_tokens": h.delta.cached_tokens,
        }
        found.add(line, numbers, h.problems, [h.note] if h.note else [])
    return found.verdict("cached_tokens_match", [run.key.id])
