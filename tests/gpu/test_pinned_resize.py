"""Direct I/O never lands in memory torch freed (needs CUDA: CPU-only torch
cannot pin). A torch-pinned tensor goes straight to the I/O; a growing
``resize_`` while its op is in flight would free those bytes into torch's
pinned cache, for the next ``pin_memory()`` to get.

* compiled front end: the storage is held unresizable for the op's life
  (src/resize_hold.rs), so ``resize_`` raises RuntimeError, the bytes stay
  where the op put them, and ``resize_`` works again once ``wait()`` is done;
* pyo3 front end (no access to the StorageImpl): such a tensor bounces, so
  the kernel never writes it; a ``resize_`` is then allowed, and ``wait()``
  reports the moved tensor instead of copying into it.

Each front end runs in a child interpreter (DEEPNVME_FRONTEND). Run by
tests/gpu/run.sh; skipped without CUDA.
"""

import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch pin_memory)", allow_module_level=True)

MiB = 1 << 20

CHILD = r"""
import os, sys, torch, deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder

aio = AsyncIOBuilder().load()
frontend = deepnvme.choose_frontend()[0]
folder = sys.argv[1]
n = 64 << 20
data = torch.randint(0, 256, (n,), dtype=torch.uint8)
path = os.path.join(folder, "pinned-resize.bin")
with open(path, "wb") as f:
    f.write(data.numpy().tobytes())
h = aio.aio_handle(1 << 20, 8, False, True, 2)
print("FRONTEND", frontend, flush=True)

def wait():
    try:
        return str(h.wait())
    except RuntimeError as e:
        return "ERROR " + str(e).splitlines()[0]

def try_resize(t, nbytes):
    try:
        t.resize_(nbytes)
        return "RESIZED"
    except RuntimeError as e:
        return "REFUSED " + str(e).splitlines()[0]

# 0. Does a pinned tensor go direct? (Bounced bytes are counted for ops that succeed.)
probe = torch.zeros(n, dtype=torch.uint8).pin_memory()
bounced = deepnvme.stats()["bounced_bytes"]
assert h.sync_pread(probe, path) == 1 and torch.equal(probe, data)
print("BOUNCED", deepnvme.stats()["bounced_bytes"] - bounced, flush=True)

# 1. An async read into a pinned tensor; resize_ bigger while it is in flight.
buf = torch.zeros(n, dtype=torch.uint8).pin_memory()
assert buf.is_pinned() and h.is_pinned(buf)
storage = buf.untyped_storage()
ptr = storage.data_ptr()
assert h.async_pread(buf, path) == 0
print("READ-RESIZE", try_resize(buf, 2 * n), flush=True)
print("STORAGE-KEPT", storage.data_ptr() == ptr, flush=True)
print("WAIT", wait(), flush=True)
print("BYTES-OK", torch.equal(buf[:n], data), flush=True)
print("AFTER-RESIZE", try_resize(buf, 2 * n), flush=True)

# 2. Two reads into halves of one pinned tensor (one storage, two holds):
# still held after the first is done, free after both.
half = n // 2
buf = torch.zeros(n, dtype=torch.uint8).pin_memory()
assert h.async_pread(buf[:half], path) == 0
assert h.async_pread(buf[half:], path, half) == 0
print("NESTED-RESIZE", try_resize(buf, 2 * n), flush=True)
print("NESTED-WAIT", wait(), torch.equal(buf, data), flush=True)
print("NESTED-AFTER", try_resize(buf, 2 * n), flush=True)

# 3. An async write from a pinned tensor: the file gets the bytes given.
src = data.clone().pin_memory()
out = os.path.join(folder, "pinned-resize-out.bin")
assert h.async_pwrite(src, out) == 0
print("WRITE-RESIZE", try_resize(src, 2 * n), flush=True)
print("WRITE-WAIT", wait(), flush=True)
with open(out, "rb") as f:
    print("FILE-OK", f.read() == data.numpy().tobytes(), flush=True)
"""


def run_child(frontend, folder):
    env = dict(os.environ, DEEPNVME_FRONTEND=frontend)
    env.pop("DEEPNVME_OPS", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, folder], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = {}
    for line in proc.stdout.splitlines():
        key, _, rest = line.partition(" ")
        lines[key] = rest
    assert lines.get("FRONTEND") == frontend, proc.stdout
    return lines, proc.stdout


@pytest.fixture
def folder():
    root = os.environ.get("DEEPNVME_GPU_TEST_DIR", os.path.join(os.getcwd(), "target", "gpu-test"))
    os.makedirs(root, exist_ok=True)
    return root


def test_compiled_front_end_holds_a_pinned_storage_unresizable(folder):
    lines, out = run_child("compiled", folder)
    assert lines["READ-RESIZE"].startswith("REFUSED"), out
    assert lines["STORAGE-KEPT"] == "True", out
    assert lines["WAIT"] == "1" and lines["BYTES-OK"] == "True", out
    assert lines["BOUNCED"] == "0", f"the pinned tensor bounced: the test tested nothing\n{out}"
    assert lines["AFTER-RESIZE"] == "RESIZED", f"the storage stayed unresizable after wait()\n{out}"
    assert lines["NESTED-RESIZE"].startswith("REFUSED"), out
    assert lines["NESTED-WAIT"] == "2 True", out
    assert lines["NESTED-AFTER"] == "RESIZED", out
    assert lines["WRITE-RESIZE"].startswith("REFUSED"), out
    assert lines["WRITE-WAIT"] == "1" and lines["FILE-OK"] == "True", out


def test_pyo3_front_end_bounces_a_pinned_tensor(folder):
    lines, out = run_child("pyo3", folder)
    assert int(lines["BOUNCED"]) >= 64 * MiB, f"the pinned tensor went direct\n{out}"
    # resize_ cannot be stopped here; the reads never wrote into the
    # tensor's memory, and wait() says it moved instead of copying into it.
    assert lines["READ-RESIZE"] == "RESIZED", out
    assert lines["WAIT"].startswith("ERROR") and "storage replaced" in lines["WAIT"], out
    assert lines["NESTED-RESIZE"] == "RESIZED", out
    assert lines["NESTED-WAIT"].startswith("ERROR") and "storage replaced" in lines["NESTED-WAIT"], out
    # A bounced write took its bytes at submit.
    assert lines["WRITE-RESIZE"] == "RESIZED", out
    assert lines["WRITE-WAIT"] == "1" and lines["FILE-OK"] == "True", out
