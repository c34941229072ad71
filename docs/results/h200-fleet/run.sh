#!/usr/bin/env bash
# A fleet on ONE H200, measured as an external fleet: two vLLM replicas of an 8B-shaped model (random
# weights) share the GPU (each --gpu-memory-utilization 0.42, started one after the other so that their
# memory profiling does not see each other), vllm-router in front of them, and the fleet case through the
# plugin with --apc-fleet-url / --apc-metrics-url, once per router policy.
#   run.sh setup            install vllm-router, generate the model, start both replicas
#   run.sh measure POLICY.. one pytest run per policy (the router restarted with it), results per policy
# vLLM itself comes from the wheel bundles installed beforehand into /tmp/site (ENV.sh puts it on PATH).
set -euo pipefail
. /tmp/site/ENV.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 VLLM_SERVER_DEV_MODE=1
export PYTHONPATH=/tmp/router:/tmp/apcrepo${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/router/bin:$PATH
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
served=llama-8b
wait_health() {  # wait_health PORT LOG PID
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 1
  done
  tail -40 "$2"; return 1
}
case "$1" in
setup)
  rm -rf /tmp/apcrepo && cp -r "$(pwd)" /tmp/apcrepo
  python3 -m pip install -q --target /tmp/router vllm-router==0.1.17  # the run installed this wheel from a file
  vllm-router --help >/dev/null && echo "vllm-router ok"
  model=$(cd /tmp/apcrepo && python3 -m pytest_apc.tinymodel llama-3.1-8b)
  echo "$model" > /tmp/model.path
  python3 -c "import vllm; print('vllm', vllm.__version__)"
  for i in 1 2; do
    t0=$(date +%s)
    setsid nohup python3 -m vllm.entrypoints.cli.main serve "$model" --served-model-name "$served" --load-format dummy \
      --max-model-len 70000 --seed 0 --enable-prefix-caching --gpu-memory-utilization 0.42 \
      --host 127.0.0.1 --port "800$i" > "/tmp/replica-$i.log" 2>&1 < /dev/null &
    wait_health "800$i" "/tmp/replica-$i.log" $!
    echo "replica $i ready in $(( $(date +%s) - t0 )) s"
  done
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv
  grep -h "KV cache size\|Available KV cache" /tmp/replica-*.log || true
  ;;
measure)
  shift
  model=$(cat /tmp/model.path)
  for policy in "$@"; do
    setsid nohup vllm-router --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 --policy "$policy" \
      --host 127.0.0.1 --port 8080 --prometheus-port 29011 > "/tmp/router-$policy.log" 2>&1 < /dev/null &
    router=$!
    wait_health 8080 "/tmp/router-$policy.log" "$router"
    (cd /tmp/apcrepo && python3 -m pytest -p pytest_apc.plugin tests_apc -m fleet --gpu-node \
      --apc-model "$model" --apc-served-model-name "$served" \
      --apc-fleet-url http://127.0.0.1:8080 \
      --apc-metrics-url http://127.0.0.1:8001 --apc-metrics-url http://127.0.0.1:8002 \
      --apc-prefix-groups 3 --apc-repeats 2 --apc-results-dir "/tmp/apcres-$policy" -v -rA \
      > "/tmp/pytest-$policy.log" 2>&1) && echo "$policy: pytest passed" || echo "$policy: pytest FAILED"
    tail -25 "/tmp/pytest-$policy.log"
    kill -TERM -- "-$router" 2>/dev/null || kill "$router" || true
    sleep 2
    mkdir -p "$OUT/$policy" && cp -r "/tmp/apcres-$policy/." "$OUT/$policy/" && cp "/tmp/pytest-$policy.log" \
      "/tmp/router-$policy.log" "$OUT/$policy/"
  done
  ;;
esac
mkdir -p "$OUT/replicas" && for f in /tmp/replica-*.log; do gzip -c "$f" > "$OUT/replicas/$(basename "$f").gz"; done
