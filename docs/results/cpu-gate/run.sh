#!/usr/bin/env bash
# Same-build reruns of `-m pure` on vLLM's CPU build: N pytest runs (default 6) of K cold repeats each
# (default 5), one after the other, from the repository root after `bash scripts/install.sh`.
set -u
. .venv/bin/activate
for i in $(seq 1 "${1:-6}"); do
  python -m pytest tests_apc -m pure --cpu-node -p no:cacheprovider --apc-repeats "${2:-5}" \
    --apc-results-dir "apc-results/cpu-gate/run-$i" -v -rA > "apc-results/cpu-gate/pytest-$i.log" 2>&1
  echo "run $i: rc $?"
done
