#!/usr/bin/env bash
# The second H200 run: the hash-algorithm comparison and the E/F sweep at concurrency 1 and 8, with the
# same environment as ../run.sh (vLLM 0.26.0, 8B-shaped random-weight model). Started detached, in the
# background.
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
rm -rf /tmp/apcrepo && cp -r "$(pwd)" /tmp/apcrepo && cd /tmp/apcrepo
export PYTHONPATH=/tmp/apcrepo${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import vllm, xxhash; print('vllm', vllm.__version__, 'xxhash', xxhash.VERSION)"
setsid nohup python3 -m pytest -p pytest_apc.plugin tests_apc \
  -m "hash_algo or sweep" --gpu-node --apc-model-shape llama-3.1-8b \
  --apc-hash-algos sha256_cbor,xxhash --apc-sweep-cases EF --apc-sweep-concurrency 1,8 \
  --apc-results-dir /tmp/apcres -v -rA > /tmp/apcres.log 2>&1 < /dev/null &
echo "started pytest pid $!"
