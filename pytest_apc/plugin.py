"""pytest-apc's hooks and fixtures. Everything else lives in plain modules:

* settings: ``config`` (every option / ini key / env variable, one precedence)
* the case matrix and the expected hit count: ``workload.cases`` (``predict``); how a test marked
  ``apc_cases`` is parametrized, the run plan and the unused settings: ``workload.plan``
* what serves a mode: ``serving.deployment`` (``deployment_for``); what is checked before any server
  starts: ``serving.preflight``; the session that measures: ``measure.session`` (plan -> deployment ->
  ``measure.run`` -> ``measure.records``)
* verdicts: the ``verdicts`` package; the results file: ``results``; output: the ``report`` package
"""

from __future__ import annotations

import atexit
import shlex
import signal
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

import pytest

from pytest_apc import arguments, redaction, report
from pytest_apc import config as apc_config
from pytest_apc.gate.baseline import Baseline, Refused, read_baseline
from pytest_apc.gate.resume import Resume
from pytest_apc.measure.records import MeasurementError, RunRecord, RunSkipped
from pytest_apc.measure.session import ApcSession
from pytest_apc.results import document as results
from pytest_apc.serving import guard, preflight
from pytest_apc.serving import process as procs
from pytest_apc.verdicts import Pair, Verdict, not_comparable
from pytest_apc.workload import fit
from pytest_apc.workload.cases import CASE_APC, FAMILY_MARKERS, OWN_MARKER_FAMILIES, RunKey
from pytest_apc.workload.plan import APC_CASES_OPTIONS, TestUse, check_settings, parametrization, unused_settings

SETTINGS_KEY = pytest.StashKey[apc_config.Settings]()
SESSION_KEY = pytest.StashKey[ApcSession]()
SIGTERM_KEY = pytest.StashKey[Any]()
VERDICTS_KEY = pytest.StashKey[list[Verdict]]()
NODE_LOCK_KEY = pytest.StashKey[IO[str]]()
REAPS_KEY = pytest.StashKey[bool]()  # this run set its processes' owner tag, so it reaps them
DESELECTED_KEY = pytest.StashKey[list[pytest.Item]]()
REPORTER = "apc-reporter"  # the controller's ControllerReporter, as registered
# A file in the run's process registry: an xdist worker's selected tests may start a server on this node.
NODE_LOCK_WANTED = "node-lock-wanted"
BASELINE_KEY = pytest.StashKey[Baseline]()
RESUME_KEY = pytest.StashKey[Resume]()  # --apc-resume: the earlier session's folder, read and checked
# Files in the run's process registry: a process refused the baseline, or the session it resumes, once a
# server was up (the run exits with the usage-error status); an xdist worker selected no APC test (the
# controller writes no results, and says why).
REFUSED = "refused"
NO_APC_TEST = "no-apc-test"
NO_APC_TEST_KEY = pytest.StashKey[str]()  # why no APC test runs, on the controller
NO_PROFILE_SKIPS_KEY = pytest.StashKey[int]()  # selected APC tests skipped for want of a profile
SUITE = "tests_apc"  # the installed suite that pytest-apc runs


class ApcUnusedOptionWarning(pytest.PytestWarning):
    """A pytest-apc setting was given (option, environment, ini) but no selected test uses it, e.g.
    --apc-hash-algos with the hash-algorithm tests deselected: nothing is measured for it."""


