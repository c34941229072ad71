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

The probe is sent alone, after the run (not where every request is judged exactly, below: there it
could only agree). A cache that goes wrong only while other requests are in flight
(a race) answers the probe right. So every request of every repeat of the APC-on run is also compared with
the same request computed without the cache (the benchmark keeps each request's generated text; every run
of a workload sends the same seeded prompts in the same order), on one of two references:

* the *salted* reference: the run sent once more on the same server, each request with a cache_salt of its
  own, at the same concurrency (``measure/run.py``); its counters must show no hit;
* the pair's *twin*: the same request on the APC-off (or no-tier) server.

Where the build computes the same tokens whatever the batch (*exact*), every one of those requests must be
identical: vLLM's CPU build serving float32 (measured identical cached or not, alone or under load, APC on
or off: the twin is exact too), and vLLM's batch-invariant mode on a GPU (measured identical with itself,
cached or not, alone or under load; the APC-off twin still parts from it, so there only the salted
reference is exact). Elsewhere two correct servers' texts part at near ties under load, which the
benchmark's texts cannot tell from a wrong answer: there they are reported, and the probe's rule judges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_apc.measure.answers import Answer, Probe, curl_command, exact_server, request_body
from pytest_apc.measure.records import Repeat, RunRecord
from pytest_apc.verdicts.pairs import Pair
from pytest_apc.verdicts.verdict import Verdict

IDENTICAL, NEAR_TIE, DIFFER = "identical", "near tie", "differ"
SALTED = "salted"  # the requests' reference: the run once more, each request with a cache_salt of its own
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


def exact_build(run: RunRecord, reference: RunRecord | None = None) -> str | None:
    """Why the servers of ``run`` and ``reference`` give the same tokens for a prompt whatever the batch it is
    computed in (and whichever of them computes it), or None where that is not known: only vLLM's CPU build
    serving float32 is measured exact across two servers (``exact_server``)."""
    servers = [r.server for r in (run, reference) if r is not None]
    found = [exact_server(s, alone=False) for s in servers]
    return found[0] if all(found) else None


def salted_errors(run: RunRecord) -> list[str]:
    """Why ``run``'s salted reference is no reference: it was not counted, or it hit the cache (a server
    that does not keep salted requests apart)."""
    salted = run.salted
    if salted is None:
        return []
    if salted.delta is None or salted.delta.prefix_cache_hits is None:
        why = salted.metrics_error or "no prefix-cache counters were read around it"
        return [f"{run.key.id}: cannot verify that its salted reference was computed without the cache: {why}"]
    if salted.delta.prefix_cache_hits:
        return [
            f"{run.key.id}: its salted reference hit {salted.delta.prefix_cache_hits} cached tokens of "
            f"{salted.delta.prefix_cache_queries}, though every request had a cache_salt of its own: this server "
            "does not keep salted requests apart, so the run has no reference computed without the cache "
            "(--apc-set answers_reference=twin compares with the APC-off twin instead)"
        ]
    return []


@dataclass(frozen=True)
class RequestOutcome:
    """One request of a run's benchmark against the same request of its reference: identical, or where the
    two texts first part (a character offset). Where both requests kept their tokens with top-k logprobs
    (``answers_logprobs``), also the token comparison (:func:`compare`: identical, near tie or differ) and,
    reported only, ``drift_nats``: how far the logprob of a token both answers share moved, at most, before
    they part (on a random-weight model a healthy cache's noise moves them as far as a wrong cache does)."""

    repeat: int
    index: int
    identical: bool
    position: int | None = None
    texts: tuple[str, str] = ("", "")
    tokens: Comparison | None = None
    drift_nats: float | None = None

    def to_json(self) -> dict[str, Any]:
        outcome: dict[str, Any] = {"repeat": self.repeat, "index": self.index, "identical": self.identical}
        if not self.identical:
            outcome |= {"position": self.position, "texts": list(self.texts)}
        if self.tokens is not None:
            outcome |= {"tokens": self.tokens.to_json(), "drift_nats": self.drift_nats}
        return outcome

    @property
    def agrees(self) -> bool:
        """The per-request rule where the build is not exact (vLLM's own, as for the probe): the two answers'
        tokens are the same, or part at a near tie (each one's token among the other's top-k)."""
        return self.tokens is not None and self.tokens.outcome != DIFFER

    def describe(self, names: tuple[str, str]) -> str:
        start = max(0, (self.position or 0) - 10)
        a, b = (t[start:] for t in self.texts)
        where = f"parts at character {self.position}" if not self.identical else "same text"
        c = self.tokens
        if c is not None:
            if c.outcome == IDENTICAL:
                where = "same tokens"
            else:
                apart = c.gap_nats is not None
                gap = f", logprobs {c.gap_nats:.3f} nats apart" if apart else ", outside each other's top-k"
                where = f"parts at token {c.position} ({c.outcome}{gap})"
            where += f"; shared tokens' logprobs moved up to {self.drift_nats or 0.0:.3f} nats"
        return (
            f"repeat {self.repeat + 1}, request {self.index}: {where}\n"
            f"    {names[0]:>9}: {_shown(a)}\n    {names[1]:>9}: {_shown(b)}"
        )


