#!/usr/bin/env bash
# Every request under load judged against its salted reference, on one GPU, as it was run: vLLM and this
# project's wheel installed into /tmp/site (the machine has no network), an 8B-shaped model with random
# weights, the servers launched by pytest-apc in vLLM's batch-invariant mode (--apc-set batch_invariant=on).
# Started detached (setsid) from the repository root; everything lands in /tmp/salt.
#  1. healthy: -m "pure or rag" (C/D and E/F at concurrency 8), one repeat: what the answers work costs;
#  2. one session per test fault (tests/vllm_fault.py): shift-under-load, then shift (scripts/answers_power.py);
#  3. healthy sessions, each with fresh server starts, until stopped (false alarms).
set -uo pipefail
W=/tmp/salt; mkdir -p "$W/healthy"
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0
NODE="--gpu-node --apc-model-shape llama-3.1-8b"
say() { echo "[$(date +%T)] $*" | tee -a "$W/progress.log"; }
summary() {  # RESULTS.JSON: the report's table and each same_answers verdict's figures
  python3 -m pytest_apc report "$1" 2>&1 | tail -8 | tee -a "$W/progress.log"
  python3 -c 'import json,sys; [print("  same_answers", v["runs"], v["passed"], {k: v["numbers"].get(k) for k in ("answers", "reference", "exact", "benchmark_identical", "cached_vs_uncached", "cached_vs_twin")}) for v in json.load(open(sys.argv[1]))["verdicts"] if v["name"] == "same_answers"]' "$1" | tee -a "$W/progress.log"
}
say "healthy session starts"
(cd "$W/healthy" && python3 -m pytest -p no:cacheprovider --pyargs tests_apc $NODE -rA --apc-results-dir "$W/healthy/res" \
  -m "pure or rag" --apc-set batch_invariant=on > "$W/healthy.log" 2>&1)
say "healthy session exit $?: $(tail -1 "$W/healthy.log")"
for f in "$W"/healthy/res/*/results.json; do summary "$f"; done
python3 scripts/answers_power.py --sessions 1 --shapes shift-under-load,shift --node "$NODE" \
  --set batch_invariant=on --json "$W/faults.json" 2>&1 | tee -a "$W/progress.log"
python3 scripts/answers_power.py --sessions 20 --shapes none --node "$NODE" \
  --set batch_invariant=on --json "$W/healthy-sessions.json" 2>&1 | tee -a "$W/progress.log"
