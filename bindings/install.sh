#!/usr/bin/env bash
# Sets up everything the Python side needs, reusing what already exists:
#   1. a virtual environment ($DEEPNVME_VENV, default ~/.cache/deepnvme-venv)
#      with torch, deepspeed, pytest and ninja (pip's cache is reused);
#   2. the deepnvme package built from this checkout and installed into it
#      (rebuilt only when the Rust, C++ or binding sources changed).
# Then it checks that DeepSpeed's own loader returns the Rust-backed modules.
#
# Needs only the Rust toolchain, a C++ compiler and python3 with venv.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
TORCH_VERSION=${DEEPNVME_TORCH_VERSION:-2.15.0}
DEEPSPEED_VERSION=${DEEPNVME_DEEPSPEED_VERSION:-0.19.8}
PYTHON=${PYTHON:-python3}

say() { printf '\n== %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

have_version() {  # have_version PACKAGE VERSION
    [ "$("$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p')" = "$2" ]
}
if have_version torch "$TORCH_VERSION" && have_version deepspeed "$DEEPSPEED_VERSION" \
    && "$PY" -c 'import pytest, ninja' 2>/dev/null; then
    say "torch $TORCH_VERSION and deepspeed $DEEPSPEED_VERSION already installed in $VENV"
else
    say "installing torch $TORCH_VERSION, deepspeed $DEEPSPEED_VERSION, pytest, ninja into $VENV"
    "$PY" -m pip install --disable-pip-version-check "torch==$TORCH_VERSION"
    "$PY" -m pip install --disable-pip-version-check "deepspeed==$DEEPSPEED_VERSION" pytest ninja
fi

# Rebuild deepnvme only when its sources changed since the last install.
list_sources() {  # the build's inputs, NUL-separated (git's list, or find outside a checkout)
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$ROOT" ls-files -z -- Cargo.toml Cargo.lock build.rs src cpp bindings
    else
        (cd "$ROOT" && find Cargo.toml Cargo.lock build.rs src cpp bindings -type f \
            -not -path 'bindings/build/*' -not -path '*/__pycache__/*' -not -name '*.so' -print0 | sort -z)
    fi
}
stamp_of_sources() {
    (cd "$ROOT" && list_sources | xargs -0 sha256sum; "$PY" -m pip show torch deepspeed 2>/dev/null | grep ^Version) \
        | sha256sum | cut -d' ' -f1
}
STAMP_FILE="$VENV/.deepnvme-build-stamp"
STAMP=$(stamp_of_sources)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$STAMP" ] \
    && "$PY" -c 'import torch, deepnvme.async_io, deepnvme.pin_memory, deepnvme.gds' 2>/dev/null; then
    say "deepnvme is up to date in $VENV"
else
    say "building and installing deepnvme (Rust core + DeepSpeed bindings)"
    PATH="$VENV/bin:$PATH" "$PY" -m pip install --disable-pip-version-check --no-build-isolation \
        --no-deps --force-reinstall "$ROOT/bindings"
    echo "$STAMP" > "$STAMP_FILE"
fi

say "checking that the core imports without torch"
"$PY" -c 'import sys; sys.modules["torch"] = None; import deepnvme._native as n; print("deepnvme._native (no torch):", n.engine_name())'

say "checking that DeepSpeed's loader returns the Rust-backed ops"
"$PY" - <<'PY'
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
aio = AsyncIOBuilder().load()
pin = PinMemoryBuilder().load()
assert aio.__name__ == "deepnvme.async_io", aio
assert pin.__name__ == "deepnvme.pin_memory", pin
native = deepnvme.native()
print(f"AsyncIOBuilder().load()   -> {aio.__name__} ({aio.__file__})")
print(f"PinMemoryBuilder().load() -> {pin.__name__}")
print(f"engine: {native.engine_name()}; gds: {deepnvme.op_unavailable_reason('gds') or 'available'}")
PY
echo
echo "Use it with: source $VENV/bin/activate"
