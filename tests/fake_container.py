"""A stand-in for a container runtime, for the launcher tests: ``fake_container.py [-e NAME | --env NAME]...
[--] CMD ARGS...`` runs CMD in an environment that holds only PATH and the variables it was told to pass
(their values from its own environment), as ``docker run -e NAME IMAGE CMD`` does. It replaces itself with
CMD (exec), so the process pytest-apc started is the server."""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    passed = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    i = 0
    while i < len(argv) and argv[i] in ("-e", "--env"):
        name = argv[i + 1]
        if name in os.environ:
            passed[name] = os.environ[name]
        i += 2
    if i < len(argv) and argv[i] == "--":
        i += 1
    os.execvpe(argv[i], argv[i:], passed)


if __name__ == "__main__":
    main(sys.argv[1:])
