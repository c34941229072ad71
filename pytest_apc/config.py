"""Every pytest-apc setting, declared once, resolved once.

The settings a user needs (group :data:`MAIN`) each exist as a command-line option (``--apc-x``), an ini key
(``apc_x``) and an environment variable (``PYTEST_APC_X``); every other one is given by name: ``--apc-set x=V``
(repeatable), lines ``x=V`` of the ini key ``apc_set``, words ``x=V`` of ``PYTEST_APC_SET``. Its old names are
refused with the new spelling (:func:`renamed`). One precedence applies to all of them:

    command line  >  environment  >  ini file  >  profile default (--gpu-node / --cpu-node)  >  default

Values are validated here, and an invalid one stops pytest with a single line that names the setting,
the value and where it came from. The result is one frozen :class:`Settings` object, whose typed fields
are the declarations: the table of :class:`Spec` that options, resolution and docs use is derived from them.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import pytest

PROFILES = ("gpu", "cpu")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
# Routes of the fleet case (``RunKey.route``): vllm-router's policies (one launched fleet serves them all),
# and two that are not.
ROUTER_POLICIES = (
    "round_robin", "random", "cache_aware", "consistent_hash", "power_of_two", "sticky_least_loaded", "kv_aware",
)  # fmt: skip
DATA_PARALLEL = "dp"  # one vLLM server with --data-parallel-size: its own balancer
# A router or gateway run elsewhere (--apc-fleet-url): the default of its route label (--apc-set route_label). Any
# route that is neither a router policy nor DATA_PARALLEL is an external fleet's label.
EXTERNAL_FLEET = "external"
# Bind addresses meaning "every interface"; clients reach such a server on the loopback address.
WILDCARD_HOSTS = ("0.0.0.0", "::")
# The CPU default scales every workload length by this factor: 32768 -> 2048.
CPU_LENGTH_SCALE = 1 / 16

T = TypeVar("T")
N = TypeVar("N", int, float)


MAIN = "main"
# The groups of the settings set by name (--apc-set NAME=VALUE), in the order `pytest-apc settings` lists them.
GROUPS = {
    MAIN: "Options (each also an ini key apc_NAME and an environment variable PYTEST_APC_NAME)",
    "thresholds": "Verdict thresholds (what a pass requires)",
    "workload": "Workload (prompts, lengths, concurrency levels)",
    "server": "Servers (launch, reach, timeouts)",
    "output": "Results files and the baseline gate",
    "fleet": "Fleet tests (-m fleet)",
    "offload": "Offload tests (-m offload)",
    "multiturn": "Multi-turn tests (-m multiturn)",
}
SET_OPTION = "--apc-set"  # NAME=VALUE, repeatable: every setting not in MAIN
SET_INI = "apc_set"  # one NAME=VALUE per line
SET_ENV = "PYTEST_APC_SET"  # shell-quoted NAME=VALUE words


class SettingError(ValueError):
    """An invalid setting; the message names the setting, the value and its source."""


def number(kind: type[N], *, low: N, low_open: bool = False, high: N | None = None) -> Callable[[str], N]:
    """A parser for a ``kind`` number of at least ``low`` (above it when ``low_open``) and at most ``high``;
    what it refuses, it names in words (``must be an integer >= 2``), never in Python's."""
    if high is not None:
        wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
    elif kind is int and low == 1 and not low_open:
        wanted = "a positive integer"
    else:
        wanted = f"{'>' if low_open else '>='} {low:g}"
    # For text that is no number at all: the kind too.
    a_kind = wanted if wanted.startswith("a ") else f"{'an integer' if kind is int else 'a number'} {wanted}"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"must be {a_kind}") from None
        # Phrased as what is allowed so that NaN, which compares false with everything, is refused.
        if not ((low < value if low_open else low <= value) and (high is None or value <= high)):
            raise ValueError(f"must be {wanted}")
        return value

    return parse


_positive_int = number(int, low=1)
_non_negative_int = number(int, low=0)
_positive_float = number(float, low=0, low_open=True)
_fraction = number(float, low=0, low_open=True, high=1)
_fraction_or_zero = number(float, low=0, high=1)


# "Concurrency up to which a gain must hold" (low_concurrency, pure_gain_concurrency, multiturn_gain_concurrency):
# 0 at no level, ALL_LEVELS at every level.
ALL_LEVELS = "all"
NO_LEVEL: int | str = 0  # typed as the settings are, for their declarations


def _levels_up_to(text: str) -> int | str:
    if text.strip() == ALL_LEVELS:
        return ALL_LEVELS
    if text.strip() == "-1":  # pure_gain_concurrency's old "at no level", before one convention for all three
        raise ValueError("-1 no longer means no level: 0 is no level, all is every level")
    try:
        return _non_negative_int(text)
    except ValueError:
        raise ValueError("must be an integer >= 0 (0: no level) or all (every level)") from None


