#!/usr/bin/env bash
# Runs DeepSpeed's own tests for these ops against the installed deepnvme:
#   tests/unit/v1/nvme/  and  tests/unit/v1/pin_memory/test_pin_memory*.py
# Usage: tests/deepspeed-suite.sh /path/to/DeepSpeed/tests [MIX] [TEST_PATH...]
# MIX is a DEEPNVME_OPS value (default `all`: deepnvme provides every op);
# `pin_memory` runs DeepSpeed's own C++ async_io (JIT-built, needs
# libaio-dev; cached in the venv under deepnvme-torch-extensions) on deepnvme's pinned
# manager. MIX `builders` turns deepnvme's hook off and runs against a
# throwaway copy of the installed deepspeed (made here, outside the repository,
# by tests/python/_deepspeed_copy.py) whose builders are redirected to
# deepnvme.op_builder: the ops are JIT-built by DeepSpeed's own jit_load
# (cached in the venv under deepnvme-opbuilder-extensions). With TEST_PATHs (relative to that tests/ folder, e.g.
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
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ "$MIX" = builders ]; then
    unset DEEPNVME_OPS
    export DEEPNVME_DEEPSPEED_HOOK=0
    export TORCH_EXTENSIONS_DIR="$VENV/deepnvme-opbuilder-extensions"
    "$VENV/bin/python" "$ROOT/tests/python/_deepspeed_copy.py" "$WORK/site" >/dev/null
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    # Builds (or finds cached) the ops first, and checks they are the builders' own.
    "$VENV/bin/python" - <<'PY'
import os, deepspeed
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
assert deepspeed.__file__.startswith(os.environ["PYTHONPATH"].split(":")[0]), deepspeed.__file__
for b in (AsyncIOBuilder, PinMemoryBuilder):
    assert b.__module__ == "deepnvme.op_builder", b
    m = b().load()
    assert m.__file__.startswith(os.environ["TORCH_EXTENSIONS_DIR"]), m.__file__
    print(f"DeepSpeed's suite, builders redirected: {b.__name__}().load() -> {m.__file__}")
PY
else
    export DEEPNVME_OPS="$MIX"
    # The stock ops' JIT build is shared with tests/python/test_mix_stock_aio.py (in the venv).
    export TORCH_EXTENSIONS_DIR="$VENV/deepnvme-torch-extensions"
    echo "DeepSpeed's own suite, DEEPNVME_OPS=$MIX: $("$VENV/bin/python" -c 'import deepnvme; print("deepnvme provides", ", ".join(deepnvme.provided_ops()) or "nothing")')"
fi
cp -r "$SRC" "$WORK/tests"
cd "$WORK/tests"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rs "$@"