SKIP_REASON = (
    "APC tests need servers: pass --gpu-node (vLLM on this node's GPUs with --apc-model or $MODEL_70B) "
    "or --cpu-node (vLLM's CPU build with a generated tiny model)"
)
MARKERS = (
    "apc: a test of vLLM automatic prefix caching (needs --gpu-node or --cpu-node)",
    "overhead: cases A/B, APC overhead without a shared prefix",
    "pure: cases C/D, a shared prefix and a short unique suffix (the pure APC effect)",
    "rag: cases E/F, a shared prefix and an equally long unique suffix (agent/RAG)",
    "sweep: the concurrency sweep over cases C-F",
    f"apc_cases(cases, {', '.join(f'{name}=False' for name in APC_CASES_OPTIONS)}): parametrize apc_run / "
    f"apc_pair over these cases ({', '.join(CASE_APC)}; e.g. 'CD') at the default concurrency, over "
    "--apc-set sweep_concurrency (sweep), or per --apc-hash-algos; case R once per route (fleet: each "
    "--apc-set router_policies policy, dp with --apc-set data_parallel_size, or --apc-fleet-url's "
    "--apc-set route_label); cases N/O over --apc-set offload_concurrency (sequential: at concurrency 1 only); "
    "cases M/L over --apc-set multiturn_concurrency (compact: the compaction run, at the highest level; tiers: "
    "case M at concurrency 1 on a small GPU cache without and with a CPU offload tier)",
    "hash_algo: the comparison of prefix-caching hash algorithms (--apc-hash-algos)",
    "fleet: case R on replicas behind a router (vllm-router policies, data parallel, an external fleet); "
    "not part of -m apc: select with -m fleet",
    "offload: cases N/O, a GPU cache too small for the prefix groups without and with a CPU offload tier "
    "(--gpu-node only), and case M on such caches; not part of -m apc: select with -m offload",
    "multiturn: cases M/L, conversations whose hits grow turn by turn (one benchmark run per turn), and their "
    "compaction; not part of -m apc: select with -m multiturn",
)


def _help_heading() -> str:
    """The heading of the plugin's group in pytest --help: what to run, the markers (from :data:`MARKERS`),
    where the other settings are. argparse prints a heading as it is, then ":"."""
    markers = [line for line in MARKERS if not line.startswith(("apc:", "apc_cases("))]
    own = [line.split(":")[0] for line in markers if "not part of -m apc" in line]
    in_apc = [line.split(":")[0] for line in markers if "not part of -m apc" not in line]
    words = (
        f"markers (-m): apc ({', '.join(in_apc)}); {', '.join(own)} (not in apc). Every other setting: "
        f"{apc_config.SET_OPTION} NAME=VALUE, listed by pytest-apc settings. Options"
    )
    return "\n".join([
        "vLLM automatic prefix caching validation (pytest-apc), e.g.",
        "  pytest-apc -m apc --cpu-node             vLLM's CPU build, a generated tiny model",
        "  pytest-apc -m apc --gpu-node --apc-model PATH",
        '  pytest-apc -m "pure or rag" --gpu-node --apc-baseline OLD/results.json',
        f"  pytest-apc -m fleet --gpu-node {apc_config.SET_OPTION} replicas=4",
        *textwrap.wrap(words, width=78, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False),
    ])  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    apc_config.add_options(parser, _help_heading())


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    # pytest runs no finalizers on SIGTERM (pytest#5243); as KeyboardInterrupt, servers are stopped.
    raise KeyboardInterrupt(f"received signal {signum}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if not _is_worker(config):
        _refuse_values_taken_for_test_paths(config)
    try:
        settings = apc_config.resolve(config)
        check_settings(settings)
    except apc_config.SettingError as err:
        raise pytest.UsageError(str(err)) from None
    config.stash[SETTINGS_KEY] = settings
    if settings.baseline:
        try:  # before anything runs: a baseline the gate cannot use is known now, not after the matrix
            if settings.enabled:
                config.stash[BASELINE_KEY] = Baseline.at_configure(settings)
            else:  # no profile, no gate: still, a file that cannot be read is a usage error, not silence
                read_baseline(settings.baseline)
        except Refused as err:
            raise pytest.UsageError(str(err)) from None
    if settings.resume and settings.enabled:
        try:  # before anything runs: an earlier session this one cannot continue is known now
            config.stash[RESUME_KEY] = Resume.at_configure(settings)
        except Refused as err:
            raise pytest.UsageError(str(err)) from None
    if not _is_worker(config):
        missing = preflight.missing_benchmark(settings)
        if missing:
            raise pytest.UsageError(missing)
    if _is_worker(config):
        winput = config.workerinput  # type: ignore[attr-defined]
        procs.configure(winput.get("apc_owner"), winput.get("apc_registry"))
        procs.register_worker()  # a controller killed outright leaves it running: its guard stops it
    else:
        tag, registry = procs.configure()
        atexit.register(procs.reap)
        if settings.enabled:  # servers may be launched: stopped even if this process is killed outright
            guard.start(tag, registry)
    config.stash[REAPS_KEY] = True
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_DFL, None):
            config.stash[SIGTERM_KEY] = previous
            signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    redaction.register(settings.api_key)
    redaction.register(settings.replica_api_key)
    if settings.enabled:
        config.stash[SESSION_KEY] = apc = _new_session(config, settings)
        if not _is_worker(config):
            reporter = report.ControllerReporter(config, apc, config.stash.get(BASELINE_KEY, None))
            config.pluginmanager.register(reporter, REPORTER)


