#!/usr/bin/env bash
# The prebuilt-wheel path, end to end:
#   1. maturin builds the abi3 wheel of the pyo3 front end (bindings/wheel),
#      with Rust only (no C++ compiler, no torch, no CUDA), once per run;
#   2. its _native has no libtorch/libc10 (or any CUDA library) in NEEDED;
#   3. a fresh virtual environment (cached per torch/deepspeed version, like
#      bindings/install.sh's) gets torch, deepspeed, pytest and numpy, then
#      the wheel file, with CC=false CXX=false so that nothing can compile;
#   4. the Python suite runs there with DEEPNVME_FRONTEND unset: with no
#      compiled modules DeepSpeed's builders must choose the pyo3 front end
#      by themselves.
# Usage: tests/wheel-check.sh [pytest args...]
# The build venv is $DEEPNVME_VENV (maturin is pip-installed into it when
# missing); the test venv is "$DEEPNVME_VENV-wheel-torch<version>".
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
TORCH_VERSION=${DEEPNVME_TORCH_VERSION:-2.15.0}
DEEPSPEED_VERSION=${DEEPNVME_DEEPSPEED_VERSION:-0.19.8}
PYTHON=${PYTHON:-python3}
WHEEL_VENV="$VENV-wheel-torch$TORCH_VERSION-ds$DEEPSPEED_VERSION"
OUT="$ROOT/target/wheels"
cd "$ROOT"

say() { printf '\n== %s\n' "$*"; }

[ -x "$VENV/bin/python" ] || { echo "no build venv at $VENV: run bindings/install.sh first" >&2; exit 1; }
if ! "$VENV/bin/python" -c 'import maturin' 2>/dev/null; then
    say "installing maturin into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check "maturin>=1.5,<2"
fi

say "building the abi3 wheel (maturin, --features python)"
rm -f "$OUT"/deepnvme-*.whl
PYTHON="$VENV/bin/python" MATURIN="$VENV/bin/maturin" bindings/wheel/build.sh "$OUT"
WHEEL=$(ls "$OUT"/deepnvme-*.whl)
echo "wheel: $WHEEL"

say "checking the wheel: abi3, the .pth, no torch or CUDA library in NEEDED"
"$VENV/bin/python" - "$WHEEL" <<'PY'
import io, re, sys, tempfile, zipfile, os
sys.path.insert(0, "tests/python")
from _elf import read_dynamic
wheel = sys.argv[1]
assert "-abi3-" in os.path.basename(wheel), wheel
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    assert "deepnvme-deepspeed.pth" in names, names
    assert "deepnvme/frontend.py" in names and "deepnvme/_objects.py" in names, names
    sos = [n for n in names if n.endswith(".so")]
    assert len(sos) == 1 and re.match(r"deepnvme/_native\.abi3\.so$", sos[0]), sos
    with tempfile.TemporaryDirectory() as d:
        path = z.extract(sos[0], d)
        needed = read_dynamic(path).needed
bad = [n for n in needed if re.match(r"lib(torch|c10|cuda|cudart|cufile|aio)", n)]
assert not bad, needed
print("files:", ", ".join(n for n in names if not n.endswith("RECORD")))
print("NEEDED:", needed)
PY

if [ ! -x "$WHEEL_VENV/bin/python" ] || ! "$WHEEL_VENV/bin/python" -c 'import torch, deepspeed, pytest, numpy' 2>/dev/null; then
    say "creating $WHEEL_VENV (torch $TORCH_VERSION, deepspeed $DEEPSPEED_VERSION; no compiler)"
    "$PYTHON" -m venv "$WHEEL_VENV"
    CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
        "torch==$TORCH_VERSION" numpy pytest
    CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
        "deepspeed==$DEEPSPEED_VERSION"
fi

say "installing the wheel with no compiler (CC=false CXX=false)"
CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall "$WHEEL"

say "DeepSpeed's loader picks the pyo3 front end by itself"
env -u DEEPNVME_FRONTEND "$WHEEL_VENV/bin/python" - <<'PY'
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
aio = AsyncIOBuilder().load()
assert aio.__name__ == "deepnvme.frontend", aio
assert PinMemoryBuilder().load() is aio and AsyncIOBuilder().is_compatible()
print("AsyncIOBuilder().load() ->", aio.__name__)
PY

say "pytest tests/python on the wheel (pyo3 front end)"
env -u DEEPNVME_FRONTEND PATH="$WHEEL_VENV/bin:$PATH" "$WHEEL_VENV/bin/python" -m pytest tests/python -q \
    -p no:cacheprovider --basetemp="$ROOT/target/pytest-tmp-wheel" "$@"
say "wheel check passed"
