"""How pytest reads the plugin's options from a command line, and the one trap in it.

pytest finds its rootdir and ini file before it loads plugins, so at that point ``--apc-model /models/x`` is an
unknown option followed by a path: pytest takes ``/models/x`` for a test path. The rootdir becomes the model's
folder, the project's ini file (its ``testpaths`` and markers) is not read, and pytest collects from the
current folder. Written ``--apc-model=/models/x``, the value stays the option's. The console script joins
each such value to its option before pytest sees the line; a plain ``pytest`` run is told in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

OPTION_PREFIX = "--apc-"  # every plugin option that takes a value; --gpu-node and --cpu-node take none


def _takes_separate_value(arg: str, following: str | None) -> bool:
    return arg.startswith(OPTION_PREFIX) and "=" not in arg and following is not None and not following.startswith("-")


def joined(args: Sequence[str]) -> list[str]:
    """``args`` with every ``--apc-x VALUE`` written ``--apc-x=VALUE``; nothing else changes (after ``--``
    everything is left as it is)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + list(args[i:])
        following = args[i + 1] if i + 1 < len(args) else None
        if _takes_separate_value(arg, following):
            out.append(f"{arg}={following}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def taken_for_test_paths(args: Sequence[str], cwd: Path) -> list[str]:
    """The ``--apc-x VALUE`` pairs of ``args`` whose VALUE is an existing path outside ``cwd``: pytest also read
    it as a test path and looked for the rootdir and ini file from there, not from ``cwd`` (a path inside
    ``cwd`` leads pytest to the same ini file)."""
    found = []
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else None
        if arg == "--":
            break
        if _takes_separate_value(arg, following) and following is not None:
            path = (cwd / following).resolve()
            if path.exists() and not path.is_relative_to(cwd.resolve()):
                found.append(f"{arg} {following}")
    return found