def _new_session(config: pytest.Config, settings: apc_config.Settings) -> ApcSession:
    """The run's session; xdist workers share the controller's run folder (and so its store and lock)."""
    winput = getattr(config, "workerinput", None)
    resume = config.stash.get(RESUME_KEY, None)
    if winput is not None and "apc_run_dir" in winput:
        run_dir = Path(winput["apc_run_dir"])
    elif resume is not None:
        run_dir = resume.folder.absolute()  # the earlier session's folder, continued
    else:
        # Relative to where pytest was run, whatever rootdir pytest chose.
        root = config.invocation_params.dir / settings.results_dir
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir, suffix = root / stamp, 1
        while run_dir.exists():
            suffix += 1
            run_dir = root / f"{stamp}-{suffix}"
    json_path = Path(settings.json) if settings.json else run_dir / results.FILE_NAME
    tr = config.pluginmanager.get_plugin("terminalreporter")
    progress = report.progress_writer(config, tr)
    session = ApcSession(
        settings=settings, run_dir=run_dir, json_path=json_path, progress=progress, is_worker=winput is not None
    )
    if winput is not None and "apc_began" in winput:  # stop_after counts from the controller's start
        session.began -= time.time() - float(winput["apc_began"])
    session.publish = lambda: results.publish(session)
    # Asked once a server is up: the session this one resumes first, then the baseline.
    refusals = [check for check in (resume, config.stash.get(BASELINE_KEY, None)) if check is not None]
    if refusals:
        session.refuse = lambda: _noted_refusal(next(filter(None, (c.refusal(session) for c in refusals)), None))
    if resume is not None and winput is None:
        resume.adopt(session)  # xdist workers adopt the runs from the store
        if config.pluginmanager.has_plugin("dsession"):  # the workers plan: the controller says what it adopted
            progress(resume.progress_line(session.measured))
    session.on_run = report.RunProgress(session, progress)
    return session


