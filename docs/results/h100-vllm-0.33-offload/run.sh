#!/usr/bin/env bash
# The offload selection (cases N and O, and case M's tier runs) on one GPU with vLLM 0.33.0, in a session of
# limited length: vLLM installed from its wheels into /tmp/site (scripts/offline-vllm; the machine has no
# network), the pytest-apc wheel built from the recorded commit (pip wheel --no-deps .) installed into
# /tmp/apcsite, an 8B-shaped model with random weights, full scale. END is the time (seconds since the epoch)
# by which the session must be over; stop_after begins nothing that could end later, and what it leaves out
# fails as not measured, to be measured by a later session with --apc-resume.
set -uo pipefail
END=${END:?the time by which the session must end, in seconds since the epoch}
WHEEL=${WHEEL:-pytest_apc-0.1.0-py3-none-any.whl}
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/apcsite "$WHEEL"
. "${SITE_ENV:-/tmp/site/ENV.sh}"
export PYTHONPATH=/tmp/apcsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p /tmp/work-offload && cd /tmp/work-offload
exec python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b -v -rA \
  --apc-results-dir /tmp/res-offload -m offload --apc-set "stop_after=$((END - $(date +%s)))"
