"""The baseline of a gated run (``--apc-baseline``), checked as soon as each thing it must agree with is
known, so that a run its baseline cannot judge stops before it measures, not after the whole matrix:

* at configure time, before any server starts (under ``--collect-only`` too): the file reads and is valid
  (:func:`pytest_apc.results.reader.read`), and it was measured with this run's profile, model (where the
  model is known before a server is up) and workload settings (:meth:`Baseline.at_configure`);
* after collection: it shares a run with the selected tests and has the cold repeats the rule needs of
  every one it shares (:meth:`Baseline.check_runs`);
* once a server is up: its block size, layout and the GPUs it may use, and the model a server elsewhere
  serves (:meth:`Baseline.refusal`, which the session asks after every server start).

Each refusal is the gate's own message (:mod:`pytest_apc.gate.compare`); the gate at the end of the session
applies the same rules to everything that was measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.gate import compare, noise
from pytest_apc.measure.session import ApcSession
from pytest_apc.results import document
from pytest_apc.results.reader import BadResults, Results, read
from pytest_apc.workload.cases import RunKey
from pytest_apc.workload.models import shape_model_name, tiny_model_name


class Refused(Exception):
    """A results file this run cannot use: a baseline it cannot be judged against, or an earlier session it
    cannot continue (:mod:`pytest_apc.gate.resume`); the message says which file and why, on one line."""


@dataclass(frozen=True)
class Baseline:
    """The baseline file, read and checked once, and the rule this run applies with it."""

    path: str
    results: Results
    min_repeats: int

    @classmethod
    def at_configure(cls, settings: Settings) -> Baseline:
        """``settings.baseline`` read, checked (:class:`Refused` otherwise) and comparable with what this run
        will measure, as far as that is known before a server starts (before the selected runs are fitted to
        the model's context: a baseline whose lengths were fitted is held to the scale it was asked for, and
        the gate compares the scales measured)."""
        results = read_baseline(settings.baseline)
        model = planned_model(settings)
        here: dict[str, Any] = {"profile": settings.profile, "model": model or "", "settings": settings.as_dict(),
                                "servers": []}  # fmt: skip
        there = results.data
        if there.get("fit"):  # its lengths were fitted to its model's context: compare the scale it was asked for
            asked = there["fit"]["requested_length_scale"]
            there = {**there, "settings": {**there["settings"], "length_scale": asked}}
        found = [d for d in compare.differences(here, there) if model or d["what"] != "model"]
        if found:
            raise Refused(compare.not_comparable(settings.baseline, found))
        calibration = compare.calibration_of(results)
        unusable = calibration.unusable() if calibration is not None else None
        if unusable:
            raise Refused(compare.unusable_calibration(settings.baseline, unusable))
        return cls(settings.baseline, results, settings.baseline_repeats)

    def check_runs(self, keys: Iterable[RunKey]) -> None:
        """The selected runs (``keys``): :class:`Refused` when the baseline has none of the ones the gate
        judges, or too few cold repeats of one it has. Nothing to check when none is gated (the baseline is
        then an unused setting, which the plugin warns of)."""
        gated = sorted({key.id for key in keys if not key.route and key.family not in ("offload", "multiturn")})
        if not gated:
            return
        there = noise.gated_runs(self.results)
        shared = [run_id for run_id in gated if run_id in there]
        if not shared:
            raise Refused(compare.no_shared_run(self.path, gated, there))
        few: dict[int | None, list[str]] = {}  # run ids by their repeats (None: no per-repeat TTFT)
        for run_id in shared:
            values = noise.repeat_values(there[run_id])
            if values is None or len(values) < self.min_repeats:
                few.setdefault(None if values is None else len(values), []).append(run_id)
        if few:
            raise Refused("; ".join(
                compare.too_few_repeats(self.path, ", ".join(ids), repeats, self.min_repeats)
                for repeats, ids in few.items()
            ))  # fmt: skip

    def refusal(self, session: ApcSession) -> str | None:
        """Why no more runs may be measured, asked once a server is up: the baseline is not comparable with
        what this session measured so far (its servers' block sizes and layouts, the GPUs, the model)."""
        here: dict[str, Any] = document.of_session(session)
        found = compare.differences(here, self.results.data)
        return compare.not_comparable(self.path, found) if found else None


def read_baseline(path: str) -> Results:
    """The baseline file read and validated; :class:`Refused` when it cannot be read or is no results file."""
    try:
        return read(Path(path), "baseline")
    except BadResults as err:
        raise Refused(str(err)) from None


def planned_model(settings: Settings) -> str | None:
    """The name of the model the servers will load (what the gate compares: the last path component), as
    the session will choose it; None for servers run elsewhere, whose model is known once one answers."""
    if settings.model_shape:
        return shape_model_name(settings.model_shape)
    if settings.profile == "cpu" and not settings.model:
        return tiny_model_name()
    return settings.model or None
