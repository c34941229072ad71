"""Logs every full garbage collection (generation 2) that takes over 20 ms, in every Python process that
starts with this file on its path as ``sitecustomize.py``: one line per collection in ``$GC_LOG_DIR/<pid>.txt``
(``<unix time> <ms>ms <objects collected> <the process's first arguments>``).

    mkdir -p /tmp/gclog/hook && cp gc_hook.py /tmp/gclog/hook/sitecustomize.py
    GC_LOG_DIR=/tmp/gclog PYTHONPATH=/tmp/gclog/hook python scripts/payoff_power.py ...
"""

import gc
import os
import sys
import time

_started: dict[str, float] = {}


def _logged(phase: str, info: dict) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start":
        _started["t"] = time.perf_counter()
        return
    ms = (time.perf_counter() - _started.get("t", time.perf_counter())) * 1000
    if ms > 20:
        folder = os.environ.get("GC_LOG_DIR", "/tmp/gclog")
        with open(f"{folder}/{os.getpid()}.txt", "a") as log:
            log.write(f"{time.time():.3f} {ms:.0f}ms {info.get('collected')} {' '.join(sys.argv[:3])[:120]}\n")


gc.callbacks.append(_logged)