def _refuse_values_taken_for_test_paths(config: pytest.Config) -> None:
    """A usage error when pytest chose its rootdir from an ``--apc-x PATH`` value (see ``arguments``): the
    project's ini file, with any apc_* keys in it, went unread."""
    here = config.invocation_params.dir
    taken = arguments.taken_for_test_paths(config.invocation_params.args, here)
    if taken:
        fixed = " ".join(pair.replace(" ", "=", 1) for pair in taken)
        raise pytest.UsageError(
            f"pytest read the value of {' '.join(taken)} as a test path before pytest-apc was loaded, and chose "
            f"its rootdir ({config.rootpath}) and ini file from there: write {fixed}"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: workers share this run's owner tag and process registry (for the reaper)."""
    node.workerinput["apc_owner"] = procs.owner_tag()
    node.workerinput["apc_registry"] = str(procs.registry_dir())
    apc = node.config.stash.get(SESSION_KEY, None)
    if apc is not None:
        node.workerinput["apc_run_dir"] = str(apc.run_dir)
        node.workerinput["apc_began"] = time.time() - (time.monotonic() - apc.began)


def _noted_refusal(refusal: str | None) -> str | None:
    """A refusal (of the baseline or of the session this one resumes), left in the run's process registry for
    the controller's exit status."""
    if refusal is not None:
        (procs.registry_dir() / REFUSED).write_text(refusal)
    return refusal


def given_settings(settings: apc_config.Settings) -> list[str]:
    """The settings set on the command line, in the environment or in an ini file (not defaults)."""
    return [name for name, source in settings.sources.items()
            if source.startswith(("option ", "environment variable PYTEST_APC", "ini key "))]  # fmt: skip


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return None
    if not settings.enabled:
        # A run that sets nothing of pytest-apc hears nothing of it here (the plugin loads in every pytest run
        # of the environment); selected APC tests say why they skip in the summary.
        if not given_settings(settings):
            return None
        return ["apc: no profile (--gpu-node / --cpu-node): APC tests will be skipped"]
    return report.header_lines(settings, verbose=config.get_verbosity() > 0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("apc_cases")
    if marker is None:
        return
    fixture = "apc_pair" if "apc_pair" in metafunc.fixturenames else "apc_run"
    cases = marker.args[0] if marker.args else ""
    try:
        params = parametrization(cases, marker.kwargs, metafunc.config.stash[SETTINGS_KEY])
    except ValueError as err:
        raise ValueError(f"apc_cases({cases!r}) on {metafunc.definition.nodeid}: {err}") from None
    values = [pytest.param(p.run_id, marks=[pytest.mark.skip(reason=p.skip)] if p.skip else ()) for p in params]
    metafunc.parametrize(fixture, values, indirect=True, ids=[p.test_id for p in params])


def _keys_of(item: pytest.Item) -> list[RunKey]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    keys: list[RunKey] = []
    if "apc_run" in callspec.params:
        keys.append(RunKey.parse(callspec.params["apc_run"]))
    if "apc_pair" in callspec.params:
        keys.extend(RunKey.parse(callspec.params["apc_pair"]).pair())
    return keys


def _runs_of(item: pytest.Item) -> list[RunKey]:
    """Every run a test uses: its own, and for ``apc_default_run`` the same case on the default server."""
    keys = _keys_of(item)
    if "apc_default_run" in getattr(item, "fixturenames", ()):
        keys += [RunKey(k.case, k.concurrency) for k in keys]
    return list(dict.fromkeys(keys))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test that uses APC measurements is an ``apc`` test, marked or not (before -m selects); one
    whose runs are routed (case R) is a ``fleet`` test instead and stays out of ``-m apc`` (it needs a
    router and several replicas)."""
    keys = _keys_of(item)
    uses_apc = bool(keys) or "apc_session" in getattr(item, "fixturenames", ())
    if uses_apc and not _measures(item):
        # A routed run is a fleet's (case M behind the router too): -m multiturn must not start replicas.
        own = ["fleet" if key.route else key.family for key in keys if key.family in OWN_MARKER_FAMILIES]
        item.add_marker(getattr(pytest.mark, own[0]) if own else pytest.mark.apc)


def _measures(item: pytest.Item) -> bool:
    """A test that measures: marked ``apc``, or with the marker of a family outside it (``fleet``, ``offload``)."""
    return any(item.get_closest_marker(name) is not None for name in ("apc", *OWN_MARKER_FAMILIES))


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: plan only what will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = config.stash.get(SESSION_KEY, None)
    settings = config.stash.get(SETTINGS_KEY, None)
    selected = [item.nodeid for item in items if _measures(item)]
    if session is None and selected and settings is not None and settings.without_profile == "fail":
        raise pytest.UsageError(
            f"{len(selected)} APC tests are selected but no profile was given, and "
            f"apc_without_profile=fail ({settings.sources.get('without_profile')}): {SKIP_REASON}"
        )
    skip = pytest.mark.skip(reason=SKIP_REASON)
    undeclared = 0  # selected tests that measure runs they do not declare
    if session is None and selected:
        config.stash[NO_PROFILE_SKIPS_KEY] = len(selected)
    for item in items:
        if not _measures(item):
            continue
        if session is None:
            item.add_marker(skip)
        elif item.get_closest_marker("skip") is None:
            runs = _runs_of(item)
            session.plan.add(runs)
            undeclared += not runs
    if session is not None and settings is not None:
        _fit_runs(config, session, settings, items)
        _warn_unused_settings(config, settings, session, items)
        if BASELINE_KEY in config.stash:
            try:  # the selected runs are known: enough repeats of each the baseline has, before any server starts
                config.stash[BASELINE_KEY].check_runs(session.plan.keys)
            except Refused as err:
                if not _is_worker(config):
                    raise pytest.UsageError(str(err)) from None
                session.refuse_runs(str(err))  # an xdist worker cannot stop the session: its runs fail with it
                _noted_refusal(str(err))
        if not selected:
            _no_apc_test(config)
        if RESUME_KEY in config.stash and not _is_worker(config):
            session.progress(config.stash[RESUME_KEY].progress_line(session.measured, session.plan))
        _hold_the_node(config, preflight.node_lock_needed(settings, session.plan.keys, undeclared))


def _fit_runs(
    config: pytest.Config, session: ApcSession, settings: apc_config.Settings, items: list[pytest.Item]
) -> None:
    """The planned runs on launched servers against the model's context (servers run elsewhere: at the
    session's first measurement): their lengths scaled, or the tests of runs that do not fit skipped; a
    selection of which nothing fits is refused."""
    launched = [key for key in session.plan.keys if preflight.launched_here(key.mode, settings)]
    try:
        fitted = fit.fit_runs(settings, launched, fit.model_context(settings))
    except fit.DoesNotFit as err:
        if not _is_worker(config):
            raise pytest.UsageError(str(err)) from None
        session.refuse_runs(str(err))  # an xdist worker cannot stop the session: its runs fail with it
        return
    if fitted is None:
        return
    session.apply_fit(fitted)
    config.stash[SETTINGS_KEY] = session.settings
    for item in items:
        reasons = [fitted.skipped[key.id] for key in _runs_of(item) if key.id in fitted.skipped]
        if reasons:
            item.add_marker(pytest.mark.skip(reason=reasons[0]))


def _no_apc_test(config: pytest.Config) -> None:
    """A profile is given but no APC test is selected: nothing will be measured, so the run writes no results
    and says why in one line (pytest's own exit status stands: 5 when nothing else was collected). An xdist
    worker leaves the line in the run's process registry for the controller."""
    deselected = [item for item in config.stash.get(DESELECTED_KEY, []) if _measures(item)]
    if deselected:
        why = f"apc: no APC test selected ({len(deselected)} deselected): nothing measured, no results written"
    else:
        args = shlex.join(config.invocation_params.args)
        if config.args_source == pytest.Config.ArgsSource.ARGS:  # paths were given: the suite is not among them
            args = f"-m apc --{config.stash[SETTINGS_KEY].profile}-node"
        why = (
            f"apc: no test of the APC suite was collected here: nothing measured, no results written; run the "
            f"installed suite with: pytest-apc {args}  (= pytest --pyargs {SUITE} {args})"
        )
    if _is_worker(config):
        (procs.registry_dir() / NO_APC_TEST).write_text(why)
    else:
        _measures_nothing(config, why)


def _measures_nothing(config: pytest.Config, why: str) -> None:
    """The controller's run measures nothing: no gate, table or results files (the reporter goes), one line."""
    if config.pluginmanager.has_plugin(REPORTER):
        config.pluginmanager.unregister(name=REPORTER)
    config.stash[NO_APC_TEST_KEY] = why


def _hold_the_node(config: pytest.Config, why: str | None) -> None:
    """Take this node's GPU lock, after collection and before any server starts, when the selected tests
    may start one here (``why``). Under xdist the workers collect and the controller holds the lock: a
    worker leaves ``why`` in the run's registry, and the controller takes the lock when the worker's
    collection reaches it, before any test is scheduled."""
    if why is None or NODE_LOCK_KEY in config.stash:
        return
    if _is_worker(config):
        (procs.registry_dir() / NODE_LOCK_WANTED).write_text(why)
        return
    try:
        config.stash[NODE_LOCK_KEY] = procs.acquire_node_lock()
    except RuntimeError as err:
        # Refused before anything ran: no results folder, summary or table for a run that did not happen.
        if config.pluginmanager.has_plugin(REPORTER):
            config.pluginmanager.unregister(name=REPORTER)
        raise pytest.UsageError(f"{err}. This run needs them: {why}") from None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """xdist controller: a worker's collection is in, no test is scheduled yet: the node lock, if wanted."""
    wanted = procs.registry_dir() / NODE_LOCK_WANTED
    if wanted.is_file():
        _hold_the_node(node.config, wanted.read_text())
    nothing = procs.registry_dir() / NO_APC_TEST
    if nothing.is_file() and NO_APC_TEST_KEY not in node.config.stash:
        _measures_nothing(node.config, nothing.read_text())


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    """Remember what -m / -k (or another plugin) deselected, to say why an option selects nothing."""
    if items:
        items[0].config.stash.setdefault(DESELECTED_KEY, []).extend(items)


def _use_of(item: pytest.Item) -> TestUse:
    marker = item.get_closest_marker("apc_cases")
    sweep = bool(marker is not None and marker.kwargs.get("sweep"))
    return TestUse(tuple(_runs_of(item)), sweep, frozenset(m.name for m in item.iter_markers()))


def _warn_unused_settings(
    config: pytest.Config, settings: apc_config.Settings, session: ApcSession, items: list[pytest.Item]
) -> None:
    """One ApcUnusedOptionWarning, and a session warning, per setting given explicitly that no selected
    test uses (its tests deselected, skipped or absent)."""
    apc_items = [item for item in items if _measures(item)]
    planned = [_use_of(item) for item in apc_items if item.get_closest_marker("skip") is None]
    skipped = [_use_of(item) for item in apc_items if item.get_closest_marker("skip") is not None]
    deselected = [_use_of(item) for item in config.stash.get(DESELECTED_KEY, [])]
    how = [f"{flag} {value!r}" for flag, value in (("-m", config.option.markexpr), ("-k", config.option.keyword))
           if value]  # fmt: skip
    for message in unused_settings(
        settings, planned, deselected, skipped, " ".join(how) or "the selection", FAMILY_MARKERS
    ):
        if message not in session.measured.warnings:
            session.measured.warnings.append(message)
        try:
            warnings.warn(ApcUnusedOptionWarning(message), stacklevel=1)
        except ApcUnusedOptionWarning as err:  # -W error::...ApcUnusedOptionWarning: a usage error, not INTERNALERROR
            raise pytest.UsageError(str(err)) from None


@pytest.fixture(scope="session")
def apc_settings(pytestconfig: pytest.Config) -> apc_config.Settings:
    """The resolved pytest-apc settings of this run."""
    return pytestconfig.stash[SETTINGS_KEY]


@pytest.fixture(scope="session")
def apc_session(pytestconfig: pytest.Config) -> ApcSession:
    """The measurement session: servers, runs and results of this pytest run."""
    session = pytestconfig.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.skip(SKIP_REASON)
    return session


def _get(session: ApcSession, key: RunKey) -> RunRecord:
    """The measured run for ``key``; the test skips when the run does not fit the model's context."""
    try:
        return session.get(key)
    except RunSkipped as err:
        pytest.skip(str(err))


@pytest.fixture
def apc_run(request: pytest.FixtureRequest, apc_session: ApcSession) -> RunRecord:
    """One measured run, e.g. ``D-c8`` (parametrize with ``@pytest.mark.apc_cases``)."""
    record = _get(apc_session, RunKey.parse(request.param))
    report.record_properties(request.node, record)
    return record


@pytest.fixture
def apc_default_run(apc_run: RunRecord, apc_session: ApcSession) -> RunRecord:
    """For a run with a hash algorithm (``D-c8-xxhash``): the same case on the default APC-on server."""
    default = _get(apc_session, RunKey(apc_run.key.case, apc_run.key.concurrency))
    _require_comparable(default, apc_run)
    return default


@pytest.fixture
def apc_pair(request: pytest.FixtureRequest, apc_session: ApcSession) -> Pair:
    """The OFF and ON run of one pair at one concurrency (parametrize with the ON case, e.g. ``D-c8``)."""
    off_key, on_key = RunKey.parse(request.param).pair()
    off, on = _get(apc_session, off_key), _get(apc_session, on_key)
    _require_comparable(off, on)
    pair = Pair(off=off, on=on, settings=apc_session.settings, runs=apc_session.measured.records)
    report.record_properties(request.node, pair.on)
    return pair


def _require_comparable(a: RunRecord, b: RunRecord) -> None:
    problems = not_comparable(a, b)
    if problems:
        raise MeasurementError(
            f"runs {a.key.id} and {b.key.id} cannot be compared, so no verdict on them can be trusted:"
            + "".join(f"\n- {p}" for p in problems)
        )


@pytest.fixture
def apc_assert(request: pytest.FixtureRequest) -> Callable[..., Verdict]:
    """Record verdicts for the results file and fail the test with the messages of those that did not pass.
    Given together, every verdict is judged and recorded (a pair that saved no prefill shows its timing too);
    the first one is returned."""

    def check(verdict: Verdict, *more: Verdict) -> Verdict:
        given = [verdict, *more]
        request.node.stash.setdefault(VERDICTS_KEY, []).extend(given)
        failed = [v.message for v in given if not v.passed]
        if failed:
            pytest.fail("\n\n".join(failed), pytrace=False)
        return verdict

    return check


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    rep = yield
    apc = item.config.stash.get(SESSION_KEY, None)
    if rep.failed and call.excinfo is not None and call.excinfo.errisinstance(MeasurementError):
        rep.longrepr = str(call.excinfo.value)  # self-contained; the plugin's traceback adds nothing
    if rep.failed and rep.when in ("setup", "call") and apc is not None:
        rep.sections.extend(
            report.failure_sections(apc.measured, apc.run_dir, _runs_of(item))
        )  # nothing for a test without runs
    # Verdicts and run ids travel with the report to the xdist controller (plain data only).
    verdicts = item.stash.get(VERDICTS_KEY, [])
    if rep.when == "call" and verdicts:
        rep.user_properties.append((report.VERDICTS_PROPERTY, [v.to_json() for v in verdicts]))
    if rep.failed and _keys_of(item):
        # The runs whose row a failure fails (both of a pair; not the default run an algorithm is compared with).
        rep.user_properties.append((report.RUNS_PROPERTY, [k.id for k in _keys_of(item)]))
    return rep


def pytest_sessionfinish(session: pytest.Session) -> None:
    apc = session.config.stash.get(SESSION_KEY, None)
    if apc is not None:
        apc.close()  # the controller's reporter writes the final results once, after this
    if session.exitstatus == pytest.ExitCode.TESTS_FAILED and _refused(session.config):
        # The tests failed because the baseline could not judge them, or the session this one resumes cannot
        # be continued: no regression, a usage error.
        session.exitstatus = pytest.ExitCode.USAGE_ERROR


def _refused(config: pytest.Config) -> bool:
    """The controller's run refused its baseline (at collection (an xdist worker), once a server was up, or in
    the gate at the end, without a regression), or the session it resumes once a server was up."""
    if _is_worker(config):
        return False
    reporter = config.pluginmanager.get_plugin(REPORTER)
    if BASELINE_KEY in config.stash and reporter is not None and reporter.gate.refused_to_judge:
        return True
    return (procs.registry_dir() / REFUSED).is_file()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line when this run measured nothing it could have: no APC test selected with a profile, or APC
    tests skipped for want of one."""
    skipped = config.stash.get(NO_PROFILE_SKIPS_KEY, 0)
    if skipped:
        terminalreporter.write_line(f"apc: {skipped} APC tests skipped: no profile (--gpu-node / --cpu-node)")
    if NO_APC_TEST_KEY in config.stash:
        terminalreporter.write_line(config.stash[NO_APC_TEST_KEY])


def pytest_unconfigure(config: pytest.Config) -> None:
    apc = config.stash.get(SESSION_KEY, None)
    if apc is not None:
        apc.close()
    # Only a run that configured its own owner tag reaps: one that stopped with a usage error before
    # that (an in-process run inside another run's test) would kill the other run's processes.
    if not _is_worker(config) and config.stash.get(REAPS_KEY, False):
        procs.reap()
    if NODE_LOCK_KEY in config.stash:
        config.stash[NODE_LOCK_KEY].close()
    if SIGTERM_KEY in config.stash and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, config.stash[SIGTERM_KEY] or signal.SIG_DFL)
