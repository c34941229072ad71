#!/usr/bin/env bash
# The answers verdict's power on one GPU: every request under load judged against its salted reference, with
# the servers launched by pytest-apc in vLLM's batch-invariant mode (--apc-set batch_invariant=on), an
# 8B-shaped model with random weights, lengths at 1/4. Run from a checkout on a GPU machine where vLLM and
# pytest-apc are installed (SITE_ENV: a file to source first, for an offline install); start it detached
# (setsid), it runs until stopped. Two streams share the GPU, each server with 45 % of its memory and a
# 12 GiB KV cache, each stream with a TMPDIR of its own (pytest-apc locks the node's GPUs per temp folder):
#  stream a: the test fault shift-under-load (tests/vllm_fault.py), the test fault shift (every hit), a
#    healthy -m rag session, then healthy -m pure sessions;
#  stream b: healthy -m pure sessions (false alarms over fresh server starts).
# STEPS=healthy (false alarms only): stream a runs healthy -m rag sessions, stream b healthy -m pure ones.
# Not --enforce-eager: run eagerly, batch-invariant mode is not exact with itself (docs/results/h100-answers).
# Each session is "-m MARKER and not sweep" without the timing test (one repeat), with 16 prompts of 64 output
# tokens per run. Everything lands in $W (default /tmp/salt): one JSON file of records per step, each
# session's results.json and pytest output under $W/kept, progress.log.
set -uo pipefail
W=${W:-/tmp/salt}; mkdir -p "$W/kept"
if [ -n "${SITE_ENV:-}" ]; then . "$SITE_ENV"; fi
export VLLM_USE_FLASHINFER_SAMPLER=0
# A fixed KV cache (12 GiB) skips vLLM's memory profiling, which the other stream's server would disturb.
NODE="--gpu-node --apc-model-shape llama-3.1-8b --apc-length-scale 0.25 --apc-server-arg=--gpu-memory-utilization=0.45
  --apc-server-arg=--kv-cache-memory-bytes=12884901888"
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
power() {  # NODE MARKER SHAPES SESSIONS JSON (TMPDIR: the stream's own)
  python3 scripts/answers_power.py --sessions "$4" --shapes "$3" --node="$1" --marker "$2" \
    --set batch_invariant=on --set num_prompts=16 --set output_len=64 --keep "$W/kept" --json "$W/$5" \
    >> "$W/progress.log" 2>&1
  say "done: $5"
}
say "start: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
mkdir -p "$W/tmp-a" "$W/tmp-b"
(
  export TMPDIR="$W/tmp-a"
  if [ "${STEPS:-all}" = healthy ]; then
    power "$NODE" rag none 20 a-rag-healthy.json
  else
    power "$NODE" pure shift-under-load 1 a-under-load.json
    power "$NODE" pure shift 1 a-shift.json
    power "$NODE" rag none 1 a-rag-healthy.json
    power "$NODE" pure none 20 a-healthy.json
  fi
) &
sleep 20  # the two streams' first servers do not pick ports at the same instant
TMPDIR="$W/tmp-b" power "$NODE" pure none 40 b-healthy.json &
wait
