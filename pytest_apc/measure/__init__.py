"""Measuring: one run's cold repeats on a ready deployment, and a session's worth of them.

Owns vLLM's benchmark as the plugin runs it (``bench``: arguments, runner, validation; its child process:
``bench_worker``), one measured cold repeat for every case (``repeat``: ``Bencher.measure_repeat``), one
measured run (``run``: ``Measurer``; a multi-turn run round by round: ``multiturn``), the answers probe
(``answers``), the measured data (``records``: ``RunRecord``, ``Measured``), the store xdist workers
share (``store``), where the run ran (``provenance``) and the session that starts one deployment per
mode and measures every planned run on it (``session``: ``ApcSession``).

Layer: above ``serving``; may import ``serving``, ``workload``, ``config`` and ``redaction``.
"""
