#!/usr/bin/env bash
# Every request under load judged against its salted reference, on one GPU, as it was run: vLLM and this
# project's wheel installed into /tmp/site (the machine has no network), an 8B-shaped model with random
# weights, the servers launched by pytest-apc in vLLM's batch-invariant mode (--apc-set batch_invariant=on).
# Started detached (setsid) from a copy of the repository; everything lands in /tmp/salt.
#  1. the test fault shift-under-load (tests/vllm_fault.py), one session (scripts/answers_power.py);
#  2. healthy: -m pure (C/D at concurrency 8, the full 30 prompts), one repeat: what the answers work costs;
#  3. the test fault shift (every hit), one session;
#  4. healthy sessions, each with fresh server starts, until stopped (false alarms).
# Sessions 1, 3 and 4 send 16 prompts of 64 output tokens per run instead of 30 of 256 (same prompt lengths,
# same concurrency), to fit the window.
set -uo pipefail
W=/tmp/salt; mkdir -p "$W/healthy"
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0
NODE="--gpu-node --apc-model-shape llama-3.1-8b"
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
power() {  # SHAPES SESSIONS JSON
  python3 scripts/answers_power.py --sessions "$2" --shapes "$1" --node "$NODE" --set batch_invariant=on \
    --set num_prompts=16 --set output_len=64 --json "$W/$3" 2>&1 | tee -a "$W/progress.log"
}
say "start: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
power shift-under-load 1 under-load.json
say "healthy session starts"
(cd "$W/healthy" && python3 -m pytest -p no:cacheprovider --pyargs tests_apc $NODE -rA --apc-results-dir "$W/healthy/res" \
  -m pure --apc-set batch_invariant=on > "$W/healthy.log" 2>&1)
say "healthy session exit $?: $(tail -1 "$W/healthy.log")"
for f in "$W"/healthy/res/*/results.json; do
  python3 -m pytest_apc report "$f" 2>&1 | tail -8 | tee -a "$W/progress.log"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print("  same_answers", v["runs"], v["passed"], {k: v["numbers"].get(k) for k in ("answers", "reference", "exact", "benchmark_identical", "cached_vs_uncached", "cached_vs_twin")}) for v in d["verdicts"] if v["name"] == "same_answers"]; [print("  ", r["id"], "bench", r["bench_duration_s"], "wall", r["wall_s"], "salted", r["answers"].get("salted")) for r in d["runs"]]' "$f" | tee -a "$W/progress.log"
done
power shift 1 shift.json
power none 20 healthy-sessions.json
