#!/usr/bin/env bash
# A-F at concurrency 8 with 3 cold repeats each on one H200, as it was started: vLLM 0.26.0 installed from
# its wheels into /tmp/site (the machine has no network), the pytest-apc wheel built from the commit named
# in README.md installed into /tmp/apcsite, an 8B-shaped model with random weights, one launch per mode.
# 2 answers probes per run (the default is 8) to fit the machine's time.
set -euo pipefail
python3 -m pip install -q --no-deps --no-index --target /tmp/apcsite pytest_apc-0.1.0-py3-none-any.whl
. /tmp/site/ENV.sh
export PYTHONPATH=/tmp/apcsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p /tmp/work-matrix && cd /tmp/work-matrix
python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b -v -rA \
  --apc-results-dir /tmp/res-matrix -m "apc and not hash_algo and not sweep" --apc-repeats 3 \
  --apc-answers-probes 2 > /tmp/matrix-pytest.log 2>&1
