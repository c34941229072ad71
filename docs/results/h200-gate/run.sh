#!/usr/bin/env bash
# How the gate's data on one H200 was measured. vLLM 0.26.0 comes from wheel bundles installed beforehand
# into /tmp/site (the H200 machine has no network); the model is the plugin's generated 8B shape with
# dummy weights. Two servers stay up for the whole measurement, each on its own half of the GPU
# (--gpu-memory-utilization 0.45, started one after the other so that their memory profiling does not see
# each other; only one is busy at a time), and the plugin measures them as external servers
# (--apc-url-off / --apc-url-on), so that many cold repeats fit without a server start per repeat.
#   run.sh setup                  generate the model, start the APC-off and APC-on servers
#   run.sh restart-on             stop the APC-on server and start it again (a second server start)
#   run.sh measure NAME K [ARGS]  one pytest run of C/D at concurrency 8 with K cold repeats
#   run.sh slow NAME K DELAY_MS   D alone, K repeats, through delay_proxy.py adding DELAY_MS per request
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 VLLM_SERVER_DEV_MODE=1
export PYTHONPATH=/tmp/apcrepo${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/out}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" /tmp/gate
served=apc-model
wait_health() {  # wait_health PORT LOG PID
  for _ in $(seq 1 400); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 1
  done
  tail -40 "$2"; return 1
}
start() {  # start PORT APC-FLAG NAME
  local t0 pid; t0=$(date +%s)
  setsid nohup python3 -m vllm.entrypoints.openai.api_server --model "$(cat /tmp/model.path)" \
    --served-model-name "$served" --host 127.0.0.1 --port "$1" --max-model-len 65280 --seed 0 "$2" \
    --load-format dummy --gpu-memory-utilization 0.45 > "/tmp/gate/server-$3.log" 2>&1 < /dev/null &
  pid=$!; echo "$pid" > "/tmp/gate/server-$3.pid"
  wait_health "$1" "/tmp/gate/server-$3.log" "$pid"
  echo "$3 ready in $(( $(date +%s) - t0 )) s: $(grep -h 'KV cache size' "/tmp/gate/server-$3.log" | sed 's/.*\] //')"
}
summary() {  # summary RESULTS_DIR: per-repeat mean TTFT and cached tokens of each run
  python3 - "$1" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/results.json")):
    doc = json.loads(path.read_text())
    for run in doc["runs"]:
        means = [round(r["mean_ttft_ms"]) for r in run["repeat_counters"]]
        hits = sorted({(r["delta"] or {}).get("prefix_cache_hits") for r in run["repeat_counters"]}, key=str)
        print(f"  {run['id']}: mean TTFT per repeat {means} ms; hits {hits}")
PY
}
measure() {  # measure NAME K URL_ON PYTEST-ARGS...
  local name=$1 k=$2 url_on=$3; shift 3
  (cd /tmp/apcrepo && python3 -m pytest -p pytest_apc.plugin tests_apc --gpu-node -p no:cacheprovider \
    --apc-model "$(cat /tmp/model.path)" --apc-served-model-name "$served" \
    --apc-url-off http://127.0.0.1:8001 --apc-url-on "$url_on" --apc-repeats "$k" \
    --apc-results-dir "/tmp/gate/$name" -v -rA "$@" > "/tmp/gate/pytest-$name.log" 2>&1) \
    && echo "$name: pytest passed" || echo "$name: pytest FAILED"
  tail -12 "/tmp/gate/pytest-$name.log"
  summary "/tmp/gate/$name" || true
}
pack() { tar -C /tmp/gate -czf "$OUT/gate.tgz" --exclude='*.pid' . && ls -la "$OUT"; }
case "$1" in
setup)
  rm -rf /tmp/apcrepo && cp -r "$(cd "$here/../../.." && pwd)" /tmp/apcrepo
  (cd /tmp/apcrepo && python3 -m pytest_apc.tinymodel llama-3.1-8b) > /tmp/model.path
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  start 8001 --no-enable-prefix-caching apc-off
  start 8002 --enable-prefix-caching apc-on
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  ;;
restart-on)
  kill -TERM -- "-$(cat /tmp/gate/server-apc-on.pid)" 2>/dev/null || true
  for _ in $(seq 60); do curl -sf http://127.0.0.1:8002/health >/dev/null || break; sleep 1; done; sleep 5
  mv /tmp/gate/server-apc-on.log "/tmp/gate/server-apc-on-$(date +%s).log"
  start 8002 --enable-prefix-caching apc-on
  ;;
measure)
  name=$2 k=$3; shift 3
  measure "$name" "$k" http://127.0.0.1:8002 -m "pure and not sweep" "$@"
  pack
  ;;
slow)
  name=$2 k=$3 delay=$4
  setsid nohup python3 "$here/delay_proxy.py" 8102 http://127.0.0.1:8002 "$delay" > "/tmp/gate/proxy-$name.log" 2>&1 &
  proxy=$!
  for _ in $(seq 30); do curl -sf http://127.0.0.1:8102/health >/dev/null && break; sleep 0.5; done
  measure "$name" "$k" http://127.0.0.1:8102 -m "pure and not sweep" -k cached_tokens
  kill "$proxy"
  pack
  ;;
esac
