"""The measurement session: which runs this pytest run needs, and running each exactly once.

At collection the plugin tells the session every run the selected tests need (``plan``). The first
test that asks for a run of a server mode triggers *all* planned runs of that mode, on one freshly
launched server that is stopped afterwards. So whatever tests are selected and in whatever order:
one launch per mode, never two servers alive at once, every run measured once and shared.

One measurement (``_measure``): reset the prefix cache (require success), scrape ``/metrics``, run
vLLM's benchmark, wait until the server is idle, scrape again, keep the deltas. Every finished run is
written to the results file at once, so a later crash loses nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_apc import metrics
from pytest_apc.bench import BenchError, BenchRunner, bench_args
from pytest_apc.cases import CASE_FAMILY, FAMILIES, RunKey, ServerMode, Workload, ceil_div, predict, workload_for
from pytest_apc.config import Settings
from pytest_apc.records import MeasurementError, Repeat, RunRecord, ServerInfo
from pytest_apc.redaction import redact
from pytest_apc.server import (
    ServerError,
    VllmServer,
    build_command,
    gpu_memory_used_mib,
    server_env,
    tail,
    wait_gpu_memory_released,
)

SCHEMA_VERSION = 1


@dataclass
class ApcSession:
    """Owns the plan, the servers (one at a time), the benchmark worker and the results file."""

    settings: Settings
    run_dir: Path
    json_path: Path
    progress: Callable[[str], None] = lambda message: None
    is_worker: bool = False  # an xdist worker: measures and shares, the controller reports
    planned: set[RunKey] = field(default_factory=set)
    records: dict[RunKey, RunRecord] = field(default_factory=dict)
    errors: dict[RunKey, str] = field(default_factory=dict)
    launches: Counter[str] = field(default_factory=Counter)
    servers: dict[str, ServerInfo] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    started_wall: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    server_seconds: float = 0.0
    _done_modes: set[ServerMode] = field(default_factory=set)
    _active: VllmServer | None = None
    _bench: BenchRunner | None = None
    _model: str | None = None

    # -- plan --------------------------------------------------------------------------------------------

    def plan(self, keys: Iterable[RunKey]) -> None:
        self.planned.update(keys)

    def workload(self, family: str) -> Workload:
        return workload_for(family, self.settings)

    def max_model_len(self) -> int:
        """Room for the longest workload of any family (same on every server, whatever is selected)."""
        if self.settings.max_model_len:
            return int(self.settings.max_model_len)
        longest = max(w.prompt_len + w.output_len for w in map(self.workload, FAMILIES))
        return ceil_div(longest + 256, 256) * 256  # chat template headroom, rounded up

    # -- the one entry point tests use ---------------------------------------------------------------------

    def get(self, key: RunKey) -> RunRecord:
        """The measured run for ``key`` (measuring its whole server mode first if needed).

        Under pytest-xdist every worker is its own session; they share ``run_dir``. A lock there makes
        sure one server runs at a time on the node and each mode is measured by one worker only; the
        others adopt its runs from the shared store.
        """
        if key not in self.records and key not in self.errors:
            self.planned.add(key)
            mode = key.mode
            with self._lock():
                self.load_store()
                if key not in self.records and key not in self.errors:
                    if mode in self._done_modes:
                        # Not planned at collection: measuring it now would need a second launch.
                        raise MeasurementError(
                            f"run {key.id} was not planned at collection and its {mode.name} server is already stopped"
                        )
                    self._measure_mode(mode)
                    self._save_store()
        if key in self.errors:
            raise MeasurementError(self.errors[key])
        return self.records[key]

    # -- the store shared by xdist workers -----------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "measure.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @property
    def _store_path(self) -> Path:
        return self.run_dir / "store.pickle"

    def _save_store(self) -> None:
        state = {
            "records": self.records,
            "errors": self.errors,
            "launches": dict(self.launches),
            "servers": self.servers,
            "done_modes": self._done_modes,
            "server_seconds": self.server_seconds,
            "model": self._model,
            "warnings": self.warnings,
        }
        tmp = self._store_path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(state))
        os.replace(tmp, self._store_path)

    def load_store(self) -> None:
        """Adopt what any process of this run has measured (trusted: written by this run itself)."""
        if not self._store_path.is_file():
            return
        state = pickle.loads(self._store_path.read_bytes())
        self.records.update(state["records"])
        self.errors.update(state["errors"])
        self.launches = Counter(state["launches"])
        self.servers.update(state["servers"])
        self._done_modes |= state["done_modes"]
        self.server_seconds = state["server_seconds"]
        self.warnings = list(dict.fromkeys(self.warnings + state["warnings"]))
        self._model = self._model or state["model"]

    # -- servers -----------------------------------------------------------------------------------------

    def model(self) -> str:
        if self._model is None:
            if self.settings.model_shape:
                from pytest_apc.tinymodel import ensure_shape_model

                self._model = str(ensure_shape_model(self.settings.model_shape))
            elif self.settings.profile == "cpu" and not self.settings.model:
                from pytest_apc.tinymodel import ensure_tiny_model, tiny_model_cached

                if not tiny_model_cached():
                    self.progress("generating the tiny CPU model (cached after the first run)")
                self._model = str(ensure_tiny_model())
            else:
                self._model = str(self.settings.model)
        return self._model

    def tensor_parallel_size(self) -> int:
        if self.settings.tensor_parallel_size:
            return int(self.settings.tensor_parallel_size)
        if self.settings.profile == "gpu":
            used = gpu_memory_used_mib()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                return len([v for v in visible.split(",") if v.strip()])
            return max(1, len(used or []))
        return 1

    def _new_server(self, mode: ServerMode) -> VllmServer:
        s = self.settings
        model = self.model()

        def command(port: int) -> list[str]:
            return build_command(
                s.server_command,
                model=model,
                served_model_name=s.served_model_name,
                host=s.host,
                port=port,
                mode=mode,
                max_model_len=self.max_model_len(),
                tensor_parallel_size=self.tensor_parallel_size(),
                extra=(("--load-format", "dummy") if s.model_shape else ()) + tuple(s.server_arg),
                launcher=s.launcher,
                api_key=s.api_key,
            )

        return VllmServer(
            mode,
            command,
            host=s.host,
            served_model_name=s.served_model_name,
            env=server_env(s.profile),
            log_path=self.run_dir / f"server-{mode.name}.log",
            startup_timeout=s.startup_timeout,
            stop_timeout=s.stop_timeout,
            on_progress=self.progress,
            external_url=self.external_url(mode),
            api_key=s.api_key,
        )

    def external_url(self, mode: ServerMode) -> str:
        """The URL of a server run elsewhere for this mode, or "" to launch one."""
        if mode.hash_algo:
            return ""
        return str(self.settings.url_on if mode.apc else self.settings.url_off)

    def _stop_active(self) -> None:
        if self._active is not None:
            baseline = self._active.gpu_baseline
            self._active.stop()
            self._active = None
            waited = wait_gpu_memory_released(baseline)
            if waited:
                self.progress(f"waited {waited:.0f} s for GPU memory to be released")

    def _measure_mode(self, mode: ServerMode) -> None:
        keys = sorted(k for k in self.planned if k.mode == mode)
        self._done_modes.add(mode)
        self._stop_active()
        missing = self._missing_hash_package(mode)
        if missing:
            for key in keys:
                self.errors[key] = missing
            return
        server = self._new_server(mode)
        if server.external_url:
            self.progress(f"{mode.name}: using the external server {server.external_url}")
        else:
            self.launches[mode.name] += 1
            self.progress(f"{mode.name}: launching ({len(keys)} runs planned)")
        t0 = time.monotonic()
        if self._bench is None:
            env = dict(os.environ)
            if self.settings.api_key:
                env["OPENAI_API_KEY"] = self.settings.api_key  # vLLM's bench sends it as a bearer token
            self._bench = BenchRunner(self.run_dir / "bench-worker", env)
        self._bench.prewarm()  # vLLM's import overlaps the server start-up
        try:
            info = server.start()
        except ServerError as err:
            server.stop()
            self.server_seconds += time.monotonic() - t0
            message = f"the {mode.name} server could not start:\n{err}"
            for key in keys:
                self.errors[key] = message
            self.servers[mode.name] = server.info
            self.write_json()
            return
        self._active = server
        self.server_seconds += time.monotonic() - t0
        try:
            info.chat_header_tokens = server.chat_header_tokens()
        except Exception as err:  # noqa: BLE001 - a server without /tokenize: predictions cannot be made
            info.chat_header_error = f"/tokenize failed: {err}"
            message = f"{mode.name}: {info.chat_header_error}; cached tokens cannot be predicted for its runs"
            self.warnings.append(message)
            self.progress(f"WARNING {message}")
        self.servers[mode.name] = info
        self.progress(
            f"{mode.name}: ready in {info.startup_s:.0f} s; block size {info.block_size}, "
            f"{info.kv_cache_line or 'KV cache size line not seen'}"
        )
        keys = self._check_kv_capacity(keys, info)
        self.write_json()
        first_failure: str | None = None
        try:
            for key in keys:
                if first_failure and not server.alive():
                    self.errors[key] = (
                        f"run {key.id} was not measured: the {mode.name} server is no longer running; "
                        f"the first failure was: {first_failure}"
                    )
                    continue
                self.progress(f"{mode.name}: measuring {key.id}")
                t1 = time.monotonic()
                try:
                    self.records[key] = self._measure(key, server)
                except (BenchError, ServerError, metrics.MetricsError, OSError, ValueError) as err:
                    alive = server.alive()
                    extra = (
                        "" if alive else f"\n--- the server died; last lines of its log ---\n{tail(server.log_path)}"
                    )
                    self.errors[key] = f"run {key.id} failed: {err}{extra}"
                    first_failure = first_failure or f"run {key.id}"
                    if not alive:
                        first_failure = f"run {key.id} (the server died during it)"
                self.progress(f"{mode.name}: {key.id} done in {time.monotonic() - t1:.1f} s")
                self.write_json()
        finally:
            t2 = time.monotonic()
            self._stop_active()
            self.server_seconds += time.monotonic() - t2
            self.write_json()

    def _missing_hash_package(self, mode: ServerMode) -> str | None:
        """xxhash algorithms need the xxhash package where the server runs: say so before a crash log does."""
        if not mode.hash_algo.startswith("xxhash") or self.settings.launcher:
            return None
        if "{python}" not in self.settings.server_command:
            return None  # another interpreter: its startup error will say it
        import importlib.util

        if importlib.util.find_spec("xxhash") is None:
            return (
                f"the {mode.name} server needs the Python package 'xxhash' for --prefix-caching-hash-algo "
                f"{mode.hash_algo}, and it is not installed in {sys.executable}: pip install xxhash"
            )
        return None

    def _check_kv_capacity(self, keys: list[RunKey], info: ServerInfo) -> list[RunKey]:
        """Warn (or fail the runs) when concurrency x prompt blocks exceeds the server's KV-cache blocks."""
        if not info.block_size or not info.num_gpu_blocks:
            return keys
        kept = []
        for key in keys:
            w = self.workload(key.family)
            per_request = w.kv_blocks_per_request(info.chat_header_tokens or 0, info.block_size)
            blocks = key.concurrency * per_request
            if blocks <= info.num_gpu_blocks:
                kept.append(key)
                continue
            message = (
                f"run {key.id}: concurrency {key.concurrency} x {per_request} blocks per request "
                f"= {blocks} KV-cache blocks, more than the {info.mode} server's {info.num_gpu_blocks} "
                f"(block size {info.block_size}): expect preemptions and evicted prefix blocks"
            )
            self.warnings.append(message)
            self.progress(f"WARNING {message}")
            if self.settings.kv_check == "fail":
                self.errors[key] = message + " (--apc-kv-check=fail: not measured)"
            else:
                kept.append(key)
        return kept

    def _measure(self, key: RunKey, server: VllmServer) -> RunRecord:
        started = time.monotonic()
        workload = self.workload(key.family)
        repeats = [
            self._measure_once(key, workload, server, f"{key.id}-r{i + 1}" if self.settings.repeats > 1 else key.id)
            for i in range(self.settings.repeats)
        ]
        header = server.info.chat_header_tokens
        record = RunRecord(
            key=key,
            workload=workload,
            server=server.info,
            repeats=repeats,
            header_tokens=header if header is not None else -1,
            wall_s=round(time.monotonic() - started, 3),
        )
        if header is not None and server.info.block_size:
            record.prediction = predict(
                workload, header, server.info.block_size, int(repeats[0].bench["total_input_tokens"])
            )
        return record

    def _measure_once(self, key: RunKey, workload: Workload, server: VllmServer, name: str) -> Repeat:
        """Reset (APC on), scrape, benchmark, wait until idle, scrape: one cold run."""
        reset = server.reset_prefix_cache() if key.apc else None
        server.check_alive("before the run")
        before: metrics.Snapshot | None
        metrics_error: str | None = None
        try:
            before = server.wait_idle()
        except metrics.MetricsError as err:
            before, metrics_error = None, str(err)
        bench_dir = self.run_dir / "bench"
        bench_dir.mkdir(parents=True, exist_ok=True)
        argv = bench_args(
            workload,
            key,
            base_url=server.url,
            model=self.model(),
            tokenizer=self.settings.tokenizer,
            served_model_name=self.settings.served_model_name,
            result_dir=bench_dir,
            result_filename=f"{name}.json",
        )
        assert self._bench is not None
        outcome = self._bench.run(
            argv,
            bench_dir / f"{name}.json",
            workload.num_prompts,
            bench_dir / f"{name}.log",
            self.settings.bench_timeout,
        )
        server.check_alive("after the benchmark")
        delta = None
        if before is not None:
            try:
                delta = metrics.delta(before, server.wait_idle())
            except metrics.MetricsError as err:
                metrics_error = str(err)
        return Repeat(outcome.result, delta, metrics_error, reset, str(outcome.result_path), outcome.command)

    # -- results -----------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        records = sorted(self.records.values(), key=lambda r: (CASE_FAMILY[r.key.case], r.key))
        bench_s = sum(float(rep.bench["duration"]) for r in records for rep in r.repeats)
        measure_s = sum(r.wall_s for r in records)
        elapsed = time.monotonic() - self.started_wall
        return {
            "schema_version": SCHEMA_VERSION,
            "started_at": self.started_at,
            "profile": self.settings.profile,
            "model": self.json_model(),
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.settings.values.items()},
            "server_launches": dict(self.launches),
            "servers": [info.__dict__ for info in self.servers.values()],
            "runs": [r.to_json() for r in records],
            "errors": {k.id: v for k, v in sorted(self.errors.items())},
            "warnings": self.warnings,
            "timing": {
                "suite_elapsed_s": round(elapsed, 3),
                "server_lifecycle_s": round(self.server_seconds, 3),
                "measurements_wall_s": round(measure_s, 3),
                "bench_duration_s": round(bench_s, 3),
                # Time the suite spent on anything but starting/stopping servers and measuring.
                "harness_overhead_s": round(elapsed - self.server_seconds - measure_s, 3),
                # Suite time over (server lifecycle + the benchmarks' own durations); target <= 1.05 on GPU.
                "overhead_ratio": round(elapsed / (self.server_seconds + bench_s), 3)
                if self.server_seconds + bench_s > 0
                else None,
            },
        }

    def json_model(self) -> str:
        return self._model or self.settings.model or self.settings.model_label

    def write_json(self, extra: dict[str, Any] | None = None) -> None:
        """Rewrite the results file: what is measured so far, and ``extra`` (the report's part, at the end).
        "verdicts" is required by the schema; only the controller's final write knows them."""
        data = {**self.to_json(), "verdicts": [], **(extra or {})}
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.json_path.with_suffix(".tmp")
        tmp.write_text(redact(json.dumps(data, indent=2, default=str)))
        os.replace(tmp, self.json_path)

    def close(self, write: bool = True) -> None:
        """Stop whatever still runs (also on Ctrl-C / SIGTERM) and write the final results (unless nothing
        could have run, as with --collect-only)."""
        with contextlib.suppress(Exception):
            self._stop_active()
        if self._bench is not None:
            with contextlib.suppress(Exception):
                self._bench.close()
            self._bench = None
        if write and not self.is_worker:
            self.load_store()
            with contextlib.suppress(Exception):
                self.write_json()
