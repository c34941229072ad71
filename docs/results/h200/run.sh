#!/usr/bin/env bash
# The H200 proof run, as it was started: vLLM 0.26.0 installed from its wheels, an 8B-shaped model with
# random weights, the full-scale suite through the plugin itself. ENV.sh put that Python environment on
# PATH; the repository was copied to a scratch folder and the run started detached, in the background.
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
rm -rf /tmp/apcrepo && cp -r "$(pwd)" /tmp/apcrepo && cd /tmp/apcrepo
export PYTHONPATH=/tmp/apcrepo${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import vllm; print('vllm', vllm.__version__)"
setsid nohup python3 -m pytest -p pytest_apc.plugin tests_apc \
  -m "apc and not hash_algo" --gpu-node --apc-model-shape llama-3.1-8b \
  --apc-sweep-cases CD --apc-sweep-concurrency 1,2,4,8 \
  --apc-results-dir /tmp/apcres -v -rA > /tmp/apcres.log 2>&1 < /dev/null &
echo "started pytest pid $!"
