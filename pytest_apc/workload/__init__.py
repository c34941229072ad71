"""What is asked for: the workloads, before any server exists.

Owns the case matrix and what each case predicts (``cases``: ``RunKey``, ``Workload``, ``predict``), the
runs the selected tests need and how tests are parametrized over them (``plan``), the generated models
(``models``), the offload cases' sizes (``offload``) and the block-pool replay that predicts eviction
(``eviction``).

Layer: the lowest, with ``config`` and ``redaction``. May import only those and each other; nothing here
starts a process, reads a server or a results file.
"""
