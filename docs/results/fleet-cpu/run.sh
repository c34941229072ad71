#!/usr/bin/env bash
# The CPU policy sweep of docs/results/fleet-cpu: two vLLM CPU replicas behind vllm-router, five router
# policies, and one server with --data-parallel-size 2; three prefix groups of 10 prompts each.
set -euo pipefail
python -m pytest tests_apc -m fleet --cpu-node -v -rA \
  --apc-router-policies=round_robin,cache_aware,consistent_hash,power_of_two,random \
  --apc-data-parallel-size=2 --apc-prefix-groups=3 \
  --apc-results-dir=apc-results
