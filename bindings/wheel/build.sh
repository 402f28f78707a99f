#!/usr/bin/env bash
# Builds the abi3 wheel of deepnvme's pyo3 front end into $1 (default
# target/wheels) with `maturin build --release`, from the Python package
# (bindings/deepnvme) and the .pth hook in place (see pyproject.toml).
# Needs Rust and maturin (`pip install maturin`); no C++ compiler, no torch,
# no CUDA. PYTHON picks the interpreter maturin inspects (any CPython >= 3.9:
# the wheel is abi3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$ROOT/target/wheels}
PYTHON=${PYTHON:-python3}
MATURIN=${MATURIN:-maturin}

cd "$HERE"
PYO3_PYTHON="$PYTHON" "$MATURIN" build --release --interpreter "$PYTHON" -o "$OUT"
