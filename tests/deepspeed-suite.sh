#!/usr/bin/env bash
# Runs DeepSpeed's own tests for these ops against the installed deepnvme:
#   tests/unit/v1/nvme/  and  tests/unit/v1/pin_memory/test_pin_memory*.py
# Usage: tests/deepspeed-suite.sh /path/to/DeepSpeed/tests [MIX]
# MIX is a DEEPNVME_OPS value (default `all`: deepnvme provides every op);
# `pin_memory` runs DeepSpeed's own C++ async_io (JIT-built, needs
# libaio-dev; cached under target/torch-extensions) on deepnvme's pinned
# manager.
# The DeepSpeed checkout must live outside this repository (its tests are not
# ours to copy); its conftest puts the checkout's parent on sys.path, so the
# tests run from a copy of its tests/ folder to keep the installed deepspeed.
set -euo pipefail
SRC=${1:?usage: $0 /path/to/DeepSpeed/tests [MIX]}
MIX=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
# DeepSpeed JIT-builds its CPU comm op (and, in a mix, its stock ops) in its
# tests, and needs ninja from the venv.
export PATH="$VENV/bin:$PATH"
export DEEPNVME_OPS="$MIX"
export TORCH_EXTENSIONS_DIR="$ROOT/target/torch-extensions"
echo "DeepSpeed's own suite, DEEPNVME_OPS=$MIX: $("$VENV/bin/python" -c 'import deepnvme; print("deepnvme provides", ", ".join(deepnvme.provided_ops()) or "nothing")')"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$SRC" "$WORK/tests"
cd "$WORK/tests"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs \
    unit/v1/nvme/ unit/v1/pin_memory/test_pin_memory.py unit/v1/pin_memory/test_pin_memory_op.py