def _parting(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def drift(a: Answer, b: Answer, upto: int) -> float:
    """The largest move of a shared token's logprob between two answers, over their first ``upto`` tokens
    (where they are the same; each one's own logprob, from its top-k)."""
    moved = 0.0
    for position in range(min(upto, len(a.tokens), len(b.tokens), len(a.top), len(b.top))):
        token = a.tokens[position]
        if token != b.tokens[position] or token not in a.top[position] or token not in b.top[position]:
            break
        moved = max(moved, abs(a.top[position][token] - b.top[position][token]))
    return moved


def request_outcome(repeat: int, index: int, a: str, b: str, answers: tuple[Answer, Answer] | None) -> RequestOutcome:
    """One request's texts compared, and its tokens where both kept them."""
    same = a == b
    tokens, moved = None, None
    if answers is not None:
        tokens = compare(index, *answers)
        moved = drift(*answers, tokens.position if tokens.position is not None else len(answers[0].tokens))
    return RequestOutcome(repeat, index, same, None if same else _parting(a, b), (a, b), tokens, moved)


def under_load(run: RunRecord, reference: RunRecord) -> list[RequestOutcome] | None:
    """Every request of every repeat of ``run`` against the same request of ``reference`` (its repeat of the
    same number, else its first): the answers given under the run's own load. None where either benchmark
    kept no texts or their request counts differ."""
    return _requests(run, lambda n: reference.repeats[n] if n < len(reference.repeats) else reference.repeats[0])


def against_salted(run: RunRecord) -> list[RequestOutcome] | None:
    """Every request of every repeat of ``run`` against the same request of its salted reference."""
    salted = run.salted
    return _requests(run, lambda n: salted) if salted is not None else None


def _requests(run: RunRecord, reference_of: Callable[[int], Repeat]) -> list[RequestOutcome] | None:
    outcomes: list[RequestOutcome] = []
    for number, repeat in enumerate(run.repeats):
        reference = reference_of(number)
        mine = repeat.bench.get("generated_texts")
        theirs = reference.bench.get("generated_texts")
        if not mine or not theirs or len(mine) != len(theirs):
            return None
        kept = _answers(repeat, reference, len(mine))
        for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            outcomes.append(request_outcome(number, index, a, b, kept[index] if kept else None))
    return outcomes


def _answers(repeat: Repeat, reference: Repeat, count: int) -> list[tuple[Answer, Answer]] | None:
    """Both benchmarks' per-request answers with their logprobs, where both kept one for every request."""
    if not repeat.answers or not reference.answers or not len(repeat.answers) == len(reference.answers) == count:
        return None
    return list(zip(repeat.answers, reference.answers, strict=True))


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
    requests: list[RequestOutcome] | None = None  # every request under load against its reference's
    exact: str | None = None  # why the build is exact, where it is: then ``requests`` are judged
    against: str = ""  # what ``requests`` were compared with: SALTED, or the twin's run id

    @property
    def against_name(self) -> str:
        """The reference in words, for the verdict's lines."""
        if self.against == SALTED:
            concurrency = self.run.key.concurrency
            return f"its salted reference's (each request with a cache_salt of its own, at concurrency {concurrency})"
        return f"{self.against}'s"

    @property
    def by_logprobs(self) -> bool:
        """Whether the requests are judged by the per-request rule on their logprobs: where the build is not
        exact and every compared request kept its tokens with top-k logprobs."""
        return self.exact is None and bool(self.requests) and all(r.tokens is not None for r in self.requests or [])

    @property
    def requests_judged(self) -> bool:
        return self.requests is not None and (self.exact is not None or self.by_logprobs)

    @property
    def requests_differ(self) -> list[RequestOutcome]:
        if self.by_logprobs:
            return [r for r in self.requests or [] if not r.agrees]
        return [r for r in self.requests or [] if not r.identical]

    @property
    def twin_judged(self) -> bool:
        """Whether the probe's answers are also judged against the twin's: not where every request is judged
        against the salted reference (in vLLM's batch-invariant mode two correct servers still part)."""
        return not (self.requests_judged and self.against == SALTED)

    @property
    def judged(self) -> list[Comparison]:
        """What ``same_answers`` judges: the cached answers against the uncached ones, own then the twin's."""
        return self.own + self.twin if self.twin_judged else self.own

    @property
    def cell(self) -> str | None:
        """The answers cell of a report row. On an exact build, of every request compared under load: ``30/30``
        identical, ``4 DIFFER``; elsewhere of the probe's judged comparisons: ``4/4`` agreeing (near ties
        included), ``1 DIFFER``; ``error`` when a probe failed; None without a comparison."""
        if self.errors:
            return "error"
        if self.requests_judged:
            differ = len(self.requests_differ)
            return f"{differ} DIFFER" if differ else f"{len(self.requests or [])}/{len(self.requests or [])}"
        if not self.judged:
            return None
        found = counts(self.judged)
        if found[DIFFER]:
            return f"{found[DIFFER]} DIFFER"
        return f"{found[IDENTICAL] + found[NEAR_TIE]}/{len(self.judged)}"


def compared(run: RunRecord, reference: RunRecord | None = None) -> Compared:
    """The comparisons of ``run``'s probed answers, and of ``reference``'s where given (see :class:`Compared`)."""
    errors = [f"{r.key.id}: the answers probe failed: {r.probe_error}" for r in (run, reference) if r and r.probe_error]
    errors += salted_errors(run)
    if errors:
        return Compared(run, reference, [], [], [], errors)
    twin = cached_against(run, reference) if reference else []
    floor = uncached_against(run, reference) if reference else []
    if run.salted is not None:
        requests, exact, against = against_salted(run), exact_server(run.server), SALTED
    elif reference is not None:
        requests, exact, against = under_load(run, reference), exact_build(run, reference), reference.key.id
    else:
        requests, exact, against = None, None, ""
    return Compared(run, reference, cached_against_uncached(run), twin, floor, [], requests, exact, against)


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
    if not own and not found.requests_judged:
        message = f"{run.key.id}: no cached answer was probed (the probe sent nothing to an APC-on server)"
        return Verdict("same_answers", runs, False, message, {"answers": found.cell})
    lines = _under_load_lines(found)
    if own:
        lines += _section(f"{run.key.id}: cached against uncached on the {run.server.mode} server", own, "uncached")
    else:
        lines.append(f"{run.key.id}: no probe (every request is judged exactly; --apc-set answers_probes=N sends N)")
    judged = found.judged
    if reference is not None and (twin or floor):
        twin_name = reference.key.id
        reported = "" if found.twin_judged else " (reported: every request is judged against its salted reference)"
        what = f"cached against the {reference.server.mode} server ({twin_name}){reported}"
        lines += _section(what, twin, twin_name)
        lines.append(_line("uncached against uncached, the two servers (noise floor, reported)", floor))
    differ = [c for c in judged if c.outcome == DIFFER]
    wrong_under_load = found.requests_differ if found.requests_judged else []
    if differ or wrong_under_load:
        if wrong_under_load and found.by_logprobs:
            why = "not floating-point noise: under load, answers part at tokens outside each other's top-k"
        elif wrong_under_load:
            why = f"the build is exact ({found.exact}), so no floating-point noise parts two correct answers"
        else:
            why = "not floating-point noise: the tokens are outside each other's top-k"
        lines.append(
            "diagnosis: the cache served content that is not what these prompts compute: a block table, hash "
            f"or tier that returns other tokens' KV with the right counts ({why})"
        )
        if wrong_under_load and own and not differ:
            lines.append(
                "only under load: the probe, sent alone after the run, got the right answers, so the cache goes "
                "wrong while other requests are in flight (a race between requests)"
            )
        lines.append(_reproduce(run, reference))
    numbers = {
        "probed": len(run.probes),
        "cached_vs_uncached": counts(own),
        "cached_vs_twin": counts(twin) if reference else None,
        "noise_floor": counts(floor) if reference else None,
        "first_divergence": next((c.to_json() for c in judged if c.outcome != IDENTICAL), None),
        "comparisons": [c.to_json() for c in judged],
        "benchmark_identical": _identical_count(found.requests),
        "exact": found.exact,
        "requests": [r.to_json() for r in found.requests] if found.requests is not None else None,
        "reference": found.against or None,
        "answers": found.cell,
    }
    return Verdict("same_answers", runs, not differ and not wrong_under_load, "\n".join(lines), numbers)


def _identical_count(requests: list[RequestOutcome] | None) -> tuple[int, int] | None:
    """(identical, compared) of the requests under load; None where none were compared."""
    return (sum(r.identical for r in requests), len(requests)) if requests is not None else None


SHOWN_REQUESTS = 5  # of the requests that part, in a failure message (results.json holds every one)


def _under_load_lines(found: Compared) -> list[str]:
    """The lines on every request answered under load against its reference's (the salted run or the twin):
    judged on an exact build, else reported with why not."""
    if found.requests is None:
        return []
    identical, compared_count = _identical_count(found.requests) or (0, 0)
    head = (
        f"{found.run.key.id}: every request under load against {found.against_name}: "
        f"{identical}/{compared_count} identical"
    )
    if not found.requests_judged:
        return [f"{head} (reported: the build is not known to be exact, so two correct answers may part at a near tie)"]
    if found.by_logprobs:
        agree = len(found.requests) - len(found.requests_differ)
        lines = [
            f"{head}, {agree}/{compared_count} agreeing (judged per request on its top-k logprobs: the build is not "
            "exact, so two correct answers may part, at a near tie)"
        ]
    else:
        lines = [f"{head} (judged: {found.exact} gives the same tokens whatever the batch)"]
    wrong = found.requests_differ
    for outcome in wrong[:SHOWN_REQUESTS]:
        lines.append("  " + "\n  ".join(outcome.describe((found.run.key.id, found.against)).splitlines()))
    if len(wrong) > SHOWN_REQUESTS:
        lines.append(f"  ... and {len(wrong) - SHOWN_REQUESTS} more (results.json: this verdict's numbers.requests)")
    return lines


def _section(what: str, comparisons: list[Comparison], reference_name: str) -> list[str]:
    """A comparison's summary line, then each answer that was not identical (indented)."""
    details = [c.describe(("cached", reference_name)) for c in comparisons if c.outcome != IDENTICAL]
    return [_line(what, comparisons)] + ["  " + "\n  ".join(d.splitlines()) for d in details]


def _line(what: str, comparisons: list[Comparison]) -> str:
    found = counts(comparisons)
    return f"{what}: {found[IDENTICAL]} identical, {found[NEAR_TIE]} near ties, {found[DIFFER]} differ"


def _reproduce(run: RunRecord, reference: RunRecord | None) -> str:
    """The servers' commands, each run's benchmark, and a probe request to send to each."""
    probe: Probe | None = run.probes[0] if run.probes else None
    lines = ["reproduce:"]
    for r in (run, reference):
        if r is None:
            continue
        lines.append(f"  {r.server.mode} server: {' '.join(r.server.command) or '(not recorded)'}")
        lines.append(f"    its benchmark ({r.key.id}, generated texts in --save-detailed results): {r.bench_command}")
        if r.salted is not None:
            lines.append(f"    its salted reference (each request with a cache_salt of its own): {r.salted.command}")
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
