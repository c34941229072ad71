#!/usr/bin/env bash
# Download the wheels a SUMS file names (where a package index is reachable) and pack them into bundles of
# at most LIMIT_MIB MiB (default 44), for a GPU node that has no network and takes files in limited
# transfers. A wheel larger than a bundle is split into parts that install-bundles.sh joins again.
# Usage: pack.sh SUMS OUTDIR   -> OUTDIR/b01 .. OUTDIR/bNN (the last also holds install-bundles.sh and SUMS)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sums=$(realpath "${1:?usage: pack.sh SUMS OUTDIR}")
out=${2:?usage: pack.sh SUMS OUTDIR}
limit_mib=${LIMIT_MIB:-44}
dl="$out/.download"
mkdir -p "$dl"
# wheel file name -> NAME==VERSION (wheel names are NAME-VERSION-TAGS.whl)
awk '{print $2}' "$sums" | sed -E 's/^([^-]+)-([^-]+)-.*$/\1==\2/' > "$dl/reqs.txt"
platforms=()
for v in 35 34 31 28 27 26 25 24 18 17 12 5; do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
  --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 \
  --platform manylinux1_x86_64 --platform linux_x86_64 -d "$dl" -r "$dl/reqs.txt"
(cd "$dl" && sha256sum --quiet -c "$sums")
limit=$((limit_mib * 1024 * 1024))
# split wheels larger than a bundle into parts (install-bundles.sh joins them again)
for f in "$dl"/*.whl; do
  if [ "$(stat -c %s "$f")" -gt $limit ]; then
    split -b "${limit_mib}M" -d -a 2 "$f" "$f.part"
    rm "$f"
  fi
done
used=()  # first fit, largest file first: each file goes into the first bundle it fits in
for f in $(ls -S "$dl"/*.whl*); do
  s=$(stat -c %s "$f") i=0
  while [ $i -lt ${#used[@]} ] && [ $((used[i] + s)) -gt $limit ]; do i=$((i + 1)); done
  [ $i -lt ${#used[@]} ] || used+=(0)
  cur=$(printf '%s/b%02d' "$out" $((i + 1)))
  mkdir -p "$cur"
  mv "$f" "$cur/"
  used[i]=$((used[i] + s))
done
cur=$(printf '%s/b%02d' "$out" ${#used[@]})  # the last bundle also carries the installer
cp "$here/install-bundles.sh" "$cur/"
cp "$sums" "$cur/SHA256SUMS"
rm -rf "$dl"
du -sh "$out"/b* | sed 's/^/bundle /'
