#!/usr/bin/env bash
# The plugin's own checks: lint, types, then its tests. The fast tests (unit, pytester, fault injection
# with a fake server) run in parallel under xdist; the real-vLLM end-to-end tests run afterwards on their
# own, so that timing verdicts are not measured on a machine busy with other tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check pytest_apc tests tests_apc
ruff format --check pytest_apc tests tests_apc
mypy
python -m pytest tests -m "not e2e" -n auto "$@"
# --durations: what each end-to-end test costs, in every CI log.
python -m pytest tests -m e2e --durations=25 "$@"
