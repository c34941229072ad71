#!/usr/bin/env bash
# The main job on the embedded CPU default: install, generate the tiny model, run the APC suite
# against real vLLM (CPU build). Extra arguments go to pytest (e.g. -m pure).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest -m apc --cpu-node "$@"
