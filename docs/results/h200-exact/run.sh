#!/usr/bin/env bash
# Batch-invariant answers on one H200, as it was run: vLLM 0.26.0 and this project's wheel installed into
# /tmp/site (the machine has no network), an 8B-shaped model with random weights. Started detached
# (setsid) from the repository root; everything lands in /tmp/exact.
#  1. exactness.py against four servers side by side (each 22 % of the GPU), all VLLM_BATCH_INVARIANT=1:
#     S (APC on), S2 (APC on, no chunked prefill), O (APC off), F (APC on, test fault shift-under-load).
#  2. pytest-apc sessions in the same mode, one after the other, each with its own server starts:
#     healthy, then the fault shift-under-load, then more healthy ones (false alarms) until stopped.
set -uo pipefail
W=/tmp/exact; mkdir -p "$W" /tmp/faultplug/pytest_apc_test_fault-0.dist-info
cp docs/results/h200-exact/*.py "$W/"
cp tests/vllm_fault.py /tmp/faultplug/pytest_apc_test_fault.py
printf 'Metadata-Version: 2.1\nName: pytest-apc-test-fault\nVersion: 0\n' > /tmp/faultplug/pytest_apc_test_fault-0.dist-info/METADATA
printf '[vllm.general_plugins]\napc_fault = pytest_apc_test_fault:register\n' > /tmp/faultplug/pytest_apc_test_fault-0.dist-info/entry_points.txt
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_SERVER_DEV_MODE=1 VLLM_BATCH_INVARIANT=1
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
MODEL=$(python3 -c "from pytest_apc.workload.models import ensure_shape_model as e; print(e('llama-3.1-8b'))")
say "model $MODEL"

serve() {  # NAME PORT [ENV=VALUE ...] -- [vLLM ARGS ...]
  local name=$1 port=$2; shift 2; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" setsid python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name m \
    --load-format pytest_apc_dummy --max-model-len 20000 --seed 0 --port "$port" --gpu-memory-utilization 0.22 \
    "$@" > "$W/server-$name.log" 2>&1 &
  echo $! > "$W/server-$name.pid"
  for _ in $(seq 240); do grep -q "KV cache" "$W/server-$name.log" 2>/dev/null && break; sleep 1; done
  say "server $name: $(grep -m1 'KV cache' "$W/server-$name.log")"
}
serve S 8101 X=1 -- --enable-prefix-caching
serve S2 8102 X=1 -- --enable-prefix-caching --no-enable-chunked-prefill --max-num-batched-tokens 20000
serve O 8103 X=1 -- --no-enable-prefix-caching
serve F 8104 PYTEST_APC_TEST_FAULT=shift-under-load "PYTHONPATH=/tmp/faultplug:$PYTHONPATH" -- --enable-prefix-caching
for port in 8101 8102 8103 8104; do
  for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
done
say "servers ready"
python3 "$W/exactness.py" "$W/exact.json" S=http://127.0.0.1:8101:on S2=http://127.0.0.1:8102:on \
  O=http://127.0.0.1:8103:off F=http://127.0.0.1:8104:fault 2>&1 | tee -a "$W/progress.log"
python3 "$W/compare.py" "$W/exact.json" | tee "$W/compare.txt" | tee -a "$W/progress.log"
grep -h "attention backend\|Using .*backend\|batch.invariant\|chunked prefill" "$W"/server-*.log | sort | uniq -c | head -20 >> "$W/progress.log"
for name in S S2 O F; do kill -- -"$(cat "$W/server-$name.pid")" 2>/dev/null; done
sleep 15; nvidia-smi --query-gpu=memory.used --format=csv | tee -a "$W/progress.log"

session() {  # NAME [ENV=VALUE ...]
  local name=$1; shift
  mkdir -p "$W/$name"; say "session $name starts"
  (cd "$W/$name" && env "$@" python3 -m pytest -p no:cacheprovider --pyargs tests_apc --gpu-node \
    --apc-model-shape llama-3.1-8b -rA --apc-results-dir "$W/$name/res" -m "pure and not sweep" > "$W/$name.log" 2>&1)
  say "session $name exit $?: $(tail -1 "$W/$name.log")"
  for f in "$W/$name"/res/*/results.json; do
    python3 -m pytest_apc report "$f" 2>&1 | tail -6 | tee -a "$W/progress.log"
    python3 -c 'import json,sys; [print("  same_answers", v["passed"], {k: v["numbers"].get(k) for k in ("answers", "benchmark_identical", "cached_vs_uncached", "cached_vs_twin", "noise_floor")}) for v in json.load(open(sys.argv[1]))["verdicts"] if v["name"] == "same_answers"]' "$f" | tee -a "$W/progress.log"
  done
}
session healthy X=1
session fault PYTEST_APC_TEST_FAULT=shift-under-load "PYTHONPATH=/tmp/faultplug:$PYTHONPATH"
for n in 2 3 4 5 6 7 8 9 10; do session "healthy$n" X=1; done
