#!/usr/bin/env bash
# The plugin's own checks: lint, types, then its tests (unit, pytester, real-vLLM CPU end to end).
# Files run in parallel (xdist, one file per worker) so the end-to-end file runs beside the fast ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check pytest_apc tests tests_apc
ruff format --check pytest_apc tests tests_apc
mypy
exec python -m pytest tests -n 2 --dist loadfile "$@"
