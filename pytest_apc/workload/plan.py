"""The run plan: how a test marked ``apc_cases`` is parametrized, which runs the selected tests need
(grouped by the server mode they run on), which given settings no selected test uses, and which settings
the workload cannot be run with (``check_settings``; whether the selected runs fit the model is ``fit``'s).

The plugin parametrizes each marked test with :func:`parametrization` and adds every run a selected test
uses at collection (after ``-m`` / ``-k``), so the session can measure all runs of a mode on one
deployment, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_apc.config import DATA_PARALLEL, SPEC_BY_NAME, SPECS, Settings, gain_required, setting_error
from pytest_apc.redaction import redact
from pytest_apc.workload.cases import (
    CASE_APC,
    CASE_FAMILY,
    COMPACT,
    FAMILY_LENGTHS,
    PAIRS,
    TIER_VARIANTS,
    RunKey,
    ServerMode,
    Workload,
)
from pytest_apc.workload.models import SHAPES


def check_settings(settings: Settings) -> None:
    """Raise ``config.SettingError`` for a setting the workload cannot be run with: a model shape that is not
    one of ``models.SHAPES``. The plugin calls it right after ``config.resolve`` (which knows nothing of the
    workload); the lengths are checked against the model's context once the selected runs are known
    (``fit.check``, at collection)."""
    if settings.model_shape and settings.model_shape not in SHAPES:
        raise setting_error(settings, "model_shape", f"must be one of {', '.join(SHAPES)}")


@dataclass
class Plan:
    keys: set[RunKey] = field(default_factory=set)

    def add(self, keys: Iterable[RunKey]) -> None:
        self.keys.update(keys)

    def runs_on(self, mode: ServerMode) -> list[RunKey]:
        """The planned runs of ``mode``, in measuring order (case, then concurrency)."""
        return sorted(k for k in self.keys if k.mode == mode)

    def modes(self) -> list[ServerMode]:
        return sorted({k.mode for k in self.keys})


@dataclass(frozen=True)
class PlannedRun:
    """A planned run and the workload it sends, built once from the settings when its server mode is
    measured (``session.ApcSession``) and carried from there to the deployment and the measurement."""

    key: RunKey
    workload: Workload


# What no selected test does when a setting that only one family reads (``setting(..., family=...)``) is
# unused.
FAMILY_ONLY = {
    "fleet": "no selected test measures a fleet (case R, -m fleet)",
    "offload": "no selected test measures the offload tier (cases N/O, -m offload)",
    "multiturn": "no selected test measures multi-turn conversations (cases M/L, -m multiturn)",
}
# The baseline gate's settings: the baseline first, then what only matters with one.
BASELINE_SETTINGS = ("baseline", "baseline_false_alarm", "baseline_repeats")


@dataclass(frozen=True)
class TestUse:
    """What one collected test would measure: its runs, whether it is a sweep test, and its markers."""

    keys: tuple[RunKey, ...]
    sweep: bool = False
    markers: frozenset[str] = frozenset()


def is_explicit(source: str | None) -> bool:
    """Whether a setting was given by someone (option, environment, ini), not taken from a default."""
    return source is not None and source != "default" and not source.endswith(("profile default",))


def _levels(pair: str, keys: Sequence[RunKey]) -> str:
    levels = sorted({k.concurrency for k in keys})
    return f"{pair} planned at concurrency {', '.join(map(str, levels))}" if levels else f"no {pair} planned"


def _length_readers() -> dict[str, tuple[str, ...]]:
    """Each length setting (in declaration order) and the families whose workload reads it."""
    readers = {
        name: tuple(family for family, lengths in FAMILY_LENGTHS.items() if name in lengths)
        for lengths in FAMILY_LENGTHS.values()
        for name in lengths
        if name
    }
    return {spec.name: readers[spec.name] for spec in SPECS if spec.name in readers}


def _cases_in_words(families: Sequence[str]) -> str:
    """The cases of ``families`` as a list in words; an APC-off case and its APC-on partner as one, "C/D"."""
    words: list[str] = []
    for case, family in CASE_FAMILY.items():
        off = PAIRS.get(case, "")
        if family not in families:
            continue
        if off in words and not CASE_APC[off]:  # the APC-on case of a pair: beside its APC-off case
            words[words.index(off)] = f"{off}/{case}"
        else:
            words.append(case)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _checks(settings: Settings, planned: Sequence[TestUse]) -> list[tuple[str, Callable[[TestUse], bool], str]]:
    """(setting, which tests use it, what no selected test does) for every setting a selection can leave
    unused; ``planned`` gives the details of the level checks."""
    planned_keys = [k for use in planned for k in use.keys if not k.hash_algo]
    low, pure_gain = settings.low_concurrency, settings.pure_gain_concurrency
    rag_levels = _levels("E/F", [k for k in planned_keys if k.case in "EF"])
    pure_levels = _levels("C/D", [k for k in planned_keys if k.case in "CD"])

    def family(*names: str) -> Callable[[TestUse], bool]:  # a routed run (case R, M behind the router) is a fleet's
        return lambda use: any(
            CASE_FAMILY[k.case] in names or ("fleet" in names and k.route) for k in use.keys if not k.hash_algo
        )

    def single_server(use: TestUse) -> bool:  # what the gate judges: the six cases' runs
        return any(not k.route and k.family not in ("offload", "multiturn") for k in use.keys)

    return [
        ("hash_algos", lambda use: any(k.hash_algo for k in use.keys), "no selected test compares hash algorithms"),
        ("sweep_concurrency", lambda use: use.sweep, "no selected test runs the concurrency sweep"),
        ("sweep_cases", lambda use: use.sweep, "no selected test runs the concurrency sweep"),
        *((name, single_server, "no selected test measures a single-server run, so the gate has no run to compare")
          for name in BASELINE_SETTINGS),
        ("low_concurrency", lambda use: any(k.case == "F" and (not low or gain_required(low, k.concurrency))
                                            and not k.hash_algo
                                            for k in use.keys),
         f"no selected test judges the E/F pair at concurrency {low} or below; {rag_levels}"),
        ("pure_gain_concurrency", lambda use: any(k.case == "D" and not k.hash_algo
                                                  and (not pure_gain or gain_required(pure_gain, k.concurrency))
                                                  for k in use.keys),
         f"no selected test judges the C/D pair at concurrency {pure_gain} or below; {pure_levels}"),
        *((name, family(*readers), f"no selected test runs {_cases_in_words(readers)}, the "
                                   f"{'only ' if len(readers) == 1 else ''}cases with this length")
          for name, readers in _length_readers().items()),
        *((spec.name, family(spec.family), FAMILY_ONLY[spec.family])
          for fam in FAMILY_ONLY for spec in SPECS if spec.family == fam),
        ("url_on", lambda use: any(k.apc and not k.route for k in use.keys),
         "no selected test measures on an APC-on server"),
        ("url_off", lambda use: any(not k.apc for k in use.keys), "no selected test measures on the APC-off server"),
    ]  # fmt: skip


def _value_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def unused_settings(
    settings: Settings,
    planned: Sequence[TestUse],
    deselected: Sequence[TestUse],
    skipped: Sequence[TestUse],
    deselected_by: str,
    family_markers: Iterable[str],
) -> list[str]:
    """One message per setting given explicitly that no planned test uses, saying why: the tests that
    would use it were deselected (``deselected_by``, e.g. "-m 'pure'") or skipped, or none was collected.
    The gate's own settings without ``baseline`` are unused too."""
    messages = []
    families = set(family_markers)
    for name, uses, what in _checks(settings, planned):
        source = settings.sources.get(name)
        if not is_explicit(source):
            continue
        value = getattr(settings, name)
        head = redact(f"{SPEC_BY_NAME[name].spelled(_value_text(value))} ({source})")  # a key is never printed
        if name in BASELINE_SETTINGS[1:] and not settings.baseline:
            messages.append(f"{head}: no --apc-baseline is given, so the gate does not run")
            continue
        if any(uses(use) for use in planned):
            continue
        would = [use for use in deselected if uses(use)]
        if would:
            common = sorted(frozenset.intersection(*(use.markers for use in would)) & families)
            who = f"they are marked {' and '.join(common)}" if common else f"{len(would)} tests would"
            why = f"{who}; {deselected_by} deselected them"
        elif any(uses(use) for use in skipped):
            why = "the tests that would are skipped"
        else:
            why = "no collected test would"
        what, _, detail = what.partition("; ")
        messages.append(f"{head}: {what} ({'; '.join(part for part in (detail, why) if part)})")
    return messages


