"""The store that xdist workers of one pytest run share, in the run folder.

Under pytest-xdist every worker is its own session. A file lock makes sure one server runs at a time on
the node and each server mode is measured by one worker only; the others adopt its runs from a JSON file
written next to the lock (the pattern pytest-xdist documents for session-scoped work). Saved after every
run, it keeps each finished run in full (per-request samples, generated texts), which a session resuming
the folder (``--apc-resume``) adopts. Plain JSON, never pickles: a store file is data, not code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from filelock import FileLock

from pytest_apc.measure.records import Measured


class RunStore:
    """``measure.lock`` and ``store.json`` in the run folder."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "store.json"

    def lock(self) -> FileLock:
        """Held while a process measures (or decides whether it must)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.run_dir / "measure.lock"))

    def save(self, measured: Measured) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(measured.to_state()))
        os.replace(tmp, self.path)  # readers never see half a file

    def load(self) -> Measured | None:
        """What any process of this run has saved, or None before the first save."""
        if not self.path.is_file():
            return None
        return Measured.from_state(json.loads(self.path.read_text()))
