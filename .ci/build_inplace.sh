#!/usr/bin/env bash
# Rebuilds fastpool._core and fastpool._arena in place without truncating the loaded .so under
# running processes: build elsewhere, then rename (a new inode) over it.
set -euo pipefail
cd "$(dirname "$0")/.."
python setup.py -q build_ext -b build/inplace >/dev/null
for so in build/inplace/fastpool/_core*.so build/inplace/fastpool/_arena*.so; do
  cp "$so" "fastpool/.$(basename "$so").tmp"
  mv -f "fastpool/.$(basename "$so").tmp" "fastpool/$(basename "$so")"
done
