#!/usr/bin/env bash
# The six cases at concurrency 8 on one H200, as it was started: vLLM 0.26.0 installed from its wheels into /tmp/site
# (the machine has no network), the repository at the commit in results.json cloned into /tmp/apcrepo,
# the plugin from there on PYTHONPATH, an 8B-shaped model with random weights.
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
cd /tmp/apcrepo
export PYTHONPATH=/tmp/apcrepo${PYTHONPATH:+:$PYTHONPATH}
python3 -m pytest -p pytest_apc.plugin tests_apc -m "apc and not hash_algo and not sweep" --gpu-node \
  --apc-model-shape llama-3.1-8b \
  --apc-results-dir /tmp/res-matrix -v -rA > /tmp/matrix.log 2>&1
