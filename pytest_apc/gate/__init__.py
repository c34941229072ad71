"""The baseline gate: a run judged against an earlier one by the noise measured between cold repeats.

Owns the noise statistics (``noise``), the comparison of two results documents (``compare``: ``Gate``,
``compare_documents``), ``python -m pytest_apc calibrate`` (``calibration``), ``--apc-baseline`` checked
before and while a run measures (``baseline``) and an earlier session's run folder checked and continued
(``resume``: ``--apc-resume``).

Layer: above ``results``; may import ``results``, ``verdicts``, ``measure``, ``serving``, ``workload``,
``config`` and ``redaction``.
"""
