#!/usr/bin/env bash
# The prebuilt-wheel path, end to end:
#   1. maturin builds the abi3 wheel of the pyo3 front end (bindings/wheel),
#      with Rust only (no C++ compiler, no torch, no CUDA), once per run;
#   2. its _native has no libtorch/libc10 (or any CUDA library) in NEEDED;
#   3. a fresh virtual environment (cached per torch/deepspeed version, like
#      bindings/install.sh's) gets torch, deepspeed, pytest and numpy, then
#      the wheel file, with CC=false CXX=false so that nothing can compile;
#   4. a venv with no torch at all (numpy only) gets the same wheel, and
#      numpy arrays, bytearray, memoryview and mmap round-trip through it;
#   5. the Python suite runs there with DEEPNVME_FRONTEND unset: with no
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
if ! "$VENV/bin/python" -c 'import maturin, ziglang' 2>/dev/null || [ ! -x "$VENV/bin/cargo-zigbuild" ]; then
    say "installing maturin, ziglang and cargo-zigbuild into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check "maturin>=1.5,<2" "ziglang>=0.13" \
        "cargo-zigbuild>=0.19"
fi

say "building the wheel (pyproject.toml: maturin --zig, manylinux2014, the CLI inside)"
rm -f "$OUT"/deepnvme-*.whl
PYTHON="$VENV/bin/python" bindings/wheel/build.sh "$OUT"
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

NOTORCH_VENV="$VENV-wheel-notorch"
say "the wheel with no torch installed at all ($NOTORCH_VENV: numpy only, no compiler)"
if [ ! -x "$NOTORCH_VENV/bin/python" ] || ! "$NOTORCH_VENV/bin/python" -c 'import numpy' 2>/dev/null; then
    "$PYTHON" -m venv "$NOTORCH_VENV"
    CC=false CXX=false "$NOTORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check numpy
fi
CC=false CXX=false "$NOTORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --no-deps --force-reinstall "$WHEEL"
NOTORCH_DIR=$(mktemp -d "$ROOT/target/notorch.XXXXXX")
env -u DEEPNVME_FRONTEND "$NOTORCH_VENV/bin/python" - "$NOTORCH_DIR" <<'PY'
import importlib.util, mmap, os, sys
import numpy as np
assert importlib.util.find_spec("torch") is None, "torch is installed in the no-torch venv"
import deepnvme
assert deepnvme.load_op("async_io").__name__ == "deepnvme.frontend"
import deepnvme.frontend as fe
d = sys.argv[1]
# The top level serves the same API (deepnvme.frontend's) for Python users without DeepSpeed.
assert deepnvme.aio_handle is fe.aio_handle and deepnvme.pin_handle is fe.pin_handle
h = deepnvme.aio_handle(block_size=8192, queue_depth=4, single_submit=False, overlap_events=True,
                        intra_op_parallelism=2)
locked = h.new_cpu_locked_tensor(1 << 20, np.zeros(0, dtype=np.float32))
assert isinstance(locked, np.ndarray) and locked.dtype == np.float32 and h.is_pinned(locked)
locked[:] = np.arange(locked.size, dtype=np.float32)
assert h.sync_pwrite(locked, os.path.join(d, "a.bin")) == 1
back = np.zeros_like(locked)
assert h.async_pread(back, os.path.join(d, "a.bin")) == 0 and h.wait() == 1
assert np.array_equal(back, locked)
raw = bytearray(4096 * 3 + 100)
raw[:] = os.urandom(len(raw))
assert h.sync_pwrite(memoryview(raw), os.path.join(d, "b.bin")) == 1
out = bytearray(len(raw))
assert h.sync_pread(out, os.path.join(d, "b.bin")) == 1 and out == raw
with mmap.mmap(-1, len(raw)) as m:
    assert h.sync_pread(m, os.path.join(d, "b.bin")) == 1 and m[:] == raw
try:
    h.sync_pread(bytes(len(raw)), os.path.join(d, "b.bin"))
    raise SystemExit("a read into read-only bytes was accepted")
except TypeError as e:
    assert "read-only" in str(e), e
assert h.free_cpu_locked_tensor(locked) is True
print("no torch installed: numpy, bytearray, memoryview and mmap round trips passed")
PY
rm -rf "$NOTORCH_DIR"

say "pytest tests/python on the wheel (pyo3 front end)"
env -u DEEPNVME_FRONTEND PATH="$WHEEL_VENV/bin:$PATH" "$WHEEL_VENV/bin/python" -m pytest tests/python -q \
    -p no:cacheprovider --basetemp="$ROOT/target/pytest-tmp-wheel" "$@"
say "wheel check passed"
