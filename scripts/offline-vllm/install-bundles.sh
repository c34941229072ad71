#!/usr/bin/env bash
# Run on the GPU node once every bundle of pack.sh has been copied into STAGE (default /tmp/wheelstage):
# joins split wheels, checks every wheel against SHA256SUMS, installs them all with one pip call into
# SITE (default /tmp/site), and writes SITE/ENV.sh, to be sourced before using vLLM.
set -euo pipefail
STAGE=${STAGE:-/tmp/wheelstage}
SITE=${SITE:-/tmp/site}
PY=${PY:-python3}
cd "$STAGE"
for first in ./*.whl.part00; do
  [ -e "$first" ] || continue
  w=${first%.part00}
  cat "$w".part[0-9][0-9] > "$w.joining" && mv "$w.joining" "$w" && rm -f "$w".part[0-9][0-9]
done
missing=0
while read -r _ f; do [ -f "$f" ] || { echo "missing: $f"; missing=1; }; done < SHA256SUMS
[ $missing = 0 ] || { echo "copy the bundles that hold the wheels above, then run this again"; exit 1; }
sha256sum --quiet -c SHA256SUMS
# One pip call: separate --target installs into one folder drop the folders several wheels share (nvidia/).
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" ./*.whl
# nvidia-cutlass-dsl ships a .pth file, which Python reads only in site folders, not on PYTHONPATH.
echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH} PATH=$SITE/bin:\$PATH" > "$SITE/ENV.sh"
. "$SITE/ENV.sh"
cd /tmp  # not inside a checkout, whose packages would be imported instead
for module in ${CHECK:-torch vllm}; do
  "$PY" -c "import $module as m; print('imports: $module', getattr(m, '__version__', ''), 'from', m.__file__)"
done
