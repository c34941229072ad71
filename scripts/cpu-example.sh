#!/usr/bin/env bash
# Run the CPU example again: the six cases at the default concurrency on vLLM's CPU build with the generated
# tiny model, as docs/results/cpu records it (the example the quick start and "reading the results" show).
# It replaces the run's files there: results.json, summary.md, the plots, pytest.log (results path shortened
# to apc-results/...; its last line the exit status) and the gzipped server logs. Then
# `python -m pytest tests/test_docs.py` names every figure of the docs' prose that no longer matches them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
out=docs/results/cpu
work=$(mktemp -d /tmp/apc-cpu-example.XXXXXX)
trap 'rm -rf "$work"' EXIT
set +e
python -m pytest tests_apc -m "apc and not sweep" --cpu-node -p no:cacheprovider \
    --apc-results-dir="$work/apc-results" 2>&1 | tee "$work/pytest.log"
rc=${PIPESTATUS[0]}
set -e
echo "rc=$rc" >> "$work/pytest.log"
run=$(ls -d "$work"/apc-results/*/)
sed "s#$work/##g" "$work/pytest.log" > "$out/pytest.log"
cp "$run/results.json" "$run/summary.md" "$out/"
rm -f "$out"/*.png && cp "$run"/*.png "$out/" 2>/dev/null || echo "no plots (matplotlib missing)"
for log in "$run"/server-*.log; do gzip -9nc "$log" > "$out/$(basename "$log").gz"; done
echo "docs/results/cpu: written (pytest exit status $rc); now: python -m pytest tests/test_docs.py"
