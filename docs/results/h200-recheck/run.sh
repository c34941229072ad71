#!/usr/bin/env bash
# A re-run of cases A-D at concurrency 8 with the GPU model, vLLM version and model shape of the full H200
# run (on another machine of that kind), through a later version of the plugin: vLLM 0.26.0 installed from
# its wheels into /tmp/site (ENV.sh puts it on PATH), the repository copied to a scratch folder, the plugin
# loaded from it with -p.
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
rm -rf /tmp/apcrepo2 && cp -r "$(pwd)" /tmp/apcrepo2 && cd /tmp/apcrepo2
export PYTHONPATH=/tmp/apcrepo2${PYTHONPATH:+:$PYTHONPATH}
python3 -m pytest -p pytest_apc.plugin tests_apc -m "(pure or overhead) and not sweep" \
  --gpu-node --apc-model-shape llama-3.1-8b --apc-results-dir /tmp/apcres-single -v -rA \
  > /tmp/pytest-single.log 2>&1
