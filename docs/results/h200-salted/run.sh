#!/usr/bin/env bash
# Every request under load judged against its salted reference, on one GPU, as it was run: vLLM and this
# project's wheel installed into /tmp/site (the machine has no network), an 8B-shaped model with random
# weights, the servers launched by pytest-apc in vLLM's batch-invariant mode (--apc-set batch_invariant=on).
# Started detached (setsid) from a copy of the repository; everything lands in /tmp/salt.
#  1. the test fault shift-under-load (tests/vllm_fault.py), one session (scripts/answers_power.py);
#  2. a healthy server, one session;
#  3. the test fault shift (every hit), one session;
#  4. healthy sessions, each with fresh server starts, until stopped (false alarms).
# Each session is -m "pure and not sweep" without the timing test (C/D at concurrency 8, one repeat), with
# 16 prompts of 64 output tokens per run instead of 30 of 256 (the same prompt lengths), to fit the window.
set -uo pipefail
W=/tmp/salt; mkdir -p "$W"
. /tmp/site/ENV.sh
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
