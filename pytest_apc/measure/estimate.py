"""How long a run not measured yet could take, from the runs measured so far (a resumed session's included):
what ``--apc-set stop_after`` decides on, and the time left on the progress line."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_apc.config import Settings
from pytest_apc.measure.records import RunRecord
from pytest_apc.workload.cases import RunKey, workload_for


def run_seconds(key: RunKey, records: Iterable[RunRecord], settings: Settings) -> tuple[float, str]:
    """The estimate for run ``key`` and how it was made: the longest run measured of its case family and
    concurrency; else the longest at its concurrency (else of any), scaled by the prompt tokens the two runs
    send (prefill grows at least as fast: a case of twice the prompt takes about twice as long); 0 before any
    run is measured."""
    records = list(records)
    alike = [r.wall_s for r in records if (r.key.family, r.key.concurrency) == (key.family, key.concurrency)]
    if alike:
        return max(alike), "the longest like it so far"
    if not records:
        return 0.0, "none measured yet"
    same = [r for r in records if r.key.concurrency == key.concurrency]
    planned = workload_for(key.family, settings)

    def scaled(record: RunRecord) -> float:
        if "multiturn" in (key.family, record.key.family):  # turns, not one prompt each: not comparable
            return record.wall_s
        tokens = record.workload.prompt_len * record.workload.num_prompts
        return record.wall_s * planned.prompt_len * planned.num_prompts / max(tokens, 1)

    longest = max(same or records, key=scaled)
    where = "at its concurrency " if same else ""
    return scaled(longest), f"the longest {where}so far, {longest.key.id}, scaled to this run's prompt tokens"
