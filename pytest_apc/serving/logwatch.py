"""A server's log, read as it grows: the first line after which the server will never serve, with its
traceback and the likely fix; and the log's last lines, for every failure message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pytest_apc.redaction import redact

# Log lines after which a vLLM server will never serve, whatever its API process still does. vLLM prefixes
# what its engine and worker processes print with "(EngineCore... pid=N)" / "(Worker... pid=N)".
FATAL_SIGNATURES = tuple(
    re.compile(pattern)
    for pattern in (
        r"WorkerProc hit an exception",
        r"Engine core initialization failed",
        r"EngineCore encountered a fatal error",
        r"CUDA error: ",
        r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: ",
        r"NCCL error|ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclInvalidUsage",
        r"^\((?:EngineCore|Worker|VllmWorker)[^)]*\).*Traceback \(most recent call last\)",
    )
)
TRACEBACK = "Traceback (most recent call last)"
# What the first fatal line most likely means, and what to do about it (docs/troubleshooting.md).
KNOWN_FIXES = (
    (
        re.compile(r"illegal memory access|custom_all_reduce|all_reduce|symm_mem|multicast", re.I),
        "a multi-GPU all-reduce crash: on hosts with NVLink multicast switched off, vLLM's custom all-reduce "
        "and its all-reduce fusion fail in CUDA-graph capture; add --apc-server-arg=--disable-custom-all-reduce "
        "--apc-server-arg=--compilation-config "
        """--apc-server-arg='{"pass_config":{"fuse_allreduce_rms":false}}' (see docs/troubleshooting.md)""",
    ),
    (
        re.compile(r"out of memory|OutOfMemoryError", re.I),
        "out of memory: lower --gpu-memory-utilization or --apc-max-model-len (through --apc-server-arg), "
        "or spread the model over more GPUs (--apc-tensor-parallel-size)",
    ),
    (
        re.compile(r"nccl", re.I),
        "NCCL failed: check the NCCL_* variables of the environment (NCCL_NVLS_ENABLE=0 where NVLink "
        "multicast is off) and that every GPU of the tensor-parallel group is visible",
    ),
)


@dataclass(frozen=True)
class Fatal:
    """Why a server will never serve (again): the first sign, with its traceback and a likely fix."""

    reason: str
    excerpt: str = ""  # the first error and its traceback, from the server log
    line: int = 0  # 1-based line of the first fatal line in the log
    fix: str = ""

    def describe(self) -> str:
        text = self.reason
        if self.excerpt:
            text += f"\n--- first error in the server log (line {self.line}) ---\n{self.excerpt}"
        if self.fix:
            text += f"\nlikely cause and fix: {self.fix}"
        return text


class LogWatch:
    """Reads a server log as it grows and finds the first fatal line (read once: only new bytes each time)."""

    EXCERPT_BEFORE = 100  # how far back the traceback of the first fatal line may start
    EXCERPT_AFTER = 40

    def __init__(self, path: Path, start: int = 0) -> None:
        self.path = path
        self.offset = start
        self.lines: list[str] = []
        self._partial = ""
        self.first: int | None = None  # index of the first fatal line

    def scan(self) -> Fatal | None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return self._found()
        self.offset += len(data)
        text = self._partial + data.decode("utf-8", errors="replace")
        *complete, self._partial = text.split("\n")
        start = len(self.lines)
        self.lines += complete
        if self.first is None:
            for i in range(start, len(self.lines)):
                if any(sig.search(self.lines[i]) for sig in FATAL_SIGNATURES):
                    self.first = i
                    break
        return self._found()

    def _found(self) -> Fatal | None:
        if self.first is None:
            return None
        i, lines = self.first, self.lines
        begin = next((j for j in range(i, max(-1, i - self.EXCERPT_BEFORE), -1) if TRACEBACK in lines[j]), i)
        excerpt = redact("\n".join(lines[begin : max(i, begin) + self.EXCERPT_AFTER]))
        fix = next((advice for pattern, advice in KNOWN_FIXES if pattern.search(excerpt)), "")
        return Fatal(f"its log shows a fatal error: {lines[i].strip()[:300]}", excerpt, i + 1, fix)


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, decoded leniently (vLLM logs can hold anything)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        return f"<no log: {err}>"
    text = data[-200_000:].decode("utf-8", errors="replace")
    return redact("\n".join(text.splitlines()[-lines:]))
