#!/usr/bin/env bash
# Runs DeepSpeed's own tests for these ops against the installed deepnvme:
#   tests/unit/v1/nvme/  and  tests/unit/v1/pin_memory/test_pin_memory*.py
# Usage: tests/deepspeed-suite.sh /path/to/DeepSpeed/tests [MIX] [TEST_PATH...]
# MIX is a DEEPNVME_OPS value (default `all`: deepnvme provides every op);
# `pin_memory` runs DeepSpeed's own C++ async_io (JIT-built, needs
# libaio-dev; cached in the venv under deepnvme-torch-extensions) on deepnvme's pinned
# manager. With TEST_PATHs (relative to that tests/ folder, e.g.
# unit/runtime/zero/test_nvme_checkpointing.py) only those run; pytest options
# may come before them (that file is marked sequential: -m sequential).
# The DeepSpeed checkout must live outside this repository (its tests are not
# ours to copy); its conftest puts the checkout's parent on sys.path, so the
# tests run from a copy of its tests/ folder to keep the installed deepspeed.
set -euo pipefail
SRC=${1:?usage: $0 /path/to/DeepSpeed/tests [MIX] [TEST_PATH...]}
MIX=${2:-all}
shift $(( $# >= 2 ? 2 : 1 ))
if [ $# -eq 0 ]; then
    set -- unit/v1/nvme/ unit/v1/pin_memory/test_pin_memory.py unit/v1/pin_memory/test_pin_memory_op.py
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
# DeepSpeed JIT-builds its CPU comm op (and, in a mix, its stock ops) in its
# tests, and needs ninja from the venv.
export PATH="$VENV/bin:$PATH"
export DEEPNVME_OPS="$MIX"
# The stock ops' JIT build is shared with tests/python/test_mix_stock_aio.py (in the venv).
export TORCH_EXTENSIONS_DIR="$VENV/deepnvme-torch-extensions"
echo "DeepSpeed's own suite, DEEPNVME_OPS=$MIX: $("$VENV/bin/python" -c 'import deepnvme; print("deepnvme provides", ", ".join(deepnvme.provided_ops()) or "nothing")')"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$SRC" "$WORK/tests"
cd "$WORK/tests"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs "$@"
