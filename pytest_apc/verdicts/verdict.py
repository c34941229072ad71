"""A verdict: a true statement about APC, checked against measured runs, passed or not, with a message that
carries the numbers and the numbers themselves for the results file.

Tests hand a :class:`Verdict` to the ``apc_assert`` fixture, which records it and fails the test when it
did not pass. :class:`Repeats` gathers what a verdict found repeat by repeat (every verdict on runs of
several cold repeats judges each of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What a timing verdict held its runs to: a significant TTFT gain, or no slowdown beyond the overhead tolerance.
FASTER = "faster"
NOT_SLOWER = "not slower"
# What a report's verdict cell says a timing verdict found, by what it was held to and whether it passed.
_FOUND = {(FASTER, True): "faster", (FASTER, False): "not faster", (NOT_SLOWER, True): "not slower",
          (NOT_SLOWER, False): "slower"}  # fmt: skip


@dataclass
class Verdict:
    name: str
    runs: list[str]
    passed: bool
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)
    # The rule of a verdict that passes or fails on timing alone: FASTER or NOT_SLOWER (None for any other).
    held_to: str | None = None

    def to_json(self) -> dict[str, Any]:
        rule = {"held_to": self.held_to} if self.held_to else {}
        return {
            "name": self.name,
            "runs": self.runs,
            "passed": self.passed,
            "message": self.message,
            "numbers": self.numbers,
            **rule,
        }


def held_to(verdict: Mapping[str, Any]) -> str | None:
    """The rule a recorded verdict (``Verdict.to_json()``) held its runs to: its ``held_to``; in a file written
    before verdicts carried it, the rule its name and numbers imply (ttft_gain a gain, not_slower no slowdown,
    multiturn_ttft a gain where ``gain_required``). None for a verdict that does not pass or fail on timing
    alone."""
    if verdict.get("held_to"):
        return str(verdict["held_to"])
    name = verdict.get("name")
    if name == "multiturn_ttft" and "gain_required" in (verdict.get("numbers") or {}):
        return FASTER if verdict["numbers"]["gain_required"] else NOT_SLOWER
    return {"ttft_gain": FASTER, "not_slower": NOT_SLOWER}.get(str(name))


def found(rule: str, passed: bool) -> str:
    """What a timing verdict found against its rule, as the report's verdict cell says it: faster or not
    faster (held to a significant gain), not slower or slower (held to no slowdown beyond the tolerance)."""
    return _FOUND[rule, passed]


def shown_repeat(failed: Sequence[bool]) -> int:
    """The repeat whose numbers a verdict and its report row show: the first that failed, else the first."""
    return failed.index(True) if any(failed) else 0


def repeat_numbers(per_repeat: list[dict[str, Any]], failed: list[bool]) -> dict[str, Any]:
    """Every repeat's numbers, and at the top level those of the repeat :func:`shown_repeat` picks, so that
    the results file shows what failed without hiding the other repeats."""
    return {**per_repeat[shown_repeat(failed)], "repeats": per_repeat}


@dataclass
class Repeats:
    """What a verdict found repeat by repeat: a line and numbers for each, the problems (a repeat with a
    problem failed), and notes; :meth:`verdict` makes the message (problems and notes once each)."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_repeat: list[dict[str, Any]] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)

    def add(
        self,
        line: str,
        numbers: dict[str, Any],
        problems: Sequence[str] = (),
        notes: Sequence[str] = (),
        *,
        failed: bool | None = None,
    ) -> None:
        """One repeat: it failed with a problem, or where ``failed`` says so (its line then says why)."""
        self.lines.append(line)
        self.per_repeat.append(numbers)
        self.problems += problems
        self.notes += notes
        self.failed.append(bool(problems) if failed is None else failed)

    def message(self, *tail: str) -> str:
        return "\n".join(
            self.lines
            + list(tail)
            + [f"- {problem}" for problem in dict.fromkeys(self.problems)]
            + [f"note: {n}" for n in dict.fromkeys(self.notes)]
        )

    def verdict(self, name: str, runs: list[str], *tail: str, **more: Any) -> Verdict:
        """The verdict: passed when no repeat failed; its numbers :func:`repeat_numbers`, with ``more``."""
        numbers = repeat_numbers(self.per_repeat, self.failed) | more
        return Verdict(name, runs, not any(self.failed), self.message(*tail), numbers)
