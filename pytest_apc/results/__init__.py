"""The results document (``results.json``): built, written, read back and validated in one place.

Owns the document (``document``: built and written there only), its one reader (``reader``: every file
``report``, ``compare``, ``calibrate`` and ``--apc-baseline`` read), the report's typed rows computed once
per session (``rows``) and how a row declares its columns (``columns``), what a summary shows of a document
(``view``) and how numbers read in every output (``formatting``). Its schema is ``results.schema.json``
beside this file.

Layer: above ``verdicts``; may import ``verdicts``, ``measure``, ``serving``, ``workload``, ``config`` and
``redaction``.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_PATH = Path(__file__).parent / "results.schema.json"

__all__ = ["SCHEMA_PATH"]
