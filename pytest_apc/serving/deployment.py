"""Which kind of deployment serves an APC mode, built from the settings (:func:`deployment_for`).

A *deployment* serves one server mode (``apc-off``, ``apc-on``, ``apc-on-<hash algorithm>``, a fleet's, the
offload case's) for as long as that mode's runs take; what the session needs from one is declared in
``interface.py`` (``Deployment``, ``ServerInfo``). The kinds, and where :func:`deployment_for` picks each:

* ``LaunchedServer`` (server.py): one vLLM server that pytest-apc starts from the settings (also with
  ``--data-parallel-size``: its ranks are parts of one ``/metrics``; and the offload case's, with a GPU
  cache sized by ``workload.offload``);
* ``ExternalServer`` (server.py): a server given by ``--apc-url-on`` / ``--apc-url-off``;
* ``Fleet`` (fleet.py): replicas behind a router, launched (vllm-router, one policy per run) or run
  elsewhere (``--apc-fleet-url`` and each replica's ``--apc-metrics-url``).

Also here: what a launched server gets (its model, context, tensor-parallel size, GPUs or cores), and the
context servers run elsewhere say they have (``external_context``). What is
checked before any server starts is in ``preflight.py``. A new kind implements ``Deployment`` and gets a
branch in ``deployment_for``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.serving.client import http_session
from pytest_apc.serving.command import ENV_PLACEHOLDER, build_command
from pytest_apc.serving.endpoint import Endpoint, Reach
from pytest_apc.serving.fleet import Fleet
from pytest_apc.serving.gpus import cuda_visible_devices, gpu_memory_used_mib
from pytest_apc.serving.interface import Deployment, ServerError
from pytest_apc.serving.launch_env import own_variables, server_env
from pytest_apc.serving.router import Router
from pytest_apc.serving.server import ExternalServer, LaunchedServer
from pytest_apc.workload import fit, offload
from pytest_apc.workload.cases import DATA_PARALLEL, EXTERNAL_FLEET, RunKey, ServerMode, Workload
from pytest_apc.workload.fit import TEMPLATE_HEADROOM, launch_len, request_tokens, room_for
from pytest_apc.workload.offload import OffloadSizeError, OffloadSizes
from pytest_apc.workload.plan import PlannedRun
from pytest_apc.workload.vllm_loader import LOAD_FORMAT


def deployment_for(
    mode: ServerMode,
    settings: Settings,
    model: str,
    run_dir: Path,
    progress: Callable[[str], None],
    runs: Sequence[PlannedRun] = (),
    planned: Sequence[RunKey] = (),
) -> Deployment:
    """The deployment that serves ``mode`` under these settings, for ``runs`` (a small-cache server is sized
    for their workload), of the session's ``planned`` runs, whose longest request sets a launched server's
    context."""
    need, why = context_needed(runs)
    how = Reach(
        served_model_name=settings.served_model_name,
        log_path=run_dir / f"server-{mode.name}.log",
        startup_timeout=settings.startup_timeout,
        on_progress=progress,
        api_key=settings.api_key,
        ca_bundle=settings.ca_bundle,
    )
    # A server run elsewhere serves the name it serves (without --apc-set served_model_name, take it from it),
    # and its own context. Launched servers get the context fit.launch_len gives them, and the plugin checks
    # the selected runs against it at collection (fit.check).
    named = settings.served_model_name if given(settings, "served_model_name") else ""
    keys = [run.key for run in runs]
    context = launch_len(settings, planned or keys)
    elsewhere = replace(
        how, served_model_name=named, min_model_len=need, min_model_len_why=why,
        shorten=lambda context: fit.shorten(settings, keys, context),
    )  # fmt: skip

    def replica(index: int) -> Reach:
        """A replica's own log, beside the others: server-<mode>-r<N>.log."""
        return replace(how, log_path=run_dir / f"server-{mode.name}-r{index + 1}.log")

    if mode.cache:
        if not runs:
            raise ServerError(f"the {mode.name} server is sized for the workload of its runs, and none is planned")
        workload = runs[0].workload  # every run of a small-cache server sends its family's workload
        try:
            sized = offload_sizes(settings, model, workload)
        except OffloadSizeError as err:
            raise ServerError(
                f"{err}; give the sizes instead (--apc-set offload_gpu_blocks and --apc-set offload_tier_gib)"
            ) from err
        # vLLM refuses a GPU cache smaller than one request of --max-model-len: the offload case's own length.
        server = launched_server(
            mode, settings, model, how, tensor_parallel=tensor_parallel_size(settings), extra=sized.server_args(mode),
            model_len=room_for(request_tokens(workload)),
        )  # fmt: skip
        server.info.offload = sized.as_dict()
        return server
    if mode.fleet == EXTERNAL_FLEET:
        # The replicas' own credential: the gateway's key need not open a pod's /v1/models.
        pods = elsewhere
        if settings.replica_api_key:
            pods = replace(elsewhere, api_key=settings.replica_api_key, key_option="--apc-set replica_api_key")
        replicas: list[Endpoint] = [
            ExternalServer(mode, replace(pods, log_path=replica(i).log_path), url)
            for i, url in enumerate(settings.metrics_url)
        ]
        gateway = http_session(settings.api_key, settings.ca_bundle)
        return Fleet(
            mode, replicas, url=settings.fleet_url, log_path=replicas[0].log_path, progress=progress, gateway=gateway
        )
    url = external_url(mode, settings)
    if url:
        external = ExternalServer(mode, elsewhere, url)
        external.info.batch_invariant = settings.batch_invariant == "on"  # declared: its environment is not ours
        return external
    if mode.fleet == "router":
        gpus = replica_gpus(settings)
        replicas = [
            launched_server(
                mode, settings, model, replica(i), tensor_parallel=gpus[i][1], env_extra=gpus[i][0], model_len=context
            )
            for i in range(settings.replicas)
        ]
        router = Router(
            settings.router_command,
            settings.router_arg,
            bind_host=settings.host,
            connect_host=settings.connect_host,
            log_path=run_dir / f"router-{mode.name}.log",
            env=dict(os.environ),
            startup_timeout=min(settings.startup_timeout, 120.0),
            stop_timeout=settings.stop_timeout,
        )
        return Fleet(mode, replicas, router=router, log_path=router.log_path, progress=progress)
    if mode.fleet == DATA_PARALLEL:
        # Each rank gets its share of the GPUs: D ranks x TP = the visible GPUs (or --apc-tensor-parallel-size).
        ranks = settings.data_parallel_size
        tp = settings.tensor_parallel_size or max(1, tensor_parallel_size(settings) // ranks)
        extra = ("--data-parallel-size", str(ranks))
        ranks_cores = cpu_core_chunks(settings, ranks)  # vLLM gives rank r the r-th "|"-separated list
        binding = {"VLLM_CPU_OMP_THREADS_BIND": "|".join(ranks_cores)} if ranks_cores else {}
        return launched_server(
            mode, settings, model, how, tensor_parallel=tp, extra=extra, env_extra=binding, model_len=context
        )
    return launched_server(
        mode, settings, model, how, tensor_parallel=tensor_parallel_size(settings), model_len=context
    )


def launched_server(
    mode: ServerMode,
    settings: Settings,
    model: str,
    how: Reach,
    *,
    tensor_parallel: int,
    extra: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
    model_len: int = 0,
) -> LaunchedServer:
    """One vLLM server of ``mode`` that pytest-apc starts (alone, as a data-parallel server or a replica)."""
    if not model:
        raise ServerError(
            f"no model to launch the {mode.name} server with: --apc-tokenizer alone measures servers run elsewhere "
            "(--apc-url-on and --apc-url-off, --apc-fleet-url); give --apc-model (or --apc-model-shape) to launch"
        )
    invariant = settings.batch_invariant == "on"
    env = {**server_env(settings.profile or "", settings.api_key, invariant), **(env_extra or {})}

    def command(port: int) -> list[str]:
        return build_command(
            settings.server_command,
            model=model,
            served_model_name=settings.served_model_name,
            host=settings.host,
            port=port,
            mode=mode,
            max_model_len=model_len or launch_len(settings),
            tensor_parallel_size=tensor_parallel,
            extra=model_args(settings) + extra + tuple(settings.server_arg),
            launcher=settings.launcher,
            env_names=own_variables(env),
            python=server_python(settings),
        )

    server = LaunchedServer(
        mode,
        command,
        how,
        bind_host=settings.host,
        connect_host=settings.connect_host,
        env=env,
        stop_timeout=settings.stop_timeout,
    )
    if settings.launcher and not any(ENV_PLACEHOLDER.match(part) for part in settings.launcher):
        server.reset_hint = (
            "; it was started through --apc-launcher without {env}: a launcher that starts it in an environment "
            "of its own (a container) must pass the plugin's variables on, e.g. 'docker run {env} ...'"
        )
    return server


# vLLM's CPU build computes float32 the same whatever the batch: a request's answer under load is then
# the answer it gets alone, cached or not, so the answers verdict can require every request identical. Its
# default there, bfloat16, parts 1 or 2 requests of 30 between two uncached runs at concurrency 8.
EXACT_DTYPE = "float32"
CPU_EXACT_DTYPE = ("--dtype", EXACT_DTYPE)


def model_args(settings: Settings) -> tuple[str, ...]:
    """How a launched server loads its model: a shape model's random weights through the plugin's own load
    format, whose answers depend on the prompt (vllm_loader.py); on CPU in float32 (``CPU_EXACT_DTYPE``),
    unless ``--apc-server-arg`` names a ``--dtype``. A GPU server loads a model of the user's as configured."""
    args: tuple[str, ...] = ("--load-format", LOAD_FORMAT) if settings.model_shape else ()
    asks_dtype = any(arg == "--dtype" or arg.startswith("--dtype=") for arg in settings.server_arg)
    if settings.profile == "cpu" and not asks_dtype:
        args += CPU_EXACT_DTYPE
    return args


def replica_gpus(settings: Settings) -> list[tuple[dict[str, str], int]]:
    """(environment, tensor-parallel size) of each launched replica: on a GPU node each gets its own GPUs
    (an equal share of the visible ones, or --apc-tensor-parallel-size each); on CPU each its own cores."""
    count = settings.replicas
    if settings.profile == "gpu":
        gpus = visible_gpus()
        per = settings.tensor_parallel_size or max(1, len(gpus) // count)
        if per * count > len(gpus):
            raise ServerError(
                f"{count} replicas x tensor parallel {per} need {per * count} GPUs, {len(gpus)} are visible "
                "(--apc-set replicas, --apc-tensor-parallel-size, CUDA_VISIBLE_DEVICES)"
            )
        return [({"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * per : (i + 1) * per])}, per) for i in range(count)]
    chunks = cpu_core_chunks(settings, count)
    if chunks:
        return [({"VLLM_CPU_OMP_THREADS_BIND": chunk}, 1) for chunk in chunks]
    return [({}, tensor_parallel_size(settings)) for _ in range(count)]


def cpu_core_chunks(settings: Settings, count: int) -> list[str]:
    """On the CPU build, ``count`` disjoint core lists ("0", "1" or "0,1", ...) for that many replicas or
    data-parallel ranks: vLLM's automatic binding puts every server and rank of a one-NUMA-node machine
    on the same cores. [] where it does not apply (GPU, or VLLM_CPU_OMP_THREADS_BIND set by the user)."""
    if settings.profile != "cpu" or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return []
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // count)
    chunks = [cores[(i * per) % len(cores) : (i * per) % len(cores) + per] for i in range(count)]
    return [",".join(map(str, chunk)) for chunk in chunks]


def external_url(mode: ServerMode, settings: Settings) -> str:
    """The URL of a server run elsewhere for this mode, or "" to launch one (hash-algorithm servers, the
    offload case's and fleets always are; an external fleet is --apc-fleet-url)."""
    if mode.hash_algo or mode.fleet or mode.cache:
        return ""
    return settings.url_on if mode.apc else settings.url_off


def external_context(settings: Settings, modes: Iterable[ServerMode]) -> fit.Context | None:
    """The shortest context of the servers run elsewhere that serve ``modes``, as each one's ``/v1/models``
    lists it (vLLM's ``max_model_len`` of the served model): asked once, before anything is measured, so that
    the runs on them are fitted like those on launched servers. None when none says (not reachable yet,
    another server): their readiness checks the context again."""
    found: list[fit.Context] = []
    for mode in modes:
        if mode.fleet == EXTERNAL_FLEET:  # the replicas' own credential, as at readiness
            urls, key = settings.metrics_url, settings.replica_api_key or settings.api_key
        else:
            urls, key = (external_url(mode, settings),), settings.api_key
        for url in filter(None, urls):
            tokens = served_max_model_len(http_session(key, settings.ca_bundle), url, settings)
            if tokens:
                found.append(fit.Context(tokens, f"max_model_len {tokens} in /v1/models of {url}"))
    return min(found, key=lambda context: context.tokens) if found else None


def served_max_model_len(http: Any, url: str, settings: Settings) -> int | None:
    """``max_model_len`` of the model a server serves (--apc-set served_model_name, else its only one) in its
    ``/v1/models``; None when it does not answer or does not say."""
    try:
        models = http.get(f"{url}/v1/models", timeout=5).json().get("data") or []
    except Exception:  # noqa: BLE001 - not up yet, or not an OpenAI server: its readiness says which
        return None
    named = settings.served_model_name if given(settings, "served_model_name") else ""
    entries = [m for m in models if isinstance(m, dict) and (m.get("id") == named or (not named and len(models) == 1))]
    tokens = entries[0].get("max_model_len") if entries else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def offload_sizes(settings: Settings, model: str, workload: Workload) -> OffloadSizes:
    """The GPU cache and CPU tier of the small-cache servers of ``workload``'s family (the offload case's, or
    the multi-turn case's, sized for its conversations: offload.py), from the model's config. The sizes given
    by --apc-set offload_gpu_blocks / offload_tier_gib are the offload case's alone."""
    multiturn = workload.family == "multiturn"
    return offload.sizes(
        workload, offload.model_config(model), tuple(settings.server_arg), TEMPLATE_HEADROOM,
        gpu_blocks=0 if multiturn else settings.offload_gpu_blocks,
        tier_gib=0.0 if multiturn else settings.offload_tier_gib,
        outputs=settings.multiturn_turns if multiturn else 1,
        default_block_size=offload.DEFAULT_BLOCK_SIZE["cpu" if settings.profile == "cpu" else "gpu"],
    )  # fmt: skip


def given(settings: Settings, name: str) -> bool:
    """Whether the user set ``name`` (rather than its default applying)."""
    return settings.sources.get(name, "default") != "default"


def context_needed(runs: Sequence[PlannedRun]) -> tuple[int, str]:
    """The context the longest request of ``runs`` needs: its prompt and output plus TEMPLATE_HEADROOM for
    the chat template (the room launched servers get), and how that adds up, in words; (0, "") for none."""
    if not runs:
        return 0, ""
    longest = max(runs, key=lambda run: fit.request_tokens(run.workload))
    return fit.need(longest.workload), f"run {longest.key.id}: {fit.need_in_words(longest.workload)}"


def server_python(settings: Settings) -> str:
    """What ``{python}`` stands for in the server command: --apc-set server_python; else, behind a launcher (a
    container has an interpreter of its own), ``python3``; else this interpreter."""
    return settings.server_python or ("python3" if settings.launcher else sys.executable)


def tensor_parallel_size(settings: Settings) -> int:
    """--apc-tensor-parallel-size, else on a GPU node every visible GPU."""
    if settings.tensor_parallel_size:
        return settings.tensor_parallel_size
    if settings.profile != "gpu":
        return 1
    return max(1, len(visible_gpus()))


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU nvidia-smi lists."""
    named = cuda_visible_devices()
    if named is not None:
        return named
    return [str(i) for i in range(len(gpu_memory_used_mib() or []))]


def served_model(settings: Settings, progress: Callable[[str], None]) -> str:
    """What the launched servers load: the configured model, or a generated one (made once, cached)."""
    if settings.model_shape:
        from pytest_apc.workload.models import ensure_shape_model

        return str(ensure_shape_model(settings.model_shape))
    if settings.profile == "cpu" and not settings.model:
        from pytest_apc.workload.models import ensure_tiny_model, tiny_model_cached

        if not tiny_model_cached():
            progress("generating the tiny CPU model (cached after the first run)")
        return str(ensure_tiny_model())
    return settings.model
