"""The node's GPUs as the plugin sees them: which are visible, how much memory each uses, and waiting until a
stopped server has given its memory back (through nvidia-smi; nothing where there is none).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time


def cuda_visible_devices() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs); None when it is unset or empty."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [v.strip() for v in visible.split(",") if v.strip()] if visible else None


def gpu_memory_used_mib() -> list[int] | None:
    """Used memory per GPU from nvidia-smi, or None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (subprocess.SubprocessError, OSError):
        return None
    return [int(line.strip()) for line in out.splitlines() if line.strip().isdigit()]


def wait_gpu_memory_released(baseline: list[int] | None, timeout: float = 120.0, slack_mib: int = 1024) -> float:
    """Wait until every GPU is back within ``slack_mib`` of ``baseline``; return the seconds waited."""
    started = time.monotonic()
    if baseline is None:
        return 0.0
    while time.monotonic() - started < timeout:
        now = gpu_memory_used_mib()
        if now is None or all(u <= b + slack_mib for u, b in zip(now, baseline, strict=False)):
            break
        time.sleep(1.0)
    return round(time.monotonic() - started, 3)