def gain_required(limit: int | str, concurrency: int) -> bool:
    """Whether a "concurrency up to which a gain must hold" setting (``limit``) requires the gain at
    ``concurrency``: never at 0, always at :data:`ALL_LEVELS`."""
    return limit == ALL_LEVELS or concurrency <= int(limit)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(_positive_int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise ValueError("each value must be a positive integer (a comma-separated list, e.g. 1,8)") from None
    if not values:
        raise ValueError("must list at least one positive integer")
    if len(set(values)) != len(values):
        raise ValueError("must not repeat a value")
    return values


def _names(what: str, choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """A parser for a comma- or space-separated list of ``what``, each one of ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(part for part in text.replace(",", " ").split())
        for value in values:
            if value not in choices:
                raise ValueError(f"unknown {what} {value!r} (choose from {', '.join(choices)})")
        return values

    return parse


_hash_algos = _names("hash algorithm", HASH_ALGOS)


def _router_policies(text: str) -> tuple[str, ...]:
    """Each policy once (one run per policy), in the order given."""
    return tuple(dict.fromkeys(_names("vllm-router policy", ROUTER_POLICIES)(text)))


def _route_label(text: str) -> str:
    """An external fleet's route: a word of the run id (R-c8-<label>) that no other route has."""
    if not re.fullmatch(r"[a-z0-9_]{1,40}", text):
        raise ValueError("must be 1 to 40 lower-case letters, digits or _ (it becomes part of the run id)")
    if text in ROUTER_POLICIES or text == DATA_PARALLEL:
        other = "vLLM's data-parallel route" if text == DATA_PARALLEL else "a vllm-router policy"
        raise ValueError(f"is the route of {other}, so run ids and baselines could not tell them apart")
    return text


def _profile(text: str) -> str:
    if text not in PROFILES:
        raise ValueError(f"must be one of {', '.join(PROFILES)}")
    return text


def _str(text: str) -> str:
    return text


def _url(text: str) -> str:
    if text and not text.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return text.rstrip("/")


def _cases(text: str) -> str:
    text = text.replace(",", "").replace(" ", "").upper()
    if not text or any(c not in "CDEF" for c in text):
        raise ValueError("must be letters from CDEF")
    return "".join(sorted(set(text)))


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"must be {' or '.join(choices)}")
        return text

    return parse


def _args(text: str) -> tuple[str, ...]:
    """A shell-quoted command line, split as a shell would."""
    try:
        return tuple(shlex.split(text))
    except ValueError as err:  # shlex's "No closing quotation", "No escaped character"
        raise ValueError(f"must be a shell-quoted command line ({str(err).lower()})") from None


@dataclass(frozen=True)
class Spec:
    """One setting: its name, how to parse it, its defaults and its help text (which is the docs).

    Derived from a :class:`Settings` field declared with :func:`setting`.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str = "VALUE"
    gpu: Any = None  # profile defaults, used when not None
    cpu: Any = None
    repeatable: bool = False  # option may be given several times; ini is a line list
    family: str = ""  # the one case family that reads this setting ("": several, or not a case's)
    group: str = MAIN  # MAIN: an option, ini key and env var of its own; else one of GROUPS, set by --apc-set
    brief: str = ""  # a MAIN setting's one line in --help (the help is the docs)

    @property
    def advanced(self) -> bool:
        """Set by name through --apc-set, PYTEST_APC_SET and apc_set; :attr:`option`, :attr:`ini` and
        :attr:`env` are its names before the rename, refused with the new spelling."""
        return self.group != MAIN

    @property
    def option(self) -> str:
        return "--apc-" + self.name.replace("_", "-")

    @property
    def label(self) -> str:
        """Its name on the command line, as messages give it: ``--apc-model``, ``--apc-set num_prompts``."""
        return f"{SET_OPTION} {self.name}" if self.advanced else self.option

    def spelled(self, value: str) -> str:
        """The setting given ``value`` on the command line: ``--apc-repeats 3``, ``--apc-set seed=1``."""
        return f"{self.label}={value}" if self.advanced else f"{self.option} {value}"

    @property
    def given_as(self) -> str:
        """How one sets it on the command line: ``--apc-model=PATH``, ``--apc-set num_prompts=N``."""
        return f"{self.label}={self.metavar}"

    def shown(self, value: Any) -> str:
        """``value`` as one would give it: a list comma-separated, a command line space-separated; "" for
        none (unset, empty)."""
        if value is None or value == "" or value == ():
            return ""
        if isinstance(value, tuple):
            return (" " if self.parse is _args or self.repeatable else ",").join(map(str, value))
        return str(value)

    @property
    def defaults(self) -> str:
        """The defaults in words, for the help: ``Default: 1800.0 (--cpu-node: 600.0)``, a profile's only
        where it differs; "" when there is none to show (the help says in words what applies then)."""
        profiles = [
            f"{flag}: {self.shown(value) or 'none'}"
            for flag, value in (("--gpu-node", self.gpu), ("--cpu-node", self.cpu))
            if value is not None and value != self.default
        ]
        if not self.shown(self.default) and not profiles:
            return ""
        return f"Default: {self.shown(self.default) or 'none'}" + (f" ({'; '.join(profiles)})" if profiles else "")

    @property
    def described(self) -> str:
        """The help text with the defaults: what ``--help`` and the ini key's help show."""
        return f"{self.help}. {self.defaults}" if self.defaults else self.help

    @property
    def brief_described(self) -> str:
        """``--help``'s line: the brief with the defaults (the help with them where there is no brief)."""
        if not self.brief:
            return self.described
        return f"{self.brief}. {self.defaults}" if self.defaults else self.brief

    @property
    def ini(self) -> str:
        return "apc_" + self.name

    @property
    def env(self) -> str:
        return "PYTEST_APC_" + self.name.upper()


_SPEC = "pytest_apc.setting"  # dataclass field metadata key holding a setting's declaration


@overload
def setting(
    parse: Callable[[str], T],
    default: T,
    help: str,
    metavar: str = "VALUE",
    *,
    gpu: T | None = None,
    cpu: T | None = None,
    family: str = "",
    group: str = "",
    brief: str = "",
) -> T: ...


@overload
def setting(
    parse: Callable[[str], T],
    default: tuple[T, ...],
    help: str,
    metavar: str = "VALUE",
    *,
    repeatable: Literal[True],
    family: str = "",
    group: str = "",
    brief: str = "",
) -> tuple[T, ...]: ...


def setting(
    parse: Callable[[str], Any],
    default: Any,
    help: str,
    metavar: str = "VALUE",
    *,
    gpu: Any = None,
    cpu: Any = None,
    repeatable: bool = False,
    family: str = "",
    group: str = "",
    brief: str = "",
) -> Any:
    """Declare one setting as a :class:`Settings` field, whose name and annotation are the setting's.

    The field gets no dataclass default: :func:`resolve` always passes every value. A repeatable
    setting's ``parse`` applies to each item. ``family``: the case family that alone reads it (the plan
    warns when it is given and no test of that family is selected). ``group``: :data:`MAIN` for a setting
    every user may need (``brief`` is its line in ``--help``), else its group in :data:`GROUPS` (default: the
    family's, else MAIN).
    """
    # A dataclasses.Field, typed by the overloads as the value so that mypy holds ``parse``, ``default``
    # and the profile defaults to the field's annotation.
    declared = {"parse": parse, "default": default, "help": help, "metavar": metavar}
    declared |= {"gpu": gpu, "cpu": cpu, "repeatable": repeatable, "family": family}
    declared |= {"group": group or family or MAIN, "brief": brief}
    return field(metadata={_SPEC: declared})


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one pytest run: one typed field per setting, declared here once.

    Help text follows pytest's rules: capitalised, no final period for a single phrase.
    """

    # First, because type checkers take every setting(...) for a dataclass default.
    sources: dict[str, str]  # setting name -> where its value came from
    profile: str | None = setting(
        _profile,
        None,
        (
            "Where servers come from: gpu (the configured model on this node's GPUs) or "
            "cpu (vLLM's CPU build with a generated tiny model, lengths scaled down). --gpu-node and --cpu-node "
            "are shorthands. Without a profile every APC test is skipped"
        ),
        "gpu|cpu",
        brief="gpu or cpu (--gpu-node, --cpu-node are shorthands)",
    )
    without_profile: str = setting(
        _one_of("skip", "fail"),
        "skip",
        (
            "What the selected APC tests do when no profile is given: skip, or fail the run (exit code 4) so that "
            "a release pipeline that lost --gpu-node goes red instead of green; set it in the pipeline's ini "
            "file or environment"
        ),
        "skip|fail",
        brief="skip or fail (a gate: exit 4) selected APC tests without a profile",
    )
    model: str = setting(
        _str,
        "",
        "Model served by both servers (path or name). GPU default: $MODEL_70B; CPU default: the generated tiny model",
        "PATH",
        cpu="",
        brief="Model both servers serve (a path or a name)",
    )
    model_shape: str = setting(
        _str,  # one of workload.models.SHAPES: workload.plan.check_settings refuses another
        "",
        (
            "Serve a known architecture shape with random weights instead of a model (llama-3.1-8b, "
            "llama-3.1-70b; tiny-32k: the tiny model with the context a 32K model has at the CPU profile's 1/16 "
            "lengths, 2,288 tokens): a generated config and tokenizer, --load-format pytest_apc_dummy (vLLM's "
            "dummy weights, redrawn so that answers depend on the prompt). For validating a node or a vLLM build "
            "before weights are staged; answers are random text but each prompt's own, APC and timing are real"
        ),
        "SHAPE",
        brief="Random weights of a shape: llama-3.1-8b, llama-3.1-70b, tiny-32k",
    )
    tokenizer: str = setting(
        _str,
        "",
        (
            "Tokenizer for the benchmark client (a local path or a Hugging Face name). Default: the model. "
            "Measuring servers run elsewhere (--apc-url-on and --apc-url-off, or --apc-fleet-url) needs only "
            "this, not a model"
        ),
        "PATH",
        brief="Tokenizer of the benchmark (default: the model)",
    )
    served_model_name: str = setting(
        _str,
        "apc-model",
        (
            "Model name the launched servers expose and the benchmark requests. Servers run elsewhere must "
            "serve it; unset, the name their /v1/models lists is taken"
        ),
        "NAME",
        group="server",
    )
    tensor_parallel_size: int = setting(
        _non_negative_int,
        0,
        "Tensor-parallel size of the GPU servers. 0: the number of visible GPUs",
        "N",
        cpu=1,
        brief="GPUs per server (0: every visible GPU)",
    )
    server_arg: tuple[str, ...] = setting(
        _str,
        (),
        (
            "Extra argument appended to both vLLM server command lines after the "
            "plugin's own flags (repeatable; env and ini take a shell-quoted line)"
        ),
        "ARG",
        repeatable=True,
        brief="Extra vLLM server argument (repeatable)",
    )
    server_command: tuple[str, ...] = setting(
        _args,
        ("{python}", "-m", "vllm.entrypoints.openai.api_server"),
        "Command that starts one vLLM OpenAI server; {python} is server_python",
        "CMD",
        group="server",
    )
    launcher: tuple[str, ...] = setting(
        _args,
        (),
        (
            "Command prefix for launching servers (a container runtime, srun, a wrapper script), e.g. "
            "'srun --ntasks=1 --' or 'docker run --rm --gpus all --network host {env} IMAGE'; the server command "
            "follows it. {env} becomes -e NAME for every variable the plugin sets for the server (dev mode for "
            "the cache reset, the API key, a replica's GPUs), {env:FLAG} FLAG NAME: values stay in the "
            "environment, never on a command line"
        ),
        "CMD",
        brief="Prefix that launches servers: srun ..., docker run ...",
    )
    server_python: str = setting(
        _str,
        "",
        (
            "The interpreter {python} stands for in the server command. Default: this interpreter; with "
            "--apc-launcher, python3 (a container has its own; in the launcher itself {python} is this one)"
        ),
        "PATH",
        group="server",
    )
    url_on: str = setting(
        _url,
        "",
        (
            "Validate an APC-on server running elsewhere instead of launching one (readiness and the mode check "
            "still apply; the plugin never stops it; it needs VLLM_SERVER_DEV_MODE=1 for cache resets)"
        ),
        "URL",
        brief="An APC-on server run elsewhere (with --apc-url-off)",
    )
    url_off: str = setting(
        _url,
        "",
        "Validate an APC-off server running elsewhere instead of launching one",
        "URL",
        brief="An APC-off server run elsewhere (with --apc-url-on)",
    )
    api_key: str = setting(
        _str,
        "",
        (
            "API key: given to launched servers as VLLM_API_KEY in their environment (not on their command line) "
            "and sent as a bearer token with every request; redacted from logs, reports and the results file. "
            "Prefer PYTEST_APC_API_KEY: a command-line value is visible to other users in ps"
        ),
        "KEY",
        brief="API key; prefer PYTEST_APC_API_KEY (ps shows options)",
    )
    replica_api_key: str = setting(
        _str,
        "",
        (
            "Fleet tests with --apc-fleet-url: the API key of the replicas (--apc-metrics-url), sent to their "
            "/v1/models (and every other request the plugin sends them), where the gateway gets --apc-api-key. "
            "Default: --apc-api-key. Redacted like it; prefer PYTEST_APC_SET=replica_api_key=KEY"
        ),
        "KEY",
        family="fleet",
    )
    ca_bundle: str = setting(
        _str,
        "",
        (
            "CA bundle (PEM) that verifies the TLS certificates of https:// servers signed by a private CA: used "
            "by every request of the plugin, and given to the benchmark client as SSL_CERT_FILE and "
            "REQUESTS_CA_BUNDLE (vLLM's benchmark sends with aiohttp, which reads SSL_CERT_FILE). It replaces the "
            "default bundle, so it must also hold the public CAs of any host the benchmark reaches over https "
            "(the Hugging Face Hub for a tokenizer by name)"
        ),
        "PATH",
        group="server",
    )
    kv_check: str = setting(
        _one_of("warn", "fail"),
        "warn",
        (
            "When concurrency x prompt blocks exceeds the server's KV-cache blocks: warn (a warning and a line in "
            "the results) or fail (the affected runs fail before measuring)"
        ),
        "warn|fail",
        group="server",
    )
    host: str = setting(_str, "127.0.0.1", "Address the launched servers bind to", "ADDR", group="server")
    connect_host: str = setting(
        _str,
        "",
        (
            "Address the benchmark and the plugin use to reach launched servers. Default: the bind address, "
            "or 127.0.0.1 when the servers bind every interface (0.0.0.0 or ::)"
        ),
        "ADDR",
        group="server",
    )
    startup_timeout: float = setting(
        _positive_float, 1800.0, "Seconds a server may take to become ready", "SECONDS", cpu=600.0, group="server"
    )
    stop_timeout: float = setting(
        _positive_float,
        60.0,
        "Seconds between SIGTERM and SIGKILL when stopping a server",
        "SECONDS",
        cpu=20.0,
        group="server",
    )
    bench_timeout: float = setting(
        _positive_float, 3600.0, "Seconds one benchmark run may take", "SECONDS", cpu=600.0, group="server"
    )
    results_dir: str = setting(
        _str,
        "apc-results",
        "Folder for this run's results (one subfolder per run: results.json, server logs, raw benchmark results)",
        "DIR",
        brief="Folder of the results",
    )
    json: str = setting(
        _str,
        "",
        (
            "Results file, rewritten after every measurement. Default: results.json in "
            "the run's folder under --apc-results-dir"
        ),
        "PATH",
        group="output",
    )
    markdown: str = setting(
        _str,
        "",
        (
            "Markdown summary file. Default: summary.md in the run's folder; also appended to $GITHUB_STEP_SUMMARY "
            "when that is set"
        ),
        "PATH",
        group="output",
    )
    baseline: str = setting(
        _str,
        "",
        (
            "A results.json of an earlier run to compare with (a build you trust, on the same kind of node): a run "
            "whose mean TTFT (median of the cold repeats: each repeat's mean TTFT over its requests, and of those "
            "the median) rose beyond the noise the baseline's calibration (or the profile's default) allows, or "
            "whose cached tokens fell, fails the session"
        ),
        "PATH",
        brief="An earlier results.json to gate this run against",
    )
    resume: str = setting(
        _str,
        "",
        (
            "The run folder of an earlier session to continue (a pre-empted or interrupted job; its results file "
            "is results.json there, or the json setting's): every run that file holds is kept, only the runs it lacks "
            "are measured (a server whose runs are all there is not started) and the merged results are written "
            "there. Refused (exit code 4), naming what differs, when the commit, the pytest-apc version, a "
            "setting that changes what is measured or a server's build (vLLM, model, block size, layout, GPUs) "
            "is not the earlier session's"
        ),
        "DIR",
        brief="An interrupted run's folder to continue: only the runs it lacks are measured",
    )
    stop_after: float = setting(
        number(float, low=0),
        0.0,
        (
            "Seconds after the session started by which it stops measuring (a job with a time limit: give "
            "the limit less the time to stop a server and report): a run, or a server start and its first run, "
            "that could end later is not begun. The estimate is the longest run measured so far of the same case "
            "family and concurrency, else the longest at its concurrency (else of any) scaled by the prompt "
            "tokens the two runs send (the resumed session's runs included), and the servers' mean start-up; "
            "before any run is measured there is none. The runs left fail as not measured, naming the "
            "limit, and --apc-resume on the run folder measures them. 0: no limit"
        ),
        "SECONDS",
        group="server",
    )
    baseline_false_alarm: float = setting(
        _fraction,
        0.01,
        (
            "Probability that the baseline gate fails a run of a build that did not change (split evenly over "
            "the runs it compares)"
        ),
        "FRACTION",
        group="thresholds",
    )
    baseline_repeats: int = setting(
        _positive_int,
        3,
        (
            "Cold repeats of every run when a baseline is given (--apc-repeats, unless set, takes this value), "
            "and the fewest a baseline's runs must have"
        ),
        "N",
        group="output",
    )
    num_prompts: int = setting(_positive_int, 30, "Prompts per benchmark run", "N", group="workload")
    output_len: int = setting(
        _positive_int, 256, "Output tokens per request (before scaling)", "TOKENS", group="workload"
    )
    concurrency: int = setting(_positive_int, 8, "Default --max-concurrency of the six cases", "N", group="workload")
    sweep_concurrency: tuple[int, ...] = setting(
        _int_list, (1, 2, 4, 8), "Concurrency levels of the sweep over cases C-F", "N,N,...", group="workload"
    )
    sweep_cases: str = setting(
        _cases,
        "CDEF",
        (
            "Cases the concurrency sweep covers (a subset of CDEF, e.g. CD when GPU time is short). CPU profile: "
            "CD, as a 2-core machine holds E/F only to not being slower at any level, which their runs at the "
            "default concurrency already judge, and their sweep would take half of the main job's time"
        ),
        "CASES",
        cpu="CD",
        group="workload",
    )
    prefix_len: int = setting(
        _positive_int, 32768, "Shared prefix of the pure cases C/D (before scaling)", "TOKENS", group="workload"
    )
    suffix_len: int = setting(
        _positive_int, 1024, "Unique suffix of the pure cases C/D (before scaling)", "TOKENS", group="workload"
    )
    rag_prefix_len: int = setting(
        _positive_int, 32000, "Shared prefix of the agent/RAG cases E/F (before scaling)", "TOKENS", group="workload"
    )
    input_len: int = setting(
        _positive_int,
        32768,
        "Unique input of the overhead cases A/B and the suffix of E/F (before scaling)",
        "TOKENS",
        group="workload",
    )
    length_scale: float = setting(
        _fraction,
        1.0,
        "Factor applied to every workload length (the CPU profile uses 1/16: 32768 -> 2048)",
        "FACTOR",
        cpu=CPU_LENGTH_SCALE,
        brief="Factor on every workload length",
    )
    seed: int = setting(
        _non_negative_int, 0, "Seed of the benchmark's prompt generation (same for ON and OFF)", "N", group="workload"
    )
    max_model_len: int = setting(
        _non_negative_int,
        0,
        (
            "The context (--max-model-len) of the servers pytest-apc launches; the selected runs must fit it. 0: "
            "room for the longest selected request and the chat template, within the model's own context"
        ),
        "TOKENS",
        brief="Servers' context (0: what the selected runs need)",
    )
    repeats: int = setting(
        _positive_int,
        1,
        "Cold runs per measurement; their per-request samples are pooled (with --apc-baseline: baseline_repeats)",
        "N",
        brief="Cold repeats per run (with a baseline: baseline_repeats)",
    )
    confidence: float = setting(
        _fraction,
        0.95,
        "Confidence of the bootstrap intervals behind every timing verdict",
        "FRACTION",
        group="thresholds",
    )
    bootstrap_samples: int = setting(
        _positive_int, 2000, "Bootstrap resamples per interval (numpy, seeded)", "N", group="thresholds"
    )
    overhead_tolerance: float = setting(
        _positive_float,
        0.10,
        (
            "How much slower APC on may be than off before A/B, and E/F at higher concurrency, fail: median TTFT "
            "is judged on its bootstrap interval, the benchmark duration on its mean over repeats"
        ),
        "FRACTION",
        cpu=0.50,
        group="thresholds",
    )
    low_concurrency: int | str = setting(
        _levels_up_to,
        cast("int | str", 1),
        (
            "Concurrency up to which E/F must show a significant TTFT gain (above it queueing dominates TTFT, so "
            "the pair is held only to not being slower: median TTFT and duration within overhead_tolerance); "
            "0: at no level; all: every level. On the tiny CPU model attention, which APC saves less of, "
            "dominates E/F's prefill, and its gain at concurrency 1 is within a 2-core machine's noise"
        ),
        "N|all",
        cpu=NO_LEVEL,
        group="thresholds",
    )
    pure_gain_concurrency: int | str = setting(
        _levels_up_to,
        cast("int | str", ALL_LEVELS),
        (
            "Concurrency up to which C/D must show a significant median-TTFT gain (0: at no level; all: every "
            "level). Above it the pair is held to not being slower and the gain is reported"
        ),
        "N|all",
        group="thresholds",
    )
    min_bound_fraction: float = setting(
        _fraction_or_zero,
        0.10,
        (
            "Where a significant TTFT gain is required, it must also come this fraction of the way from 1x to its "
            "bound (the modelled one, else the prefill-token bound), so that a negligible gain such as 1.05x "
            "against 15.9x fails; 0 = report only. The H200 reached 0.34-0.79 (C/D) and 0.54 (E/F at 1). On a "
            "2-core CPU the responses of concurrent requests at times reach the client in one late burst, which "
            "cuts a healthy gain at concurrency 4 or 8 to a fraction of its usual size, so the CPU profile asks "
            "for a fifth as much"
        ),
        "FRACTION",
        cpu=0.02,
        group="thresholds",
    )
    hash_algos: tuple[str, ...] = setting(
        _hash_algos,
        (),
        "Prefix-caching hash algorithms to compare, one APC-on server each (default: only the server's default)",
        "ALGO,...",
        brief="Hash algorithms to compare, e.g. sha256,xxhash",
    )
    # -- fleets: the R case (tests marked fleet) ------------------------------------------------------------
    replicas: int = setting(
        number(int, low=2),
        2,
        "Fleet tests: vLLM replicas launched behind vllm-router (on a GPU node each gets its own GPUs)",
        "N",
        family="fleet",
    )
    router_policies: tuple[str, ...] = setting(
        _router_policies,
        ("round_robin", "consistent_hash"),
        (
            "Fleet tests: vllm-router policies to measure, one run each on the same replicas (router restarted "
            "per policy, every replica's cache reset); empty for none"
        ),
        "POLICY,...",
        family="fleet",
    )
    router_command: tuple[str, ...] = setting(
        _args,
        ("vllm-router",),
        "Fleet tests: command that starts vllm-router (the fleet extra; pip install 'vllm-router>=0.1.17')",
        "CMD",
        family="fleet",
    )
    router_arg: tuple[str, ...] = setting(
        _str,
        (),
        "Fleet tests: extra argument of the launched vllm-router (repeatable)",
        "ARG",
        repeatable=True,
        family="fleet",
    )
    data_parallel_size: int = setting(
        _non_negative_int,
        0,
        "Fleet tests: also measure one vLLM server with --data-parallel-size N (its own balancer); 0: not",
        "N",
        family="fleet",
    )
    prefix_groups: int = setting(
        _positive_int,
        1,
        "Fleet tests: distinct shared prefixes (G), num_prompts / G requests each; must divide the prompts",
        "G",
        family="fleet",
    )
    fleet_url: str = setting(
        _url,
        "",
        (
            "Fleet tests: a router or gateway run elsewhere (Kubernetes, a cloud endpoint) to measure instead of "
            "launching one; needs every replica's --apc-metrics-url"
        ),
        "URL",
        family="fleet",
        group=MAIN,
        brief="Fleet tests: a router or gateway run elsewhere",
    )
    metrics_url: tuple[str, ...] = setting(
        _url,
        (),
        (
            "Fleet tests with --apc-fleet-url: one replica's base URL (pod IP, port-forward), where /metrics, "
            "/health and /reset_prefix_cache answer; once per replica"
        ),
        "URL",
        repeatable=True,
        family="fleet",
        group=MAIN,
        brief="Fleet tests: a replica of --apc-fleet-url (each one)",
    )
    route_label: str = setting(
        _route_label,
        EXTERNAL_FLEET,
        (
            "Fleet tests with --apc-fleet-url: the external fleet's route, named in its run id (R-c8-NAME), the "
            "results and the reports, e.g. the gateway's name: 1 to 40 lower-case letters, digits or _, neither "
            "a vllm-router policy nor dp"
        ),
        "NAME",
        family="fleet",
    )
    fleet_promise: str = setting(
        _one_of("spread", "affinity", "none"),
        "none",
        (
            "Fleet tests with --apc-fleet-url: what the gateway promises, which prefix_locality holds every repeat "
            "to: spread (no replica left idle: every --apc-metrics-url replica serves at least one request), "
            "affinity (every prefix group on one replica: the cold prefills C equal the prefix groups G), or "
            "none (reported only)"
        ),
        "spread|affinity|none",
        family="fleet",
    )
    max_routing_cost: float | None = setting(
        number(float, low=0, high=100),
        None,
        (
            "Fleet tests: the most routing cost (extra prefill tokens, in percent of what APC saves on one "
            "server) a repeat of any fleet run may show, on every route (router policies, dp, an external "
            "fleet); prefix_locality fails above it. Unset: reported only"
        ),
        "PERCENT",
        family="fleet",
        group="thresholds",
    )

    offload_groups: int = setting(
        number(int, low=2),
        4,
        (
            "Offload tests: distinct 32K prefixes (G), num_prompts // G requests each, sent in vLLM's shuffled "
            "order: their working set is what the small GPU cache cannot hold and the CPU tier must"
        ),
        "G",
        family="offload",
    )
    offload_concurrency: tuple[int, ...] = setting(
        _int_list,
        (1, 8),
        (
            "Offload tests: the --max-concurrency levels of cases N and O (at 1 the GPU cache's own hits are "
            "predicted exactly by replaying vLLM's block pool; above it they are reported)"
        ),
        "N,N,...",
        family="offload",
    )
    offload_output_len: int = setting(
        _positive_int,
        64,
        "Offload tests: output tokens per request (short: the case measures the prefill each tier serves)",
        "N",
        family="offload",
    )
    offload_gpu_blocks: int = setting(
        _non_negative_int,
        0,
        (
            "Offload tests: the GPU KV cache of both servers, in blocks (vLLM --num-gpu-blocks-override). 0: one "
            "and a half requests' worth, so that one request fits and the prefix groups do not"
        ),
        "BLOCKS",
        family="offload",
    )
    offload_tier_gib: float = setting(
        number(float, low=0),
        0.0,
        (
            "Offload tests: the CPU tier of case O in GiB (vLLM --kv-offloading-size, pinned host memory). 0: 1.5 x "
            "the working set (every prefix group and every request's own blocks) in the tier's blocks (KV bytes "
            "per token on all tensor-parallel ranks, each block rounded up to a memory page); a smaller one is a "
            "warning that states the tokens short"
        ),
        "GIB",
        family="offload",
    )
    # -- answers: is a cached answer the answer computed without the cache? --------------------------------
    answers_probes: int = setting(
        _positive_int,
        8,
        (
            "Answers: prompts of each run sent again after its last repeat, one at a time and greedy, with top-k "
            "logprobs: on an APC-on server plain (served from the cache the run left) and with a cache_salt of "
            "their own (computed without it); same_answers compares them, and with the APC-off twin's. Not sent "
            "where every request under load is judged against a reference the build computes exactly (vLLM's CPU "
            "build in float32; batch-invariant mode against the salted reference): sent alone, the prompts could "
            "only agree. Given, it is sent after every run"
        ),
        "N",
        cpu=4,
        group="thresholds",
    )
    answers_tokens: int = setting(
        _positive_int,
        32,
        (
            "Answers: tokens of each answer that are compared: each probed answer generates this many, and of "
            "each benchmark request's answer kept with its logprobs (answers_logprobs) the first this many are "
            "judged by the near-tie rule (a wrong cache shows within the first few; two correct computations "
            "drift further apart the longer they generate)"
        ),
        "TOKENS",
        cpu=16,
        group="thresholds",
    )
    answers_top_k: int = setting(
        number(int, low=1, high=20),
        5,
        (
            "Answers: two answers that part at a token still agree when each one's token is among the other's "
            "top-k there (a near tie that floating-point noise may break either way, vLLM's own rule); the "
            "comparison stops at that token"
        ),
        "K",
        group="thresholds",
    )

    answers_reference: str = setting(
        _one_of("auto", "salted", "twin"),
        "auto",
        (
            "Answers: what every request of an APC-on run (every repeat, under the run's own load) is compared "
            "with. salted: the run sent once more on the same server, each request with a cache_salt of its own "
            "(computed without the cache, at the same concurrency and in the same order; one extra run each); "
            "twin: the same request of the pair's APC-off or no-tier twin. auto: salted where the server runs in "
            "vLLM's batch-invariant mode (exact with itself, not with its twin) and for runs without a twin (fleet "
            "routes, hash-algorithm servers) on an exact build; else the twin, judged where the build is exact "
            "(vLLM's CPU build in float32), reported elsewhere. Multi-turn runs have the probe only"
        ),
        "REFERENCE",
        group="thresholds",
    )
    answers_logprobs: str = setting(
        _one_of("auto", "on", "off"),
        "auto",
        (
            "Answers: every request of a pair's two runs and of the salted reference asks for its tokens as ids "
            "with their top-k logprobs (answers_top_k), kept beside the benchmark's result, so that where the "
            "build is not exact each request answered under load is judged by the near-tie rule against its "
            "salted reference: where the two answers first part, each one's token must be among the other's "
            "top-k. auto: on a build not known to be exact (on an exact one the texts must be identical and need "
            "none). Both runs of a pair carry them, so the pair's timing compares the same work; off keeps them "
            "out of the timed runs, and the requests are then only reported there"
        ),
        "auto|on|off",
        group="thresholds",
    )
    batch_invariant: str = setting(
        _one_of("on", "off"),
        "off",
        (
            "Answers: launch the servers in vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1), where a "
            "request's tokens do not depend on the batch it is computed in: every request answered under load "
            "is then required identical to its salted reference (not with --enforce-eager among the server "
            "arguments: run eagerly, the mode was measured not exact with itself, and the requests are reported). "
            "It changes the kernels the timing runs measure and slows start-up and prefill, so a timing baseline "
            "should not mix the two modes. For servers run elsewhere, on says that they run in this mode"
        ),
        "on|off",
        group="thresholds",
    )

    multiturn_conversations: int = setting(
        _positive_int,
        8,
        (
            "Multiturn tests: conversations (G) that share one global prefix; each round of cases M/L sends one "
            "request per conversation"
        ),
        "G",
        family="multiturn",
    )
    multiturn_turns: int = setting(
        number(int, low=2),
        6,
        "Multiturn tests: turns (T) of every conversation, one benchmark run per turn (a round)",
        "T",
        family="multiturn",
    )
    multiturn_prefix_len: int = setting(
        _positive_int,
        8192,
        (
            "The global prefix of cases L/M (P tokens of text: a system prompt and tool definitions) every "
            "conversation starts with; scaled like the other lengths"
        ),
        "TOKENS",
        group="workload",
    )
    multiturn_user_len: int = setting(
        _positive_int,
        512,
        (
            "The user message of cases L/M (U tokens) each turn adds; scaled like the other lengths. CPU "
            "profile: 2048, 128 tokens after its scale, one KV block of vLLM's CPU build, so that hits grow by "
            "whole blocks turn by turn"
        ),
        "TOKENS",
        cpu=2048,
        group="workload",
    )
    multiturn_reply_len: int = setting(
        _positive_int,
        256,
        (
            "Multiturn tests: the fixed synthetic assistant reply (A tokens) each turn adds to its conversation's "
            "history, in place of what the model generated, so that the next prompt does not depend on it; also "
            "the output tokens each request generates; scaled like the other lengths"
        ),
        "TOKENS",
        family="multiturn",
    )
    multiturn_compact_after: int = setting(
        _positive_int,
        3,
        (
            "Multiturn tests, the compaction run (M-c<N>-compact): after this many turns (K) a conversation's "
            "history is replaced by a short summary after the global prefix; its next turn hits the global "
            "prefix only. Must be below multiturn_turns"
        ),
        "K",
        family="multiturn",
    )
    multiturn_summary_len: int = setting(
        _positive_int,
        256,
        "Multiturn tests: the summary (tokens) that replaces a compacted history; scaled like the other lengths",
        "TOKENS",
        family="multiturn",
    )
    multiturn_gain_concurrency: int | str = setting(
        _levels_up_to,
        cast("int | str", 8),
        (
            "Multiturn tests: concurrency up to which the late turns of M must get their first token "
            "significantly sooner than L's (above it they are held to not being slower, within "
            "overhead_tolerance); 0: at no level; all: every level. CPU profile: 0, as the scaled-down histories leave "
            "the tiny model so little prefill that a 2-core machine's noise covers what the cache saves"
        ),
        "N|all",
        cpu=NO_LEVEL,
        family="multiturn",
        group="thresholds",
    )
    multiturn_concurrency: tuple[int, ...] = setting(
        _int_list,
        (1, 8),
        (
            "Multiturn tests: the --max-concurrency levels of cases M and L (the compaction run uses the "
            "highest); every level is held to the same exact per-turn prediction"
        ),
        "N,N,...",
        family="multiturn",
    )

    @property
    def enabled(self) -> bool:
        return self.profile is not None

    @property
    def model_label(self) -> str:
        """What the servers will serve, in words, before the model exists on disk."""
        if self.model:
            return model_path_for_display(self.model)
        if self.model_shape:
            return f"generated {self.model_shape}-shaped model (random weights)"
        if self.profile == "gpu":
            return f"served elsewhere (tokenizer {model_path_for_display(self.tokenizer)})"
        return "generated tiny model"

    def given(self, name: str) -> bool:
        """Whether the user set ``name`` (command line, environment or ini file), not a default."""
        return not self.sources.get(name, "default").endswith("default")

    def scaled(self, tokens: int) -> int:
        """A workload length after ``length_scale``; never below one token."""
        return max(1, round(tokens * self.length_scale))

    def as_dict(self) -> dict[str, Any]:
        """Every setting's value by name, in declaration order (without ``sources``)."""
        return {spec.name: getattr(self, spec.name) for spec in SPECS}


# The settings table, in declaration order, for the options, the resolution and the docs.
SPECS: tuple[Spec, ...] = tuple(Spec(f.name, **f.metadata[_SPEC]) for f in fields(Settings) if _SPEC in f.metadata)
SPEC_BY_NAME = {spec.name: spec for spec in SPECS}


def add_options(parser: pytest.Parser, title: str) -> None:
    """Declare the :data:`MAIN` settings as options and ini keys (no option defaults: None means not given),
    ``--apc-set`` and ``apc_set`` for every other one, and each other one's old option, hidden, so that
    :func:`resolve` can name its new spelling. ``title``: the option group's heading."""
    group = parser.getgroup("apc", title)
    group.addoption(
        "--gpu-node", action="store_const", const="gpu", dest="apc_profile", help="Same as --apc-profile=gpu"
    )
    group.addoption(
        "--cpu-node", action="store_const", const="cpu", dest="apc_profile", help="Same as --apc-profile=cpu"
    )
    for spec in SPECS:
        if spec.advanced:  # renamed: given, it is refused with the new spelling
            group.addoption(spec.option, action="append", dest=spec.ini, help=argparse.SUPPRESS)
            continue
        brief = spec.brief_described
        help_text = brief.replace("%", "%%")  # argparse formats %
        if spec.repeatable:
            group.addoption(spec.option, action="append", dest=spec.ini, metavar=spec.metavar, help=help_text)
            parser.addini(spec.ini, brief, type="args")
        else:
            group.addoption(spec.option, dest=spec.ini, metavar=spec.metavar, help=help_text)
            parser.addini(spec.ini, brief, type="string", default="")
    group.addoption(
        SET_OPTION,
        action="append",
        dest=SET_INI,
        metavar="NAME=VALUE",
        help="Any other setting (repeatable); pytest-apc settings lists them",
    )
    parser.addini(SET_INI, f"Other settings, NAME=VALUE per line ({SET_OPTION}; pytest-apc settings)", "linelist")


def _ini_file(config: pytest.Config) -> dict[str, Any]:
    """What the ini file sets, by key. pytest 9 keeps it privately (its ``inicfg`` is deprecated), 8 publicly."""
    found = getattr(config, "_inicfg", None)
    return dict(found if found is not None else getattr(config, "inicfg", {}))


def renamed(config: pytest.Config, environ: Mapping[str, str]) -> str | None:
    """The one-line message for a setting given by its name before the rename (option, environment
    variable, ini key), with its new spelling; None when none is."""
    ini = _ini_file(config)
    for spec in SPECS:
        if not spec.advanced:
            continue
        given = config.getoption(spec.ini, default=None)
        if given:
            return f"{spec.option} was renamed: use {SET_OPTION} {shlex.quote(f'{spec.name}={given[-1]}')}"
        if environ.get(spec.env, "") != "":
            value = shlex.quote(f"{spec.name}={environ[spec.env]}")
            return f"{spec.env} was renamed: use {SET_ENV}={shlex.quote(value)}"
        if spec.ini in ini:
            value = getattr(ini[spec.ini], "value", ini[spec.ini])  # pytest 9 wraps it in a ConfigValue
            value = " ".join(value) if isinstance(value, list) else value
            return f"ini key {spec.ini} was renamed: use the line {spec.name}={value} in {SET_INI}"
    return None


def _pairs(items: Sequence[str], where: str) -> dict[str, list[str]]:
    """NAME=VALUE items by setting name, each value as given (a repeatable setting's values in order)."""
    found: dict[str, list[str]] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals:
            raise SettingError(f"{where}: {item!r} is not NAME=VALUE")
        spec = SPEC_BY_NAME.get(name)
        if spec is None or not spec.advanced:
            names = [s.name for s in SPECS if s.advanced]
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; close: {', '.join(close)}" if close else "; pytest-apc settings lists them"
            if spec is not None:
                hint = f": it is an option of its own, {spec.option}"
            raise SettingError(f"{where}: unknown setting {name!r}{hint}")
        found.setdefault(name, []).append(value.strip())
    return found


def _given_by_name(config: pytest.Config, environ: Mapping[str, str]) -> list[tuple[dict[str, list[str]], str]]:
    """The settings given by name, by precedence: option, environment, ini file; each with its source."""
    try:
        from_env = shlex.split(environ.get(SET_ENV, ""))
    except ValueError as err:
        raise SettingError(f"environment variable {SET_ENV}: not shell-quoted ({str(err).lower()})") from None
    ini_lines = [line for line in config.getini(SET_INI) if line.strip() and not line.lstrip().startswith("#")]
    return [
        (_pairs(config.getoption(SET_INI, default=None) or [], f"option {SET_OPTION}"), f"option {SET_OPTION}"),
        (_pairs(from_env, f"environment variable {SET_ENV}"), f"environment variable {SET_ENV}"),
        (_pairs(ini_lines, f"ini key {SET_INI}"), f"ini key {SET_INI}"),
    ]


def _raw(
    spec: Spec, config: pytest.Config, environ: Mapping[str, str], by_name: list[tuple[dict[str, list[str]], str]]
) -> tuple[Any, str] | None:
    """The value as given and where it came from, by precedence; None when nobody set it."""
    if spec.advanced:
        for given, where in by_name:
            if spec.name in given:
                values = given[spec.name]
                if not spec.repeatable:
                    return values[-1], where  # the last, as an option given twice
                # an option's values one by one; environment or ini values are shell-quoted lines
                return (values if where.startswith("option") else " ".join(values)), where
        return None
    cli = config.getoption(spec.ini, default=None)
    if cli not in (None, []):
        return cli, f"option {spec.option}"
    if environ.get(spec.env, "") != "":
        return environ[spec.env], f"environment variable {spec.env}"
    ini = config.getini(spec.ini)
    if ini not in ("", [], None):
        return ini, f"ini key {spec.ini}"
    return None


def _convert(spec: Spec, raw: Any, where: str) -> Any:
    try:
        if spec.repeatable:
            items = _args(raw) if isinstance(raw, str) else list(raw)
            return tuple(spec.parse(item) for item in items)
        if spec.parse in (_args,) and not isinstance(raw, str):
            return tuple(raw)
        return spec.parse(str(raw))
    except ValueError as err:
        raise SettingError(f"Invalid {spec.ini} {raw!r} from {where}: {err}") from err


def _profile_default(spec: Spec, profile: str | None) -> Any:
    return getattr(spec, profile) if profile in PROFILES else None


def default_for(name: str, profile: str | None) -> Any:
    """The value a setting takes when nobody set it: the profile's default, else the default."""
    spec = SPEC_BY_NAME[name]
    profile_default = _profile_default(spec, profile)
    return profile_default if profile_default is not None else spec.default


def resolve(config: pytest.Config, environ: dict[str, str] | None = None) -> Settings:
    """Resolve every setting with the one precedence, then apply cross-setting checks."""
    env = dict(os.environ if environ is None else environ)
    message = renamed(config, env)
    if message:
        raise SettingError(message)
    by_name = _given_by_name(config, env)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    profile_raw = _raw(SPEC_BY_NAME["profile"], config, env, by_name)
    profile = _convert(SPEC_BY_NAME["profile"], *profile_raw) if profile_raw else None
    for spec in SPECS:
        given = _raw(spec, config, env, by_name)
        if given is not None:
            values[spec.name] = _convert(spec, *given)
            sources[spec.name] = given[1]
            continue
        values[spec.name] = default_for(spec.name, profile)
        sources[spec.name] = f"{profile} profile default" if _profile_default(spec, profile) is not None else "default"
    values["profile"] = profile
    if profile == "gpu" and not values["model"] and not values["model_shape"]:
        if env.get("MODEL_70B"):
            values["model"] = env["MODEL_70B"]
            sources["model"] = "environment variable MODEL_70B"
        elif not (values["tokenizer"] and measures_elsewhere(values)):
            raise SettingError(
                "No model for --gpu-node: launching servers needs --apc-model PATH (PYTEST_APC_MODEL, ini apc_model "
                "or $MODEL_70B) or --apc-model-shape for random weights; measuring servers run elsewhere "
                "(--apc-url-on and --apc-url-off, or --apc-fleet-url) needs only --apc-tokenizer for the benchmark"
            )
    if values["ca_bundle"] and not Path(values["ca_bundle"]).is_file():
        raise SettingError(f"Invalid apc_ca_bundle {values['ca_bundle']!r} from {sources['ca_bundle']}: no such file")
    if not values["connect_host"]:
        values["connect_host"] = connect_address(values["host"])
        sources["connect_host"] = "derived from apc_host"
    if values["baseline"] and sources["repeats"] == "default":
        # A gated run needs the repeats its rule was measured for (the repeat is the unit of noise).
        values["repeats"] = values["baseline_repeats"]
        sources["repeats"] = "derived from apc_baseline_repeats (a baseline is given)"
    settings = Settings(**values, sources=sources)
    _check_baseline(settings)
    _check_lengths(settings)
    _check_fleet(settings)
    _check_multiturn(settings)
    return settings


def measures_elsewhere(values: dict[str, Any]) -> bool:
    """Whether servers run elsewhere are given: both single servers, or a fleet. Tests that still need a
    launched server (hash algorithms, fleets without --apc-fleet-url, A-F without both URLs) fail their
    runs naming the missing model."""
    return bool(values["url_on"] and values["url_off"]) or bool(values["fleet_url"])


def connect_address(bind_host: str) -> str:
    """Where a client reaches a server bound to ``bind_host``: a wildcard address is not one to connect to."""
    return "127.0.0.1" if bind_host in WILDCARD_HOSTS else bind_host


def setting_error(settings: Settings, name: str, why: str) -> SettingError:
    """The error for setting ``name``'s resolved value: it names the setting, the value and its source."""
    value = getattr(settings, name)
    return SettingError(f"Invalid {SPEC_BY_NAME[name].ini} {value!r} from {settings.sources[name]}: {why}")


def _check_lengths(settings: Settings) -> None:
    # The workload's own limits (the longest request against --apc-max-model-len) are workload.plan's.
    scale = settings.length_scale
    for name in ("prefix_len", "rag_prefix_len", "input_len", "suffix_len", "output_len"):
        if round(getattr(settings, name) * scale) < 1:
            raise setting_error(settings, name, f"scaled by length_scale {scale} it is below one token")


def _check_baseline(settings: Settings) -> None:
    if settings.baseline and settings.repeats < settings.baseline_repeats:
        raise setting_error(
            settings,
            "repeats",
            f"the baseline gate judges runs of apc_baseline_repeats {settings.baseline_repeats} cold repeats or "
            "more (lower apc_baseline_repeats to gate on fewer, at a wider limit)",
        )


def _check_fleet(settings: Settings) -> None:
    if settings.num_prompts % settings.prefix_groups:
        raise setting_error(
            settings, "prefix_groups", f"it must divide apc_num_prompts {settings.num_prompts} (equal groups)"
        )
    if settings.fleet_url and len(settings.metrics_url) < 2:
        raise setting_error(
            settings, "fleet_url", "a fleet needs the base URL of each of its replicas (--apc-metrics-url, 2 or more)"
        )
    if settings.metrics_url and not settings.fleet_url:
        raise setting_error(settings, "metrics_url", "replica URLs are only read for a fleet given by --apc-fleet-url")
    if settings.offload_groups > settings.num_prompts:
        raise setting_error(
            settings, "offload_groups", f"more prefix groups than apc_num_prompts {settings.num_prompts}"
        )
    if settings.route_label != EXTERNAL_FLEET and not settings.fleet_url:
        raise setting_error(
            settings, "route_label", "it names the route of a fleet given by --apc-fleet-url, and none is given"
        )
    if settings.fleet_promise != "none" and not settings.fleet_url:
        raise setting_error(
            settings,
            "fleet_promise",
            "it is what a gateway given by --apc-fleet-url promises; the router policies' promises are their own",
        )
    if settings.data_parallel_size == 1:
        raise setting_error(
            settings, "data_parallel_size", "one rank is not data parallel (0 skips it, 2 or more measures it)"
        )


def _check_multiturn(settings: Settings) -> None:
    if settings.multiturn_compact_after >= settings.multiturn_turns:
        raise setting_error(
            settings,
            "multiturn_compact_after",
            f"a conversation of apc_multiturn_turns {settings.multiturn_turns} turns is compacted before a later turn",
        )


def flag_value(command: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of ``names`` on a command line (``--flag V`` or ``--flag=V``), as argparse
    keeps the last; None when absent."""
    value = None
    for i, part in enumerate(command):
        for name in names:
            if part == name and i + 1 < len(command):
                value = command[i + 1]
            elif part.startswith(name + "="):
                value = part.split("=", 1)[1]
    return value


def setting_names() -> Sequence[str]:
    """Names of every setting (for the configuration reference and its test)."""
    return [spec.name for spec in SPECS]


def model_path_for_display(path: str) -> str:
    """Short model name for tables: the last path component."""
    return Path(path).name or path
