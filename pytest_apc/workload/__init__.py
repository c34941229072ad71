"""What is asked for: the workloads, before any server exists.

Owns the case matrix and what a cold server with room for every prefix predicts (``cases``: ``RunKey``,
``Workload``, ``predict``), the runs the selected tests need, how tests are parametrized over them and the
settings the workload refuses (``plan``), whether the selected runs fit the model's context, how they are
fitted where they do not, and the ``--max-model-len`` a launched server gets (``fit``), the generated models
(``models``) with their prompt-dependent random weights (``weights``) and the vLLM load format that draws
them (``vllm_loader``),
the offload cases' sizes (``offload``), vLLM's block pool replayed to predict eviction (``eviction``), the
multi-turn conversations and their per-turn prediction (``multiturn``), and the routing that explains a
fleet's per-replica counters in the multi-turn case (``affinity``).

Layer: the lowest, with ``config`` and ``redaction``. May import only those and each other (``config``
imports nothing of this package); nothing here starts a process, reads a server or a results file.
"""
