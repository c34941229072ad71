#!/usr/bin/env bash
# The answers verdict's power on one GPU: every request under load judged against its salted reference, with
# the servers launched by pytest-apc in vLLM's batch-invariant mode (--apc-set batch_invariant=on), an
# 8B-shaped model with random weights. Run from a checkout on a GPU machine where vLLM and pytest-apc are
# installed (SITE_ENV: a file to source first, for an offline install); start it detached (setsid), it
# runs until stopped. Everything lands in $W (default /tmp/salt):
#  1. the test fault shift-under-load (tests/vllm_fault.py), one session (scripts/answers_power.py);
#  2. a healthy server, one session;
#  3. the test fault shift (every hit), one session;
#  4. healthy sessions, each with fresh server starts, until stopped (false alarms).
# Each session is -m "pure and not sweep" without the timing test (C/D at concurrency 8, one repeat), with
# 16 prompts of 64 output tokens per run instead of 30 of 256 (the same prompt lengths).
set -uo pipefail
W=${W:-/tmp/salt}; mkdir -p "$W"
if [ -n "${SITE_ENV:-}" ]; then . "$SITE_ENV"; fi
export VLLM_USE_FLASHINFER_SAMPLER=0
NODE="--gpu-node --apc-model-shape llama-3.1-8b"
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
power() {  # SHAPES SESSIONS JSON
  python3 scripts/answers_power.py --sessions "$2" --shapes "$1" --node="$NODE" --set batch_invariant=on \
    --set num_prompts=16 --set output_len=64 --json "$W/$3" 2>&1 | tee -a "$W/progress.log"
}
say "start: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
power shift-under-load 1 under-load.json
power none 1 healthy-1.json
power shift 1 shift.json
power none 20 healthy-sessions.json
