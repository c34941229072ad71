"""Workloads that fit the model: the context a launched server has (``model_context``, from
``--apc-max-model-len`` or the model's config.json; a server run elsewhere says its own in ``/v1/models``),
the ``--max-model-len`` it is launched with (``launch_len``: the longest *selected* request and room for the
chat template), and how the selected runs are fitted to a context too short for them (``fit_runs``).

Where the user did not set ``--apc-length-scale``, every length is scaled by the largest power-of-two
fraction (1/2, 1/4, ...) at which all selected runs fit: one factor for the whole run, so the cases keep
their ratios, and runs on models of similar contexts compare. Where the user set it, their scale is kept
and the runs that do not fit are skipped, each with the scale at which it would fit. Either way the table
and results.json say so (``Fitted``, results.json's ``fit``). A selection of which nothing fits is refused
in one line with the fix (``check``). Any scale keeps the prediction exact: every workload and its
expected hits are computed from the scaled lengths, after the server's block size is known.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_apc.config import Settings
from pytest_apc.workload.cases import (
    FAMILIES,
    PAIRS,
    RunKey,
    Workload,
    ceil_div,
    workload_for,
)
from pytest_apc.workload.models import LLAMA_31_COMMON, MODEL_CONFIG, SHAPES
from pytest_apc.workload.plan import is_explicit

# Room for the chat template on top of a request's prompt and output, and the step --max-model-len is
# rounded to.
TEMPLATE_HEADROOM = 256
# The config keys that hold a model's context, as vLLM reads them: the smallest one found counts, and a
# model_max_length in the config overrides them.
LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
    "max_seq_length", "seq_len",
)  # fmt: skip
# RoPE scalings whose max_position_embeddings already holds the scaled context (vLLM multiplies the others'
# by their factor, e.g. "linear" and "dynamic").
ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# The step of a suggested --apc-length-scale.
SCALE_STEP = 1000
# How a selection was fitted (``Fitted.rule``): its lengths scaled, or its runs that do not fit skipped.
SCALED, SKIPPED = "scaled", "skipped"
# The most halvings tried before a selection counts as one that no scale fits (1/1024 of every length).
MAX_HALVINGS = 10
# The lengths the scale must leave at one token or more (config's own check of the requested scale).
SCALED_LENGTHS = ("prefix_len", "rag_prefix_len", "input_len", "suffix_len", "output_len")


@dataclass(frozen=True)
class Context:
    """The context of the servers the plugin launches, in tokens, and where it was learned, in words."""

    tokens: int
    source: str


def config_context(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """The context a model's config.json gives (as vLLM derives it when no --max-model-len is given), and
    which key gave it; None when it names none. Multimodal configs keep it in ``text_config``."""
    text = config.get("text_config") or config
    found = {key: text[key] for key in LENGTH_KEYS if isinstance(text.get(key), int)}
    if isinstance(text.get("model_max_length"), int):
        key = "model_max_length"
        tokens = text[key]
    elif found:
        key = min(found, key=lambda name: found[name])
        tokens = found[key]
    else:
        return None
    rope = text.get("rope_scaling") or {}
    kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if isinstance(factor, (int, float)) and factor > 1 and kind not in ALREADY_SCALED:
        return int(tokens * factor), f"{key} {tokens} x rope_scaling factor {factor:g}"
    return tokens, f"{key} {tokens}"


def model_context(settings: Settings) -> Context | None:
    """The context of the servers the plugin launches: --apc-max-model-len when given, else the one the
    model's config gives (a generated model's, or config.json of a model given as a folder); None when it
    is not known before a server starts (a model given by its hub name)."""
    if settings.max_model_len:
        return Context(settings.max_model_len, settings.sources.get("max_model_len") or "--apc-max-model-len")
    if settings.model_shape in SHAPES:
        config, where = {**LLAMA_31_COMMON, **SHAPES[settings.model_shape]}, f"the {settings.model_shape} shape"
    elif settings.profile == "cpu" and not settings.model:
        config, where = MODEL_CONFIG, "the generated tiny model"
    else:
        path = Path(settings.model) / "config.json" if settings.model else None
        if path is None or not path.is_file():
            return None
        try:
            config, where = json.loads(path.read_text()), str(path)
        except (OSError, ValueError):
            return None  # the server says what is wrong with it
    found = config_context(config) if isinstance(config, dict) else None
    return Context(found[0], f"{found[1]} in {where}") if found else None


def request_tokens(workload: Workload) -> int:
    """Prompt and output tokens of one request of ``workload`` (before the chat template)."""
    return workload.prompt_len + workload.output_len


def room_for(tokens: int) -> int:
    """--max-model-len for requests of ``tokens`` (prompt and output) and the chat template, in steps of the
    headroom."""
    return ceil_div(tokens + TEMPLATE_HEADROOM, TEMPLATE_HEADROOM) * TEMPLATE_HEADROOM


def longest(settings: Settings, keys: Iterable[RunKey] = ()) -> tuple[str, Workload]:
    """The run (its id) with the longest request among ``keys``, and its workload; of every family when
    ``keys`` is empty (its id is then the family's)."""
    runs = {key.id: workload_for(key.family, settings) for key in keys}
    if not runs:
        runs = {family: workload_for(family, settings) for family in FAMILIES}
    run = max(sorted(runs), key=lambda name: request_tokens(runs[name]))
    return run, runs[run]


def launch_len(settings: Settings, keys: Iterable[RunKey] = ()) -> int:
    """--max-model-len of a launched server: --apc-max-model-len when given; else room for the longest
    request of the selected runs ``keys`` (every family's when none are given) and the chat template, never
    beyond the model's context. The same on every launched server of a session, so that their runs compare."""
    if settings.max_model_len:
        return settings.max_model_len
    need = room_for(request_tokens(longest(settings, keys)[1]))
    context = model_context(settings)
    return min(need, context.tokens) if context else need


def need(workload: Workload) -> int:
    """The context one request of ``workload`` needs: prompt, output and TEMPLATE_HEADROOM for the chat
    template (what a server run elsewhere is held to at readiness, too)."""
    return request_tokens(workload) + TEMPLATE_HEADROOM


def need_in_words(workload: Workload) -> str:
    """How ``need`` adds up for ``workload``: "prompt 2112 + output 16 + 256 for the chat template"."""
    return f"prompt {workload.prompt_len} + output {workload.output_len} + {TEMPLATE_HEADROOM} for the chat template"


def fitting_scale(settings: Settings, keys: Iterable[RunKey], context: int) -> float | None:
    """The largest --apc-length-scale, in steps of 1/SCALE_STEP, at which every run of ``keys`` fits
    ``context``; None when none does (the output and the template alone need more)."""
    keys = list(keys)
    if not keys:
        return None
    tokens = request_tokens(longest(settings, keys)[1])
    scale = math.floor(settings.length_scale * (context - TEMPLATE_HEADROOM) / tokens * SCALE_STEP)
    for step in range(min(scale, int(settings.length_scale * SCALE_STEP)), 0, -1):
        scaled = replace(settings, length_scale=step / SCALE_STEP)
        if need(longest(scaled, keys)[1]) <= context:
            return step / SCALE_STEP
    return None


def shorten(settings: Settings, keys: Iterable[RunKey], context: int) -> str:
    """How to shorten the workload of ``keys`` so that it fits ``context``: the --apc-length-scale at which it
    does, or the length settings where no scale does."""
    scale = fitting_scale(settings, keys, context)
    if scale is None:
        return (
            "shorten the workload (--apc-length-scale, --apc-set prefix_len, --apc-set input_len, --apc-set output_len)"
        )
    return f"run with --apc-length-scale {scale:g} (every length scaled; the expected hits follow)"


def _pair_of(case: str) -> str:
    """A case with its pair partner, in words ("E/F"); a case without one alone ("R")."""
    if case in PAIRS:
        return f"{PAIRS[case]}/{case}"
    on = [on for on, off in PAIRS.items() if off == case]
    return f"{case}/{on[0]}" if on else case


def check(settings: Settings, keys: Iterable[RunKey], context: Context | None) -> str | None:
    """Why the selected runs ``keys`` (those on servers the plugin launches) do not fit ``context``, in one
    line with the fix: every case too long, its longest request, the context, the --apc-length-scale at
    which all of them fit and the markers that leave them out; None when they fit or the context is unknown."""
    keys = sorted(keys)
    if context is None or not keys:
        return None
    too_long: dict[str, tuple[str, Workload]] = {}  # family -> its longest run
    for key in keys:
        if need(workload_for(key.family, settings)) > context.tokens and key.family not in too_long:
            too_long[key.family] = longest(settings, [k for k in keys if k.family == key.family])
    if not too_long:
        return None
    parts = []
    for family, (run, workload) in sorted(too_long.items(), key=lambda item: -need(item[1][1])):
        cases = sorted({_pair_of(k.case) for k in keys if k.family == family})
        parts.append(f"cases {', '.join(cases)} (run {run}) need {need(workload)} tokens ({need_in_words(workload)})")
    fixes = [shorten(settings, keys, context.tokens), f"leave them out (-m 'not {' and not '.join(sorted(too_long))}')"]
    swept = [k for k in keys if k.concurrency != settings.concurrency and k.case in settings.sweep_cases]
    if any(k.family in too_long for k in swept):
        fixes[-1] += " (the sweep: --apc-set sweep_cases without them)"
    return (
        f"the selected runs do not fit the context of {context.tokens} tokens ({context.source}): "
        f"{'; '.join(parts)}. Fix: {' or '.join(fixes)}"
    )


@dataclass(frozen=True)
class Fitted:
    """How the selected runs were fitted to a ``context`` too short for them (``source``: where it was
    learned): their lengths scaled from the ``requested`` length scale to ``length_scale`` (rule SCALED), or
    the runs that do not fit skipped (rule SKIPPED; ``skipped``: run id -> why). results.json keeps it as
    ``fit`` (``as_dict``), the table shows ``summary``."""

    context: int
    source: str
    rule: str
    requested: float
    length_scale: float
    skipped: dict[str, str] = field(default_factory=dict)
    fix: str = ""  # SKIPPED: how to measure the skipped runs too

    @property
    def factor(self) -> float:
        """What every length was multiplied by on top of the requested scale (1 for SKIPPED)."""
        return self.length_scale / self.requested

    @property
    def summary(self) -> str:
        """The line above the table: "lengths scaled by 1/2 to fit a 2,048-token context (...): ..."."""
        tokens = f"{self.context:,}"
        where = f"{'an' if tokens.startswith(('8', '11,', '18,')) else 'a'} {tokens}-token context ({self.source})"
        if self.rule == SCALED:
            return (
                f"lengths scaled by 1/{round(1 / self.factor)} to fit {where}: length scale "
                f"{self.length_scale:g} in place of {self.requested:g} (set --apc-length-scale to choose one)"
            )
        return (
            f"runs {', '.join(self.skipped)} skipped: longer than {where} at --apc-length-scale "
            f"{self.requested:g}; to measure them: {self.fix}"
        )

    def apply(self, settings: Settings) -> Settings:
        """``settings`` with the lengths this fit measures (the requested ones when it skipped runs)."""
        return replace(settings, length_scale=self.length_scale)

    def as_dict(self) -> dict[str, Any]:
        """results.json's ``fit`` (and the xdist store's): every field and the summary."""
        return {
            "context": self.context, "source": self.source, "rule": self.rule, "requested_length_scale": self.requested,
            "length_scale": self.length_scale, "skipped": dict(self.skipped), "fix": self.fix, "summary": self.summary,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fitted:
        return cls(
            int(data["context"]), str(data["source"]), str(data["rule"]), float(data["requested_length_scale"]),
            float(data["length_scale"]), {str(k): str(v) for k, v in (data.get("skipped") or {}).items()},
            str(data.get("fix") or ""),
        )  # fmt: skip


def _fits(settings: Settings, keys: Sequence[RunKey], context: int) -> bool:
    return all(need(workload_for(key.family, settings)) <= context for key in keys)


def halved_scale(settings: Settings, keys: Sequence[RunKey], context: int) -> float | None:
    """The largest length scale of the form ``settings.length_scale / 2**k`` (k >= 1) at which every run of
    ``keys`` fits ``context`` and every length stays a token or more; None when none does."""
    for halvings in range(1, MAX_HALVINGS + 1):
        scale = settings.length_scale / 2**halvings
        if any(round(getattr(settings, name) * scale) < 1 for name in SCALED_LENGTHS):
            return None
        if _fits(replace(settings, length_scale=scale), keys, context):
            return float(scale)
    return None


class DoesNotFit(ValueError):
    """No run of the selection fits the context: the one-line message of ``check``, with the fix."""


def fit_runs(settings: Settings, keys: Iterable[RunKey], context: Context | None) -> Fitted | None:
    """How the selected runs ``keys`` are fitted to ``context``: None when they fit it (or it is unknown).

    The user did not set --apc-length-scale: every length scaled by the largest power-of-two fraction at
    which all of them fit (SCALED). The user set it: their scale kept, and the runs that do not fit skipped,
    each with the scale at which it would (SKIPPED). Raises DoesNotFit when no scale fits or every run would
    be skipped: nothing could be measured."""
    keys = sorted(keys)
    problem = check(settings, keys, context)
    if problem is None or context is None:
        return None
    if not is_explicit(settings.sources.get("length_scale")):
        scale = halved_scale(settings, keys, context.tokens)
        if scale is None:
            raise DoesNotFit(problem)
        return Fitted(context.tokens, context.source, SCALED, settings.length_scale, scale)
    too_long = [key for key in keys if need(workload_for(key.family, settings)) > context.tokens]
    if len(too_long) == len(keys):
        raise DoesNotFit(problem)
    given = settings.sources.get("length_scale")
    skipped = {
        key.id: (
            f"run {key.id} needs {need(workload_for(key.family, settings)):,} tokens "
            f"({need_in_words(workload_for(key.family, settings))}), more than the {context.tokens:,}-token context "
            f"({context.source}) at --apc-length-scale {settings.length_scale:g} ({given}); to measure it: "
            f"{shorten(settings, [key], context.tokens)}"
        )
        for key in too_long
    }
    fix = shorten(settings, too_long, context.tokens)
    return Fitted(context.tokens, context.source, SKIPPED, settings.length_scale, settings.length_scale, skipped, fix)
