#!/usr/bin/env bash
# GPU check of deepnvme's GPUDirect Storage path. Needs an NVIDIA GPU; meant
# to finish in a few minutes from a bare machine. It:
#   1. picks a Python with CUDA torch (python3 if its torch sees a GPU, else a
#      venv with torch from PyPI);
#   2. installs deepspeed 0.19.8 and pytest if missing: from PyPI, or offline
#      from $DEEPNVME_WHEELHOUSE (a folder of wheels) on a machine without
#      network;
#   3. builds and installs deepnvme from this checkout: with cargo if present,
#      else with the Rust core prebuilt in $DEEPNVME_PREBUILT_CORE
#      (tests/gpu/stage-core.sh makes one);
#   4. runs tests/gpu/test_gds.py: device round trips at offsets, registered,
#      unregistered and narrow buffers, pin/unpin, async queues, CPU tensors
#      through gds_handle, aio_handle's bounce path for CUDA tensors, and GB/s
#      of gds and of the bounce path side by side; and
#      tests/gpu/test_pinned_resize.py: a torch-pinned tensor's bytes stay put
#      while a direct op uses them (resize_ refused, or the tensor bounced),
#      on both front ends.
#
# cuFile reads file-system properties from udev. On a throwaway VM without a
# udev database, DEEPNVME_GPU_FAKE_UDEV=1 writes the record cuFile needs for
# the test directory's block device (compatibility mode); never on a real host.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
say() { printf '\n== [%4ss] %s\n' "$SECONDS" "$*"; }

nvidia-smi -L || { echo "tests/gpu/run.sh: no NVIDIA GPU (nvidia-smi failed)"; exit 2; }

PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "creating a venv with CUDA torch from PyPI"
    python3 -m venv "$ROOT/target/gpu-venv"
    PY="$ROOT/target/gpu-venv/bin/python"
    "$PY" -m pip install -q torch
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

PIP_FROM=()
if [ -n "${DEEPNVME_WHEELHOUSE:-}" ]; then PIP_FROM=(--no-index --find-links "$DEEPNVME_WHEELHOUSE"); fi
if ! "$PY" -c 'import deepspeed, pytest' 2>/dev/null; then
    say "installing deepspeed 0.19.8 and pytest"
    if [ -n "${DEEPNVME_WHEELHOUSE:-}" ]; then
        # Offline: the wheelhouse holds deepspeed and the dependencies the
        # machine lacks; torch and the rest are already there.
        "$PY" -m pip install -q --no-deps "${PIP_FROM[@]}" "$DEEPNVME_WHEELHOUSE"/*.whl
    else
        "$PY" -m pip install -q deepspeed==0.19.8 pytest ninja
    fi
fi

say "building deepnvme"
if ! command -v cargo >/dev/null && [ -z "${DEEPNVME_PREBUILT_CORE:-}" ]; then
    echo "tests/gpu/run.sh: needs cargo (https://rustup.rs) or DEEPNVME_PREBUILT_CORE"; exit 2
fi
MAX_JOBS=${MAX_JOBS:-$(nproc)} PATH="$(dirname "$PY"):$PATH" \
    "$PY" -m pip install -q --no-build-isolation --no-deps --force-reinstall "$ROOT/bindings"
"$PY" -c 'import deepnvme; print("gds:", deepnvme.op_unavailable_reason("gds") or "available"); print(deepnvme.native().gds_environment())'

TEST_DIR=${DEEPNVME_GPU_TEST_DIR:-$ROOT/target/gpu-test}
mkdir -p "$TEST_DIR"
if [ "${DEEPNVME_GPU_FAKE_UDEV:-0}" = 1 ]; then
    REC=/run/udev/data/b$("$PY" -c 'import os,sys; d=os.stat(sys.argv[1]).st_dev; print(f"{os.major(d)}:{os.minor(d)}")' "$TEST_DIR")
    if [ ! -e "$REC" ]; then
        say "writing a udev record for cuFile at $REC (DEEPNVME_GPU_FAKE_UDEV=1)"
        FSTYPE=$(stat -f -c '%T' "$TEST_DIR"); [ "$FSTYPE" = ext2/ext3 ] && FSTYPE=ext4
        mkdir -p /run/udev/data
        printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$FSTYPE" > "$REC"
    fi
fi

say "running tests/gpu/test_gds.py and tests/gpu/test_pinned_resize.py"
DEEPNVME_GPU_TEST_DIR="$TEST_DIR" "$PY" -m pytest -p no:cacheprovider -q -s -rs tests/gpu/test_gds.py \
    tests/gpu/test_pinned_resize.py
say "done"
