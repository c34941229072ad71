"""An earlier session's run folder continued (``--apc-resume DIR``): a pre-empted or interrupted job measures
only the runs that folder lacks, and the folder's results file becomes one document holding both sessions'
runs, which ``report``, ``compare`` and the baseline gate read like any other.

* At configure time (:meth:`Resume.at_configure`): the earlier results file reads and is valid
  (:func:`pytest_apc.results.reader.read`), and it was measured at this commit, with this pytest-apc and
  torch, this profile, model (where it is known before a server is up), GPUs and every setting that changes
  what is measured (all but :data:`MAY_CHANGE`); :class:`~pytest_apc.gate.baseline.Refused` names what differs.
* Its runs adopted (:meth:`Resume.adopt`): every run its results file holds, in full from the folder's
  store where it has it (per-request samples and answers), else as the file holds it, with the servers they
  ran on. A run that failed or did not finish is not in the file's runs, so it is measured again.
* Once a server is up (:meth:`Resume.refusal`, the session's ``refuse``, as for a baseline): each server
  this session started against the earlier session's: vLLM version, block size, layout, GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.gate import compare
from pytest_apc.gate.baseline import Refused, planned_model
from pytest_apc.measure.provenance import environment
from pytest_apc.measure.records import Measured, server_from_json
from pytest_apc.measure.session import ApcSession
from pytest_apc.results import document
from pytest_apc.results.reader import BadResults, Results, read
from pytest_apc.serving.interface import ServerInfo
from pytest_apc.workload.plan import Plan

# Settings a resumed session may change: where its files go, how long it waits, how verdicts and the gate
# judge (they are computed again over every run), which runs are selected (a run's id carries its
# concurrency, hash algorithm and route) and how servers are reached. Every other setting changes what a
# run measures, so it must be the earlier session's (the model is compared by name, as the gate does).
MAY_CHANGE = frozenset({
    "resume", "stop_after", "without_profile", "startup_timeout", "stop_timeout", "bench_timeout", "results_dir",
    "json", "markdown", "baseline", "baseline_false_alarm", "baseline_repeats", "concurrency", "sweep_concurrency",
    "sweep_cases", "hash_algos", "router_policies", "offload_concurrency", "multiturn_concurrency", "route_label",
    "confidence", "bootstrap_samples", "overhead_tolerance", "low_concurrency", "pure_gain_concurrency",
    "min_bound_fraction", "max_routing_cost", "multiturn_gain_concurrency", "fleet_promise", "kv_check",
    "api_key", "replica_api_key", "ca_bundle", "host", "connect_host", "launcher", "server_python", "url_on",
    "url_off", "fleet_url", "metrics_url", "model",
})  # fmt: skip
# Where the earlier session ran: the same code, or its runs are not this session's.
PROVENANCE = ("git_commit", "pytest_apc")


@dataclass
class Resume:
    """The earlier session's folder and results file, read and checked once, and what this session adopts."""

    folder: Path
    results: Results
    servers: dict[str, ServerInfo] = field(default_factory=dict)  # the servers the adopted runs ran on, by mode

    @classmethod
    def at_configure(cls, settings: Settings) -> Resume:
        """``settings.resume`` read and checked against what this session will measure, as far as that is known
        before a server starts; :class:`Refused` (one line) otherwise."""
        folder = Path(settings.resume)
        path = Path(settings.json) if settings.json else folder / document.FILE_NAME
        if not folder.is_dir():
            raise Refused(f"cannot resume {folder}: no such folder (the run folder of an earlier session)")
        if not path.is_file():
            raise Refused(
                f"cannot resume {folder}: it has no results file {path} (nothing was measured there, or the "
                "earlier session wrote it elsewhere: give its --apc-set json=PATH too)"
            )
        try:
            results = read(path, "results file to resume")
        except BadResults as err:
            raise Refused(str(err)) from None
        model = planned_model(settings)
        here: dict[str, Any] = {
            "profile": settings.profile,
            "model": model or "",
            "settings": document.as_written(settings),
            "servers": [],
            "environment": environment({}),
        }
        found = [d for d in _differences(here, results.data) if model or d["what"] != "model"]
        if found:
            raise Refused(_refusal(folder, found))
        written = {str(s.get("mode")): s for s in results.data.get("servers") or [] if isinstance(s, Mapping)}
        modes = {run.server.mode for run in results.runs}
        return cls(folder, results, {mode: server_from_json(s) for mode, s in written.items() if mode in modes})

    def adopt(self, session: ApcSession) -> None:
        """Start ``session`` (the controller's, or the only one) with every run the earlier results file holds,
        the servers they ran on, its launches, warnings and time, and save that in the store: what the earlier
        session's processes left there (its failed runs, the modes it finished) is replaced."""
        earlier = Measured()
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # a store cut short: the file alone
            earlier = session.store.load() or earlier
        data = self.results.data
        records = {run.key: earlier.records.get(run.key, run) for run in self.results.runs}
        self.servers = {mode: earlier.servers.get(mode, info) for mode, info in self.servers.items()}
        timing = data.get("timing") or {}
        session.measured.adopt(Measured(
            records=records, servers=dict(self.servers), launches=dict(data.get("server_launches") or {}),
            warnings=[str(w) for w in data.get("warnings") or []],
            server_seconds=float(timing.get("server_lifecycle_s") or 0.0), model=str(data.get("model") or "") or None,
        ))  # fmt: skip
        # The document's time is both sessions': it started when the earlier one did.
        session.started_at = str(data.get("started_at") or session.started_at)
        session.started_wall -= float(timing.get("suite_elapsed_s") or 0.0)
        with session.store.lock():
            session.store.save(session.measured)

    def progress_line(self, measured: Measured, plan: Plan | None = None) -> str:
        """``resumed: 12 runs from DIR, measuring 6``: what was adopted and, once the plan is known, what is left."""
        adopted = len(self.results.runs)
        line = f"resumed: {adopted} run{'s' * (adopted != 1)} from {self.folder}"
        if plan is None:
            return line
        left = [key for key in plan.keys if key not in measured.records]
        modes = sorted({key.mode.name for key in left})
        return line + f", measuring {len(left)}" + (f" (on {', '.join(modes)})" if modes else "")

    def refusal(self, session: ApcSession) -> str | None:
        """Why no more runs may be measured, asked once a server is up: a server this session started is not the
        build the earlier session's runs ran on (vLLM, block size, layout, GPUs)."""
        started = {name: info for name, info in session.measured.servers.items() if self.servers.get(name) != info}
        if not started:
            return None
        here = {**document.of_session(session), "servers": [info.__dict__ for info in started.values()],
                "environment": environment(started)}  # fmt: skip
        found = _differences(here, self.results.data)
        return _refusal(self.folder, found) if found else None


def _differences(here: Mapping[str, Any], there: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What keeps the earlier document ``there`` from being continued by this session (``here``): the gate's
    differences, the versions it only names (vLLM, torch), the commit and pytest-apc, and the settings the gate
    does not compare that change what is measured."""
    found = compare.differences(here, there) + compare.version_changes(here, there)
    here_env, there_env = here.get("environment") or {}, there.get("environment") or {}
    found += [
        {"what": name, "here": here_env.get(name), "there": there_env.get(name)}
        for name in PROVENANCE
        if here_env.get(name) and there_env.get(name) and here_env.get(name) != there_env.get(name)
    ]
    here_settings, there_settings = here.get("settings") or {}, there.get("settings") or {}
    skipped = MAY_CHANGE | set(compare.COMPARED_SETTINGS) | {"profile"}
    found += [
        {"what": name, "here": value, "there": there_settings.get(name)}
        for name, value in here_settings.items()
        if name not in skipped and value != there_settings.get(name)
    ]
    return found


def _refusal(folder: Path, found: list[dict[str, Any]]) -> str:
    """One line: the folder and what differs (``there`` is the earlier session)."""
    return f"cannot resume {folder}: {compare.difference_text(found)} (there: the session that measured it)"
