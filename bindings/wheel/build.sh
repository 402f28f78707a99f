#!/usr/bin/env bash
# Builds the deepnvme wheel into $1 (default target/wheels): the abi3,
# manylinux2014 (glibc 2.17) x86_64 wheel that `pip install deepnvme` gets,
# with the pyo3 front end, the DeepSpeed hook, the type stubs and the CLI.
# It is pip's PEP 517 build of the root pyproject.toml (maturin --zig and
# cargo-zigbuild, see bindings/backend/deepnvme_backend.py), without build
# isolation: PYTHON's environment must have maturin, ziglang and
# cargo-zigbuild (pip install "maturin>=1.5,<2" ziglang cargo-zigbuild).
# Needs Rust; no C++ compiler, no torch, no CUDA.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:-$ROOT/target/wheels}
PYTHON=${PYTHON:-python3}

PATH="$(dirname "$PYTHON"):$PATH" "$PYTHON" -m pip wheel --disable-pip-version-check --no-deps \
    --no-build-isolation -w "$OUT" "$ROOT"
