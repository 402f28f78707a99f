#!/usr/bin/env bash
# Builds the Rust core (static library + cxx headers) here and copies it to
# a folder, for tests/gpu/run.sh on a GPU machine that has no Rust toolchain
# (DEEPNVME_PREBUILT_CORE=<folder>). Same CPU architecture only. The pyo3
# module uses the stable ABI (abi3), so any Python >= 3.9 there will do.
# Usage: tests/gpu/stage-core.sh OUT_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUT_DIR}
cd "$ROOT"
JSON=$(cargo rustc --release --lib --features python,ffi --crate-type staticlib --message-format json-render-diagnostics)
LIB=$(printf '%s\n' "$JSON" | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="deepnvme":
        print(*[f for f in m["filenames"] if f.endswith(".a")])')
OUTDIR=$(printf '%s\n' "$JSON" | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="build-script-executed" and "deepnvme" in m["package_id"]:
        print(m["out_dir"])')
rm -rf "$OUT"; mkdir -p "$OUT"
cp "$LIB" "$OUT/libdeepnvme.a"
strip --strip-debug "$OUT/libdeepnvme.a"
mkdir -p "$OUT/cxxbridge"
# cxx-build's include tree is made of symlinks; the copy must hold files.
cp -rL "$OUTDIR/cxxbridge/include" "$OUT/cxxbridge/include"
du -sh "$OUT"
