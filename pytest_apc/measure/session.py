"""The measurement session: plan -> deployments -> measurements -> records, each run exactly once.

At collection the plugin adds every run the selected tests need to the plan. The first test that asks
for a run of a server mode triggers *all* planned runs of that mode, on one fresh deployment that is
stopped afterwards. So whatever tests are selected and in whatever order: one launch per mode, never two
servers alive at once, every run measured once and shared (with xdist workers through the store).
Every finished run is written to the results file (and the store) at once, so a later crash loses nothing,
and a session that resumes this one (``--apc-resume``) starts with every run measured: it measures only the
planned runs it lacks, and starts no server for a mode whose runs are all there.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from pytest_apc.config import Settings
from pytest_apc.measure import estimate
from pytest_apc.measure.bench import BenchError, BenchRunner
from pytest_apc.measure.records import Measured, MeasurementError, RunRecord, RunSkipped
from pytest_apc.measure.run import Measurer
from pytest_apc.measure.store import RunStore
from pytest_apc.serving import metrics
from pytest_apc.serving.deployment import Deployment, deployment_for, external_context, served_model
from pytest_apc.serving.interface import ServerError, ServerInfo
from pytest_apc.serving.logwatch import tail
from pytest_apc.serving.preflight import launched_here, missing_requirement
from pytest_apc.workload.cases import OFFLOAD_TIER, RunKey, ServerMode, workload_for
from pytest_apc.workload.fit import DoesNotFit, Fitted, fit_runs
from pytest_apc.workload.offload import OffloadSizes
from pytest_apc.workload.plan import Plan, PlannedRun

# What makes one run fail without stopping the others on the same deployment.
RUN_ERRORS = (BenchError, ServerError, metrics.MetricsError, OSError, ValueError)


@dataclass
class ApcSession:
    """Owns the plan, the deployments (one at a time), the benchmark worker and the results file."""

    settings: Settings
    run_dir: Path
    json_path: Path
    progress: Callable[[str], None] = lambda message: None
    # Told as each run starts (seconds None) and ends (the seconds it took): the plugin prints a line for
    # each, with what the run measured and the time left (report.terminal.RunProgress).
    on_run: Callable[[RunKey, float | None], None] = lambda key, seconds: None
    # Called after every change worth keeping (a server started, a run measured): the plugin writes the
    # results file from it, so a later crash loses nothing.
    publish: Callable[[], None] = lambda: None
    # Asked once a server is up: why no run may be measured any more (a baseline that, now that the
    # server's block size and the GPUs are known, this run cannot be compared with, or an earlier session
    # this one resumes whose servers were another build); None to go on.
    refuse: Callable[[], str | None] = lambda: None
    is_worker: bool = False  # an xdist worker: measures and shares, the controller reports
    plan: Plan = field(default_factory=Plan)
    measured: Measured = field(default_factory=Measured)
    started_wall: float = field(default_factory=time.monotonic)  # moved back by the time of a session resumed
    began: float = field(default_factory=time.monotonic)  # this session's own start: stop_after counts from it
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _active: Deployment | None = None
    _bench: BenchRunner | None = None
    _served_model: str | None = None  # model(): what this session's servers load
    _external_fitted: bool = False  # the servers run elsewhere were asked their context

    def __post_init__(self) -> None:
        self.store = RunStore(self.run_dir)

    # -- the one entry point tests use ---------------------------------------------------------------------

    def get(self, key: RunKey) -> RunRecord:
        """The measured run for ``key`` (measuring its whole server mode first if needed).

        Under xdist the store's lock makes sure one deployment runs at a time on the node and each mode is
        measured by one worker only; the others adopt its runs.
        """
        if not self._done(key):
            self.plan.add([key])
            with self.store.lock():
                self.load_store()
                if not self._done(key):
                    if key.mode in self.measured.done_modes:
                        # Not planned at collection: measuring it now would need a second launch.
                        raise MeasurementError(
                            f"run {key.id} was not planned at collection and its {key.mode.name} server is "
                            "already stopped"
                        )
                    if not self.measured.done_modes and not self._external_fitted:
                        self._fit_external()
                    if not self._done(key):
                        self._measure_mode(key.mode)
                    self.store.save(self.measured)
        skipped = self._skipped(key)
        if skipped:
            raise RunSkipped(skipped)
        if key in self.measured.errors:
            raise MeasurementError(self.measured.errors[key])
        return self.measured.records[key]

    def _done(self, key: RunKey) -> bool:
        """Whether ``key`` was measured, failed, or is skipped (too long for the context)."""
        return key in self.measured.records or key in self.measured.errors or self._skipped(key) is not None

    def _skipped(self, key: RunKey) -> str | None:
        """Why ``key`` is not measured because it does not fit the context (None: it is measured)."""
        return self.measured.fit.skipped.get(key.id) if self.measured.fit else None

    def _fit_external(self) -> None:
        """Before the first measurement: the planned runs on servers run elsewhere against the context their
        ``/v1/models`` says, fitted as launched servers' runs are at collection (a scale for every run, on
        top of the one fitted then; or theirs skipped). A selection of which none fits is left to their
        readiness, which refuses it with the --max-model-len to restart them with."""
        self._external_fitted = True
        external = [key for key in self.plan.keys if not launched_here(key.mode, self.settings)]
        context = external_context(self.settings, sorted({key.mode for key in external}))
        try:
            fitted = fit_runs(self.settings, [k for k in external if not self._skipped(k)], context)
        except DoesNotFit:
            return  # their readiness refuses them, naming the --max-model-len to restart with as well
        if fitted is None:
            return
        before = self.measured.fit
        if before is not None:  # launched servers' runs fitted at collection: one fit for the whole session
            fitted = replace(fitted, requested=before.requested, skipped={**before.skipped, **fitted.skipped})
        self.settings = fitted.apply(self.settings)
        self.measured.fit = fitted
        self.progress(f"FITTED TO THE CONTEXT: {fitted.summary}")

    def load_store(self) -> None:
        """Adopt what any process of this run has measured (and the lengths it measured them at)."""
        stored = self.store.load()
        if stored is not None:
            self.measured.adopt(stored)
        if self.measured.fit is not None:
            self.settings = self.measured.fit.apply(self.settings)

    def apply_fit(self, fitted: Fitted) -> None:
        """Measure the planned runs as ``fitted`` says (at collection, before anything is measured): every
        workload at its length scale, without the runs it skips; said at once, and kept for the results
        file (an xdist worker's in the store, where the controller and the other workers read it)."""
        self.settings = fitted.apply(self.settings)
        self.plan.keys -= {key for key in self.plan.keys if key.id in fitted.skipped}
        self.progress(f"FITTED TO THE CONTEXT: {fitted.summary}")
        self.measured.fit = fitted
        if self.is_worker:
            with self.store.lock():
                self.load_store()
                self.measured.fit = fitted
                self.store.save(self.measured)

    # -- one mode: deployment up, every planned run, deployment down -------------------------------------

    def _measure_mode(self, mode: ServerMode) -> None:
        # Each run's workload, built once: the deployment is sized for it and the measurement sends it. A run
        # already measured (adopted from the session this one resumes) is not measured again.
        runs = [
            PlannedRun(key, workload_for(key.family, self.settings))
            for key in self.plan.runs_on(mode)
            if key not in self.measured.records and not self._skipped(key)  # skipped: too long for the context
        ]
        self.measured.done_modes.add(mode)
        self._stop_active()
        missing = missing_requirement(mode, self.settings)
        if missing:
            self._fail_runs(runs, missing)
            return
        late = self._out_of_time(runs[0].key, starting=True) if runs else None
        if late:
            self.stop_measuring(late)
            return
        deployment = self._start(mode, runs)
        if deployment is None:
            return
        try:
            refused = self.refuse()
            if refused:
                self.stop_measuring(refused)
                return
            self._probe_chat_header(deployment)
            self._check_offload_sizes(deployment.info)
            runs = self._check_kv_capacity(runs, deployment.info)
            self.publish()
            self._measure_runs(runs, deployment)
        finally:
            with self._server_time():
                self._stop_active()
            self.publish()

    def _start(self, mode: ServerMode, runs: list[PlannedRun]) -> Deployment | None:
        """A ready deployment for ``mode``, or None with every run of it failed (naming why)."""
        try:
            deployment = deployment_for(
                mode, self.settings, self.model(), self.run_dir, self.progress, runs, sorted(self.plan.keys)
            )
        except ServerError as err:
            self._fail_runs(runs, f"the {mode.name} deployment cannot be made: {err}")
            return None
        if deployment.launched:
            self.measured.launches[mode.name] = self.measured.launches.get(mode.name, 0) + 1
            self.progress(f"{mode.name}: launching ({len(runs)} runs planned)")
        else:
            self.progress(f"{mode.name}: using the external server {deployment.url}")
        self._bench_runner().prewarm()  # vLLM's import overlaps the server start-up
        with self._server_time():
            try:
                deployment.start()
            except ServerError as err:
                deployment.stop()
                self.measured.servers[mode.name] = deployment.info
                self._fail_runs(runs, f"the {mode.name} server could not start:\n{err}")
                self.publish()
                return None
        self._active = deployment
        self.measured.servers[mode.name] = info = deployment.info
        self.progress(
            f"{mode.name}: ready in {info.startup_s:.0f} s; block size {info.block_size}, "
            f"{info.kv_cache_line or 'KV cache size line not seen'}"
        )
        return deployment

    def _measure_runs(self, runs: list[PlannedRun], deployment: Deployment) -> None:
        """Each run on its own: one that fails is an error of that run; once the server is gone, the
        remaining runs are errors naming the first failure."""
        measurer = Measurer(self.settings, self._bench_runner(), self.model(), self.run_dir / "bench")
        name = deployment.mode.name
        first_failure: str | None = None
        for run in runs:
            key = run.key
            if first_failure and not deployment.alive():
                self.measured.errors[key] = (
                    f"run {key.id} was not measured: the {name} server is no longer running; "
                    f"the first failure was: {first_failure}"
                )
                continue
            late = self._out_of_time(key, starting=False)
            if late:
                self.stop_measuring(late)
                return
            self.on_run(key, None)
            started = time.monotonic()
            try:
                self.measured.records[key] = measurer.run(run, deployment)
            except RUN_ERRORS as err:
                alive = deployment.alive()
                # A ServerError carries the log tail already.
                quiet = alive or isinstance(err, ServerError)
                log = "" if quiet else f"\n--- the server died; last lines of its log ---\n{tail(deployment.log_path)}"
                self.measured.errors[key] = f"run {key.id} failed: {err}{log}"
                first_failure = first_failure or (
                    f"run {key.id}" if alive else f"run {key.id} (the server died during it)"
                )
            self.on_run(key, time.monotonic() - started)
            # The store (held by get's lock) keeps each finished run in full, for a session that resumes this one.
            self.store.save(self.measured)
            self.publish()

    def _out_of_time(self, key: RunKey, starting: bool) -> str | None:
        """Why nothing more is begun under --apc-set stop_after: run ``key``, after a server start when
        ``starting``, could end after the limit (``estimate.run_seconds``, and the servers' mean start-up); None
        to go on."""
        limit = self.settings.stop_after
        if not limit:
            return None
        longest, how = estimate.run_seconds(key, self.measured.records.values(), self.settings)
        startups = [info.startup_s for info in self.measured.servers.values() if info.startup_s]
        start = sum(startups) / len(startups) if starting and startups else 0.0
        elapsed = time.monotonic() - self.began
        if elapsed + start + longest <= limit:
            return None
        after = f" after a server start of {start:,.0f} s" if start else ""
        return (
            f"the session's time is up (--apc-set stop_after={limit:g}): {elapsed:,.0f} s in, and run {key.id} could "
            f"take {longest:,.0f} s ({how}){after}; measure the runs left with --apc-resume {self.run_dir}"
        )

    def _probe_chat_header(self, deployment: Deployment) -> None:
        """The template header every prompt carries; without it hits cannot be predicted (a warning)."""
        info = deployment.info
        try:
            info.chat_header_tokens = deployment.chat_header_tokens()
        except Exception as err:  # noqa: BLE001 - a server without /tokenize: predictions cannot be made
            info.chat_header_error = f"/tokenize failed: {err}"
            self._warn(f"{info.mode}: {info.chat_header_error}; cached tokens cannot be predicted for its runs")

    def _check_kv_capacity(self, runs: list[PlannedRun], info: ServerInfo) -> list[PlannedRun]:
        """Warn (or fail the runs) when concurrency x prompt blocks exceeds the server's KV-cache blocks."""
        if not info.block_size or not info.num_gpu_blocks:
            return runs
        kept = []
        for run in runs:
            key = run.key
            if key.family == "offload":  # its GPU cache is too small on purpose
                kept.append(run)
                continue
            blocks, words = run.workload.kv_working_set(
                key.concurrency, info.chat_header_tokens or 0, info.block_size, key.apc
            )
            if blocks <= info.num_gpu_blocks:
                kept.append(run)
                continue
            message = (
                f"run {key.id}: {words} = {blocks} KV-cache blocks, more than the {info.mode} server's "
                f"{info.num_gpu_blocks} (block size {info.block_size}): expect preemptions and evicted prefix blocks"
            )
            self._warn(message)
            if self.settings.kv_check == "fail":
                self.measured.errors[key] = message + " (--apc-set kv_check=fail: not measured)"
            else:
                kept.append(run)
        return kept

    def _check_offload_sizes(self, info: ServerInfo) -> None:
        """The offload case's sizes as launched: a tier too small, a GPU cache too large, or a server that
        did not take the GPU cache size it was given, are warnings that say what the runs will show."""
        if not info.offload:
            return
        sizes = OffloadSizes.of(info.offload)
        found = sizes.warnings(tier=info.mode.endswith(OFFLOAD_TIER))
        if info.num_gpu_blocks and info.num_gpu_blocks != sizes.gpu_blocks:
            found.append(
                f"the server reports {info.num_gpu_blocks:,} GPU blocks, not the {sizes.gpu_blocks:,} it was given "
                "(--num-gpu-blocks-override): the eviction prediction uses the server's number"
            )
        for message in found:
            self._warn(f"{info.mode}: {message}")

    def refuse_runs(self, message: str) -> None:
        """:meth:`stop_measuring` before any measurement (at collection), shared through the store so that
        every process of this run fails its runs with ``message`` and the controller's summary shows it."""
        with self.store.lock():
            self.load_store()
            self.stop_measuring(message)
            self.store.save(self.measured)

    def stop_measuring(self, message: str) -> None:
        """Measure nothing more: every planned run not measured yet fails with ``message``, and no server
        starts again (with the store's lock held: other xdist workers read both from the store)."""
        self.progress(f"not measuring any more: {message}")
        for key in sorted(self.plan.keys):
            if key not in self.measured.records and key not in self.measured.errors:
                self.measured.errors[key] = f"run {key.id} was not measured: {message}"
        self.measured.done_modes.update(self.plan.modes())

    def _fail_runs(self, runs: list[PlannedRun], message: str) -> None:
        for run in runs:
            self.measured.errors[run.key] = message

    def _warn(self, message: str) -> None:
        self.measured.warnings.append(message)
        self.progress(f"WARNING {message}")

    # -- what the deployments share --------------------------------------------------------------------------

    def model(self) -> str:
        """What this session's servers load, made here if it is generated: a resumed session's runs name the
        earlier session's model, which may have been generated on another machine."""
        if self._served_model is None:
            self._served_model = served_model(self.settings, self.progress)
            self.measured.model = self.measured.model or self._served_model
        return self._served_model

    def _bench_runner(self) -> BenchRunner:
        if self._bench is None:
            env = dict(os.environ)
            if self.settings.api_key:
                env["OPENAI_API_KEY"] = self.settings.api_key  # vLLM's bench sends it as a bearer token
            if self.settings.ca_bundle:
                # aiohttp (the benchmark's requests) verifies with OpenSSL's default paths, which SSL_CERT_FILE
                # sets; requests (a tokenizer download) reads REQUESTS_CA_BUNDLE.
                env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = self.settings.ca_bundle
            self._bench = BenchRunner(self.run_dir / "bench-worker", env)
        return self._bench

    @contextlib.contextmanager
    def _server_time(self) -> Iterator[None]:
        """Count the time spent starting and stopping servers (the timing block of the results)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.measured.server_seconds += time.monotonic() - started

    def _stop_active(self) -> None:
        if self._active is not None:
            self._active.stop()
            self._active = None

    # -- results -----------------------------------------------------------------------------------------

    def json_model(self) -> str:
        return self.measured.model or self.settings.model or self.settings.model_label

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_wall

    def close(self) -> None:
        """Stop whatever still runs (also on Ctrl-C / SIGTERM). The controller's report writes the final
        results file; every measurement already wrote its own."""
        with contextlib.suppress(Exception):
            self._stop_active()
        if self._bench is not None:
            with contextlib.suppress(Exception):
                self._bench.close()
            self._bench = None
