#!/usr/bin/env bash
# Builds the abi3 wheel of deepnvme's pyo3 front end into $1 (default
# target/wheels): stages the Python package (bindings/deepnvme) and the .pth
# hook into bindings/wheel/python/ (maturin packs only a python-source inside
# this folder, and no symlinked one), then `maturin build --release`.
# Needs Rust and maturin (`pip install maturin`); no C++ compiler, no torch,
# no CUDA. PYTHON picks the interpreter maturin inspects (any CPython >= 3.9:
# the wheel is abi3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$ROOT/target/wheels}
PYTHON=${PYTHON:-python3}
MATURIN=${MATURIN:-maturin}

rm -rf "$HERE/python"
mkdir -p "$HERE/python/deepnvme"
cp "$ROOT"/bindings/deepnvme/*.py "$HERE/python/deepnvme/"
cp "$ROOT/bindings/deepnvme-deepspeed.pth" "$HERE/python/"
cd "$HERE"
PYO3_PYTHON="$PYTHON" "$MATURIN" build --release --interpreter "$PYTHON" -o "$OUT"
