"""Secrets (API keys) never reach logs shown to people, reports or the results file."""

from __future__ import annotations

from collections.abc import Sequence

_SECRETS: set[str] = set()
MASK = "***"


def register(secret: str) -> None:
    if secret:
        _SECRETS.add(secret)


def redact(text: str) -> str:
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact_argv(argv: Sequence[str]) -> list[str]:
    return [redact(arg) for arg in argv]
