"""Is an answer served from the prefix cache the answer computed without it?

A cache that hands a request the right number of blocks with the wrong content (a block table in the
wrong order, a hash that ignores part of the key, a tier whose loads come back corrupted) passes every
count and every timing verdict. Only the answers show it. The answers probe (``measure/answers.py``) gives
each run a few prompts' greedy answers with their top-k logprobs: cached and uncached on the same APC-on
server, uncached on an APC-off one.

When are two answers the same? Floating-point results depend on how the work was split (a prefix read
from the cache against one computed with the suffix), so two correct answers may part where two tokens are
about equally likely, and differ completely after that. The rule is vLLM's own for its cache tests: walk
both token sequences; at the first token where they part, they still agree when each one's token is among
the other's top-k (a *near tie*), and the comparison stops there; otherwise they *differ*. A cache that
serves wrong content parts from the correct answer at a token the correct computation did not consider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_apc.measure.answers import Answer, Probe, curl_command, request_body
from pytest_apc.measure.records import RunRecord
from pytest_apc.verdicts.pairs import Pair
from pytest_apc.verdicts.verdict import Verdict

IDENTICAL, NEAR_TIE, DIFFER = "identical", "near tie", "differ"
SHOWN_CHARS = 70  # of each text, where two answers are shown side by side


@dataclass(frozen=True)
class Comparison:
    """Two answers to one prompt (request ``index`` of the run): how they compare and where they part."""

    index: int
    outcome: str  # IDENTICAL, NEAR_TIE or DIFFER
    position: int | None = None  # the first token where they part
    tokens: tuple[int, int] | None = None  # the two tokens there
    gap_nats: float | None = None  # a near tie: how far apart the two tokens' logprobs are in the first answer
    texts: tuple[str, str] = ("", "")

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "outcome": self.outcome,
            "position": self.position,
            "tokens": list(self.tokens) if self.tokens else None,
            "gap_nats": self.gap_nats,
        }

    def describe(self, names: tuple[str, str]) -> str:
        if self.outcome == IDENTICAL:
            return f"request {self.index}: identical"
        assert self.position is not None
        assert self.tokens is not None
        at = f"request {self.index}: parts at token {self.position} ({self.tokens[0]} vs {self.tokens[1]})"
        if self.outcome == NEAR_TIE:
            return f"{at}, a near tie (logprobs {self.gap_nats:.3f} nats apart); compared up to there"
        return (
            f"{at}, each token outside the other's top-k: they differ from there on\n"
            f"    {names[0]:>9}: {_shown(self.texts[0])}\n    {names[1]:>9}: {_shown(self.texts[1])}"
        )


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


def compare(index: int, a: Answer, b: Answer) -> Comparison:
    """``a`` against ``b`` by the rule above (each answer's top-k as the probe asked for it)."""
    for position, (token_a, token_b) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if token_a == token_b:
            continue
        top_a = a.top[position] if position < len(a.top) else {}
        top_b = b.top[position] if position < len(b.top) else {}
        tie = token_b in top_a and token_a in top_b
        gap = abs(top_a[token_a] - top_a[token_b]) if tie and token_a in top_a else None
        return Comparison(index, NEAR_TIE if tie else DIFFER, position, (token_a, token_b), gap, (a.text, b.text))
    if len(a.tokens) != len(b.tokens):
        position = min(len(a.tokens), len(b.tokens))
        return Comparison(index, DIFFER, position, (len(a.tokens), len(b.tokens)), None, (a.text, b.text))
    return Comparison(index, IDENTICAL)


def cached_against_uncached(run: RunRecord) -> list[Comparison]:
    """Each probed prompt's cached answer against its uncached one on the same server."""
    return [compare(p.index, p.cached, p.uncached) for p in run.probes if p.cached is not None]


def cached_against(run: RunRecord, reference: RunRecord) -> list[Comparison]:
    """Each probed prompt's cached answer on ``run``'s server against its uncached one on ``reference``'s."""
    theirs = {p.index: p for p in reference.probes}
    return [
        compare(p.index, p.cached, theirs[p.index].uncached)
        for p in run.probes
        if p.cached is not None and p.index in theirs
    ]


def uncached_against(run: RunRecord, reference: RunRecord) -> list[Comparison]:
    """The noise floor: both answers computed without a cache, on two servers."""
    theirs = {p.index: p for p in reference.probes}
    return [compare(p.index, p.uncached, theirs[p.index].uncached) for p in run.probes if p.index in theirs]


def counts(comparisons: list[Comparison]) -> dict[str, int]:
    return {outcome: sum(c.outcome == outcome for c in comparisons) for outcome in (IDENTICAL, NEAR_TIE, DIFFER)}


def benchmark_answers_identical(run: RunRecord, reference: RunRecord) -> tuple[int, int] | None:
    """(identical, compared) of the benchmark's own generated texts, request by request, of the two runs'
    first repeats; None where either kept none. Reported only: requests of one batch are computed together,
    so on GPUs two correct servers' texts part at near ties that no logprob of the benchmark shows."""
    mine = run.repeats[0].bench.get("generated_texts")
    theirs = reference.repeats[0].bench.get("generated_texts")
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    return sum(a == b for a, b in zip(mine, theirs, strict=True)), len(mine)


@dataclass(frozen=True)
class Compared:
    """Every comparison of a run's probed answers, made once: its cached answers against its own uncached
    ones, and, with a reference (the pair's twin), against the twin's uncached ones, and the two servers'
    uncached answers (the noise floor); ``error`` where a probe failed."""

    run: RunRecord
    reference: RunRecord | None
    own: list[Comparison]
    twin: list[Comparison]
    floor: list[Comparison]
    errors: list[str]

    @property
    def judged(self) -> list[Comparison]:
        """What ``same_answers`` judges: the cached answers against the uncached ones, own then the twin's."""
        return self.own + self.twin

    @property
    def cell(self) -> str | None:
        """The answers cell of a report row: ``4/4`` agreeing (near ties included) of the judged comparisons,
        ``1 DIFFER`` when some differ, ``error`` when a probe failed; None without a comparison."""
        if self.errors:
            return "error"
        if not self.judged:
            return None
        found = counts(self.judged)
        if found[DIFFER]:
            return f"{found[DIFFER]} DIFFER"
        return f"{found[IDENTICAL] + found[NEAR_TIE]}/{len(self.judged)}"


def compared(run: RunRecord, reference: RunRecord | None = None) -> Compared:
    """The comparisons of ``run``'s probed answers, and of ``reference``'s where given (see :class:`Compared`)."""
    errors = [f"{r.key.id}: the answers probe failed: {r.probe_error}" for r in (run, reference) if r and r.probe_error]
    if errors:
        return Compared(run, reference, [], [], [], errors)
    twin = cached_against(run, reference) if reference else []
    floor = uncached_against(run, reference) if reference else []
    return Compared(run, reference, cached_against_uncached(run), twin, floor, [])


def same_answers(subject: Pair | RunRecord) -> Verdict:
    """Every probed answer served from the cache agrees with the same prompt's answer computed without it:
    on the same server (a cache_salt of its own), and, for a pair, on its twin (APC off, or no tier).
    Its numbers' ``answers`` is the report row's cell (:attr:`Compared.cell`)."""
    run = subject.on if isinstance(subject, Pair) else subject
    reference = subject.off if isinstance(subject, Pair) else None
    found = compared(run, reference)
    runs = [run.key.id] + ([reference.key.id] if reference else [])
    if found.errors:
        message = "\n".join([*found.errors, _reproduce(run, reference)])
        return Verdict("same_answers", runs, False, message, {"answers": found.cell})
    own, twin, floor = found.own, found.twin, found.floor
    if not own:
        message = f"{run.key.id}: no cached answer was probed (the probe sent nothing to an APC-on server)"
        return Verdict("same_answers", runs, False, message, {"answers": found.cell})
    lines = _section(f"{run.key.id}: cached against uncached on the {run.server.mode} server", own, "uncached")
    judged = found.judged
    bench = benchmark_answers_identical(run, reference) if reference else None
    if reference is not None:
        twin_name = reference.key.id
        lines += _section(f"cached against the {reference.server.mode} server ({twin_name})", twin, twin_name)
        lines.append(_line("uncached against uncached, the two servers (noise floor, reported)", floor))
        if bench:
            lines.append(f"benchmark answers identical to {twin_name}'s: {bench[0]}/{bench[1]} (reported)")
    differ = [c for c in judged if c.outcome == DIFFER]
    if differ:
        lines.append(
            "diagnosis: the cache served content that is not what these prompts compute: a block table, hash "
            "or tier that returns other tokens' KV with the right counts (not floating-point noise: the "
            "tokens are outside each other's top-k)"
        )
        lines.append(_reproduce(run, reference))
    numbers = {
        "probed": len(run.probes),
        "cached_vs_uncached": counts(own),
        "cached_vs_twin": counts(twin) if reference else None,
        "noise_floor": counts(floor) if reference else None,
        "first_divergence": next((c.to_json() for c in judged if c.outcome != IDENTICAL), None),
        "comparisons": [c.to_json() for c in judged],
        "benchmark_identical": bench,
        "answers": found.cell,
    }
    return Verdict("same_answers", runs, not differ, "\n".join(lines), numbers)


def _section(what: str, comparisons: list[Comparison], reference_name: str) -> list[str]:
    """A comparison's summary line, then each answer that was not identical (indented)."""
    details = [c.describe(("cached", reference_name)) for c in comparisons if c.outcome != IDENTICAL]
    return [_line(what, comparisons)] + ["  " + "\n  ".join(d.splitlines()) for d in details]


def _line(what: str, comparisons: list[Comparison]) -> str:
    found = counts(comparisons)
    return f"{what}: {found[IDENTICAL]} identical, {found[NEAR_TIE]} near ties, {found[DIFFER]} differ"


def _reproduce(run: RunRecord, reference: RunRecord | None) -> str:
    """The servers' commands and a probe request to send to each."""
    probe: Probe | None = run.probes[0] if run.probes else None
    lines = ["reproduce:"]
    for r in (run, reference):
        if r is None:
            continue
        lines.append(f"  {r.server.mode} server: {' '.join(r.server.command) or '(not recorded)'}")
    if probe is not None:
        body = request_body(
            run.server.served_model_name or "<served model>",
            f"<request {probe.index} of the run>",
            max_tokens=len(probe.uncached.tokens),
            top_k=max((len(t) for t in probe.uncached.top), default=5),
        )
        lines.append(f"  then, after the run's benchmark (its command: {run.bench_command.splitlines()[0]}):")
        lines.append(f"  {curl_command(run.server.url or '<server>', body)}")
    return "\n".join(lines)
