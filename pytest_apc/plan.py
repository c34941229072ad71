"""The run plan: which runs the selected tests need, grouped by the server mode they run on.

The plugin adds every run a selected test uses at collection (after ``-m`` / ``-k``), so the session can
measure all runs of a mode on one deployment, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_apc.cases import RunKey, ServerMode


@dataclass
class Plan:
    keys: set[RunKey] = field(default_factory=set)

    def add(self, keys: Iterable[RunKey]) -> None:
        self.keys.update(keys)

    def runs_on(self, mode: ServerMode) -> list[RunKey]:
        """The planned runs of ``mode``, in measuring order (case, then concurrency)."""
        return sorted(k for k in self.keys if k.mode == mode)

    def modes(self) -> list[ServerMode]:
        return sorted({k.mode for k in self.keys})
