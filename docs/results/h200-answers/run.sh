#!/usr/bin/env bash
# The answers verdict on one H200, as it was started: vLLM 0.26.0 installed from its wheels into /tmp/site
# (the machine has no network), the pytest-apc wheel built from the commit named in README.md installed
# into /tmp/apcsite, an 8B-shaped model with random weights. The fault run adds the test-only vLLM plugin
# tests/vllm_fault.py as a distribution in /tmp/faultplug (see tests/test_e2e_fault.py for its layout).
set -euo pipefail
. /tmp/site/ENV.sh
export PYTHONPATH=/tmp/apcsite:${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0
common=(-p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b -rA)
# 1. A cache that serves wrong content with the right counts: cache hits shifted by one block.
(cd /tmp/work-fault && PYTHONPATH=/tmp/faultplug:$PYTHONPATH PYTEST_APC_TEST_FAULT=shift \
  python3 -m pytest "${common[@]}" --apc-results-dir /tmp/res-fault -m pure -k 'not test_pure_apc' \
  --apc-answers-probes 4 > /tmp/fault.log 2>&1) || true
# 2. The same build, healthy: the pure, agent/RAG and offload cases.
cd /tmp/work-healthy
python3 -m pytest "${common[@]}" --apc-results-dir /tmp/res-healthy -m 'pure or offload or rag' > /tmp/healthy.log 2>&1
