#!/usr/bin/env bash
# The same prebuilt abi3 wheel on another torch: tests/wheel-check.sh with an
# older torch 2.x from PyPI, in a venv of its own (cached per version), with
# no compiler. The wheel is not rebuilt for it: one wheel serves every torch.
# Then the case of a torch changed under a compiled install: the compiled
# modules built in $DEEPNVME_VENV (for its torch) are copied over that venv's
# deepnvme, and DeepSpeed must still get working ops -- the pyo3 front end --
# with one line saying why. The wheel is reinstalled afterwards.
# Usage: tests/other-torch.sh [torch version, default 2.9.1] [pytest args...]
# Not part of run-all.sh (it downloads a second torch); its result is in the
# README ("Front ends").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH=${1:-2.9.1}
shift || true
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
DEEPSPEED_VERSION=${DEEPNVME_DEEPSPEED_VERSION:-0.19.8}
WHEEL_VENV="$VENV-wheel-torch$TORCH-ds$DEEPSPEED_VERSION"  # as tests/wheel-check.sh names it

DEEPNVME_TORCH_VERSION="$TORCH" "$ROOT/tests/wheel-check.sh" "$@"

printf '\n== a torch changed under a compiled install (compiled modules for %s, torch %s here)\n' \
    "$("$VENV/bin/python" -c 'import torch; print("torch " + torch.__version__)')" "$TORCH"
package() { "$1/bin/python" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("deepnvme").origin))'; }
SRC=$(package "$VENV")
DST=$(package "$WHEEL_VENV")
cp "$SRC"/*.so "$SRC/_build_info.json" "$DST/"
trap 'CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$ROOT"/target/wheels/deepnvme-*.whl' EXIT
env -u DEEPNVME_FRONTEND "$WHEEL_VENV/bin/python" - 2> "$ROOT/target/other-torch-stderr.txt" <<'PY'
import os, tempfile
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
assert AsyncIOBuilder().is_compatible() and PinMemoryBuilder().is_compatible()
aio = AsyncIOBuilder().load()
assert aio.__name__ == "deepnvme.frontend", aio.__name__
h = aio.aio_handle()
t = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.uint8))
t.copy_(torch.randint(0, 256, (1 << 20,), dtype=torch.uint8))
with tempfile.TemporaryDirectory(dir=".") as d:
    path = os.path.join(d, "x.bin")
    assert h.sync_pwrite(t, path) == 1
    back = torch.zeros(1 << 20, dtype=torch.uint8)
    assert h.sync_pread(back, path) == 1
    assert torch.equal(back, t)
print("compiled install under another torch: DeepSpeed got", aio.__name__, "and a round trip passed")
PY
grep -v "WARNING" "$ROOT/target/other-torch-stderr.txt" || true
LINES=$(grep -c "DeepSpeed gets the pyo3 front end" "$ROOT/target/other-torch-stderr.txt" || true)
[ "$LINES" = 1 ] || { echo "expected one line saying which front end and why, got $LINES" >&2; exit 1; }
printf '\n== other torch (%s) passed\n' "$TORCH"
