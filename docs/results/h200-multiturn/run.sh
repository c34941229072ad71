#!/usr/bin/env bash
# The multi-turn cases on one H200, as they were started: vLLM 0.26.0 installed from its wheels into
# /tmp/site (the machine has no network), the pytest-apc wheel built from the commit each run names
# (pip wheel --no-deps .) installed into /tmp/apcsite, an 8B-shaped model with random weights, one launch per
# server mode, the suite's defaults (8 conversations x 6 turns, an 8K global prefix, 512-token messages,
# 256-token replies and outputs).
set -euo pipefail
python3 -m pip install -q --no-deps --no-index --target /tmp/apcsite pytest_apc-0.1.0-py3-none-any.whl
. /tmp/site/ENV.sh
export PYTHONPATH=/tmp/apcsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p /tmp/work-mt && cd /tmp/work-mt
# full/: the whole multi-turn selection, at commit f4716d1
python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b -v -rA \
  --apc-results-dir /tmp/res-mt -m multiturn > /tmp/mt-pytest.log 2>&1 || true
# tiers/: the small-cache runs again, at commit 523796c (the replay corrected)
python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b -v -rA \
  --apc-results-dir /tmp/res-mt2 -m multiturn -k across_tiers > /tmp/mt-pytest2.log 2>&1