def fleet_routes(settings: Settings) -> tuple[str, ...]:
    """The routes the fleet tests measure: the external fleet when one is given (its --apc-set route_label), else
    every router policy, and vLLM's data-parallel balancer when --apc-set data_parallel_size is set."""
    if settings.fleet_url:
        return (settings.route_label,)
    return settings.router_policies + ((DATA_PARALLEL,) if settings.data_parallel_size else ())


# The keyword arguments of @pytest.mark.apc_cases(cases, ...), each a flag.
APC_CASES_OPTIONS = ("sweep", "hash_algos", "sequential", "fleet", "compact", "tiers")
# Why the offload cases skip on --cpu-node.
NO_CPU_OFFLOAD = (
    "vLLM's CPU build has no KV offload tier (its native offloading connector needs CUDA or XPU): "
    "the offload tests run on --gpu-node"
)


@dataclass(frozen=True)
class RunParam:
    """One parameter of a test marked ``apc_cases``: the run id its ``apc_run`` / ``apc_pair`` gets, the id
    in the test's name, and why this configuration makes no run for it (None: the run is measured)."""

    run_id: str
    test_id: str
    skip: str | None = None


def parametrization(cases: str, options: Mapping[str, Any], settings: Settings) -> list[RunParam]:
    """The parameters of a test marked ``apc_cases(cases, **options)`` under these settings: one per case,
    concurrency and hash algorithm (or route, for the fleet case), or one skipped parameter with a readable
    id where this configuration makes none of its runs (skipped tests are not planned, so nothing is
    measured for them). Raises ValueError for an unknown case or option."""
    unknown = [c for c in cases if c not in CASE_APC]
    if not cases or unknown:
        raise ValueError(
            f"unknown case {''.join(unknown) or '(none)'}; cases are {', '.join(CASE_APC)}, "
            "e.g. @pytest.mark.apc_cases('CD')"
        )
    odd = [name for name in options if name not in APC_CASES_OPTIONS]
    if odd:
        raise ValueError(f"unknown option {', '.join(odd)}; the options are {', '.join(APC_CASES_OPTIONS)}")

    def skipped(key: RunKey, test_id: str, reason: str) -> list[RunParam]:
        return [RunParam(key.id, test_id, reason)]

    levels = settings.sweep_concurrency if options.get("sweep") else (settings.concurrency,)
    if any(CASE_FAMILY[c] == "offload" for c in cases):
        if settings.profile == "cpu":
            return skipped(RunKey(cases[0], levels[0]), "cpu-node", NO_CPU_OFFLOAD)
        levels = settings.offload_concurrency
        if options.get("sequential"):  # a check that holds at concurrency 1 only
            if 1 not in levels:
                reason = f"concurrency 1 is not in --apc-set offload_concurrency={','.join(map(str, levels))}"
                return skipped(RunKey(cases[0], levels[0]), "no-c1", reason)
            levels = (1,)
    if any(CASE_FAMILY[c] == "multiturn" for c in cases):
        levels = settings.multiturn_concurrency
        if options.get("compact"):  # the compaction variant: at the highest level only
            keys = [RunKey(case, max(levels), variant=COMPACT) for case in cases]
            return [RunParam(key.id, key.id) for key in keys]
        if options.get("tiers"):
            # A small GPU cache without and with the CPU tier, at concurrency 1: there the GPU cache's own
            # hits are a replay of vLLM's block pool, so each tier's share is predicted exactly.
            keys = [RunKey(case, 1, variant=variant) for case in cases for variant in TIER_VARIANTS]
            return [
                RunParam(key.id, key.id, NO_CPU_OFFLOAD if key.mode.tier and settings.profile == "cpu" else None)
                for key in keys
            ]
        if options.get("fleet"):  # behind the launched router, one run per policy, at the highest level only
            policies = () if settings.fleet_url else settings.router_policies
            if not policies:
                reason = (
                    "case M behind a router needs the launched vllm-router (--apc-set router_policies, no "
                    "--apc-fleet-url)"
                )
                return skipped(RunKey(cases[0], max(levels), route="none"), "no-router", reason)
            keys = [RunKey(case, max(levels), route=policy) for case in cases for policy in policies]
            return [RunParam(key.id, key.id) for key in keys]
    if options.get("fleet"):
        routes = fleet_routes(settings)
        if not routes:
            reason = "no route to measure: --apc-set router_policies is empty and --apc-set data_parallel_size is 0"
            return skipped(RunKey(cases[0], levels[0], route="none"), "no-routes", reason)
        keys = [RunKey(case, settings.concurrency, route=route) for case in cases for route in routes]
        return [RunParam(key.id, key.id) for key in keys]
    if options.get("sweep"):
        swept = "".join(c for c in cases if c in settings.sweep_cases)
        if not swept:
            reason = f"cases {cases} are not in --apc-set sweep_cases={settings.sweep_cases}"
            return skipped(RunKey(cases[0], levels[0]), "not-swept", reason)
        cases = swept
    algos: tuple[str, ...] = ("",)
    if options.get("hash_algos"):
        # Only the listed algorithms (the default's runs are what they are compared with).
        if not settings.hash_algos:
            reason = "no --apc-hash-algos given: nothing to compare with the default"
            return skipped(RunKey(cases[0], levels[0]), "no-hash-algos", reason)
        algos = settings.hash_algos
    keys = [RunKey(case, c, algo) for case in cases for c in levels for algo in algos]
    return [RunParam(key.id, key.id) for key in keys]
