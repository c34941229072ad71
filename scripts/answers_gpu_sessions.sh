#!/usr/bin/env bash
# The answers verdict's power on one GPU, with the servers launched by pytest-apc, an 8B-shaped model with
# random weights, lengths at 1/4. Run from a checkout on a GPU machine where vLLM and pytest-apc are installed
# (SITE_ENV: a file to source first, for an offline install); start it detached (setsid), it runs until
# stopped. Streams share the GPU, each server with a fixed 12 GiB KV cache (which skips vLLM's memory
# profiling, which another stream's server would disturb) and a share of the GPU's memory, each stream with a
# TMPDIR of its own (pytest-apc locks the node's GPUs per temp folder). Two modes:
#  exact: vLLM's batch-invariant mode (--apc-set batch_invariant=on), every request judged identical to its
#    salted reference. Not --enforce-eager: run eagerly, the mode is not exact with itself.
#  logprobs: vLLM's default kernels, every request (and its salted reference, and the APC-off twin) keeping
#    its tokens with top-5 logprobs (--apc-set answers_logprobs=on), judged by the per-request rule.
# STREAMS (default: "exact-faults exact logprobs-faults" where the GPU has >= 120 GiB, else
# "logprobs-faults logprobs"): which streams run, each one of
#  exact-faults:    shift-under-load, shift, a healthy -m rag session, then healthy -m pure sessions (exact);
#  exact:           healthy -m pure sessions (exact);
#  logprobs-faults: a healthy session, shift-under-load, shift, then healthy sessions (logprobs);
#  logprobs-rag:    a healthy -m rag session, then healthy -m pure sessions (logprobs);
#  logprobs:        healthy -m pure sessions (logprobs).
# Each session is "-m MARKER and not sweep" without the timing test (one repeat), with 16 prompts of 64 output
# tokens per run. Everything lands in $W (default /tmp/salt): one JSON file of records per step, each
# session's results.json, store.json and pytest output under $W/kept, progress.log.
set -uo pipefail
W=${W:-/tmp/salt}; mkdir -p "$W/kept"
if [ -n "${SITE_ENV:-}" ]; then . "$SITE_ENV"; fi
export VLLM_USE_FLASHINFER_SAMPLER=0
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$MIB" -ge 120000 ]; then SHARE=0.3; DEFAULT="exact-faults exact logprobs-faults"
else SHARE=0.45; DEFAULT="logprobs-faults logprobs"; fi
STREAMS=${STREAMS:-$DEFAULT}
NODE="--gpu-node --apc-model-shape llama-3.1-8b --apc-length-scale 0.25 --apc-server-arg=--gpu-memory-utilization=$SHARE
  --apc-server-arg=--kv-cache-memory-bytes=12884901888"
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
power() {  # MODE MARKER SHAPES SESSIONS JSON (TMPDIR: the stream's own)
  local mode=(--set batch_invariant=on)
  [ "$1" = logprobs ] && mode=(--set answers_logprobs=on --set answers_reference=salted)
  python3 scripts/answers_power.py --sessions "$4" --shapes "$3" --node="$NODE" --marker "$2" "${mode[@]}" \
    --set num_prompts=16 --set output_len=64 --keep "$W/kept/$1" --json "$W/$5" >> "$W/progress.log" 2>&1
  say "done: $5"
}
stream() {  # NAME
  export TMPDIR="$W/tmp-$1"; mkdir -p "$TMPDIR"
  case $1 in
    exact-faults)
      power exact pure shift-under-load 1 exact-under-load.json
      power exact pure shift 1 exact-shift.json
      power exact rag none 1 exact-rag-healthy.json
      power exact pure none 20 exact-a-healthy.json ;;
    exact) power exact pure none 40 exact-b-healthy.json ;;
    logprobs-faults)
      power logprobs pure none 1 logprobs-a-first.json
      power logprobs pure shift-under-load 1 logprobs-under-load.json
      power logprobs pure shift 1 logprobs-shift.json
      power logprobs pure none 20 logprobs-a-healthy.json ;;
    logprobs-rag)
      power logprobs rag none 1 logprobs-rag-healthy.json
      power logprobs pure none 40 logprobs-c-healthy.json ;;
    logprobs) power logprobs pure none 40 logprobs-b-healthy.json ;;
  esac
}
say "start: $(nvidia-smi --query-gpu=name --format=csv,noheader), $MIB MiB, share $SHARE, streams: $STREAMS"
for name in $STREAMS; do
  stream "$name" &
  sleep 20  # the streams' first servers do not pick ports at the same instant
done
wait
