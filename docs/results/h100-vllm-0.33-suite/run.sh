#!/usr/bin/env bash
# The whole single-server suite on one GPU at one commit, measured over several sessions of limited length:
# vLLM installed from its wheels into /tmp/site (the machine has no network; SITE_ENV is sourced first), the
# pytest-apc wheel built from the recorded commit (pip wheel --no-deps .) installed into /tmp/apcsite, an
# 8B-shaped model with random weights, full scale, 3 cold repeats of every run. Each session measures what
# the run folder lacks (--apc-resume) of its selection SEL and begins no run that would not end within
# STOP_AFTER seconds (or is stopped with SIGTERM, as a pre-empted job is: the run cut short is measured again
# by the next session). Selections:
#   1: apc and not hash_algo and not sweep    (cases A-F at concurrency 8, with the answers check)
#   2: apc and not hash_algo                  (the C-F sweep at 1, 2, 4 and 8)
#   3: (apc and not hash_algo) or multiturn   (cases L and M, M on a small cache and with the CPU tier)
set -uo pipefail
WHEEL=${WHEEL:-pytest_apc-0.1.0-py3-none-any.whl}
SEL=${SEL:-(apc and not hash_algo) or multiturn}
RUN=${RUN:-/tmp/res-suite}
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/apcsite "$WHEEL"
. "${SITE_ENV:-/tmp/site/ENV.sh}"
export PYTHONPATH=/tmp/apcsite:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
mkdir -p /tmp/work-suite && cd /tmp/work-suite
where=(--apc-results-dir "$RUN")  # the first session: a run folder is made under $RUN
for earlier in "$RUN"/*/results.json; do [ -f "$earlier" ] && where=("--apc-resume=$(dirname "$earlier")"); done
exec python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node --apc-model-shape llama-3.1-8b \
  --apc-repeats 3 -v -rA "${where[@]}" -m "$SEL" ${STOP_AFTER:+--apc-set "stop_after=$STOP_AFTER"}
