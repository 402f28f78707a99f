"""The pyo3 front end (deepnvme.frontend) on its own terms: numpy arrays and
buffer-protocol objects, read-only buffers, locked memory that its object
owns, one core shared with the compiled modules, the front-end choice, and
a process without torch. These run in both passes of the suite (whatever
DEEPNVME_FRONTEND says): they use deepnvme.frontend directly."""

import mmap
import os

import numpy as np
import pytest
import torch

from _util import PAGE, pattern, run_python

import deepnvme.frontend as fe


@pytest.fixture
def h():
    handle = fe.aio_handle(block_size=8192, queue_depth=4, single_submit=False, overlap_events=True,
                           intra_op_parallelism=2)
    yield handle
    handle.wait()


SIZE = 4 * PAGE + 124  # unaligned (edges go buffered, whole pages direct), even for 2 workers


def test_frontend_exports_deepspeeds_names():
    for name in ("aio_handle", "aio_read", "aio_write", "deepspeed_memcpy", "gds_handle", "pin_handle"):
        assert hasattr(fe, name), name
    assert fe.aio_handle.__module__ == "deepnvme._native"
    for method in ("get_block_size", "get_queue_depth", "get_single_submit", "get_overlap_events",
                   "get_intra_op_parallelism", "get_alignment", "read", "write", "pread", "pwrite",
                   "sync_pread", "sync_pwrite", "async_pread", "async_pwrite", "new_cpu_locked_tensor",
                   "free_cpu_locked_tensor", "is_pinned", "wait"):
        assert hasattr(fe.aio_handle, method), method
        assert hasattr(fe.gds_handle, method), method
    for method in ("new_pinned_device_tensor", "free_pinned_device_tensor", "pin_device_tensor",
                   "unpin_device_tensor"):
        assert hasattr(fe.gds_handle, method), method


def test_defaults_and_keyword_arguments(tmp_path):
    h = fe.aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism()) == (1 << 20, 128, False, False, 1)
    assert h.get_alignment() == 512
    path = str(tmp_path / "kw.bin")
    data = pattern(SIZE, 1)
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert h.pwrite(buffer=src, filename=path, validate=False, **{"async": False}, file_offset=0) == 1
    dst = torch.zeros(SIZE, dtype=torch.uint8)
    assert h.pread(dst, path, False, **{"async": True}) == 0
    assert h.wait() == 1
    assert bytes(dst.numpy()) == data
    dst.zero_()
    assert h.sync_pread(buffer=dst, filename=path, file_offset=0) == 1
    assert bytes(dst.numpy()) == data
    assert h.read(buffer=dst, filename=path, validate=False) == 0
    with pytest.raises(TypeError):
        h.pread(dst, path, False)  # `async` has no default
    with pytest.raises(TypeError):
        h.sync_pread(dst, 3)  # a file name, not an fd


def test_async_pwrite_to_an_fd_positional_and_keyword(tmp_path):
    h = fe.aio_handle()
    path = tmp_path / "fd.bin"
    data = pattern(2 * PAGE, 2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert h.async_pwrite(torch.frombuffer(bytearray(data[:PAGE]), dtype=torch.uint8), fd) == 0
        assert h.async_pwrite(torch.frombuffer(bytearray(data[PAGE:]), dtype=torch.uint8), fd=fd,
                              file_offset=PAGE) == 0
        assert h.wait() == 2
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    with pytest.raises(TypeError):
        h.async_pwrite(torch.zeros(4, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.int64])
def test_numpy_round_trip(h, tmp_path, dtype):
    path = str(tmp_path / "np.bin")
    data = pattern(SIZE - SIZE % 8, 3)
    src = np.frombuffer(bytearray(data), dtype=dtype)
    assert h.sync_pwrite(src, path) == 1
    dst = np.zeros_like(src)
    assert h.async_pread(dst, path) == 0
    assert h.wait() == 1
    assert dst.tobytes() == data


def test_strided_numpy_round_trip(h, tmp_path):
    path = str(tmp_path / "strided.bin")
    base = np.arange(4096 * 2, dtype=np.int32).reshape(4096, 2)
    src = base[:, 0]  # every other element: not contiguous
    assert not src.flags.c_contiguous
    assert h.sync_pwrite(src, path) == 1
    assert open(path, "rb").read() == np.ascontiguousarray(src).tobytes()
    out = np.zeros((4096, 2), dtype=np.int32)
    assert h.sync_pread(out[:, 1], path) == 1
    assert (out[:, 1] == src).all() and (out[:, 0] == 0).all()


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "mmap"])
def test_buffer_protocol_round_trip(h, tmp_path, kind):
    path = str(tmp_path / f"{kind}.bin")
    data = pattern(SIZE, 4)

    def make(initial):
        if kind == "bytearray":
            return bytearray(initial)
        if kind == "memoryview":
            return memoryview(bytearray(initial))
        m = mmap.mmap(-1, len(initial))
        m.write(initial)
        return m

    assert h.sync_pwrite(make(data), path) == 1
    dst = make(bytes(SIZE))
    assert h.async_pread(dst, path) == 0
    assert h.wait() == 1
    assert bytes(dst) == data
    assert fe.aio_write(make(data), path + ".2", 4096, 8, False, False, False) == 0
    back = make(bytes(SIZE))
    assert fe.aio_read(back, path + ".2", 4096, 8, False, False, False) == 0
    assert bytes(back) == data


def test_read_only_buffers(h, tmp_path):
    path = str(tmp_path / "ro.bin")
    data = pattern(SIZE, 5)
    # Writing from read-only memory is fine (bytes, a read-only view, a read-only array).
    assert h.sync_pwrite(data, path) == 1
    assert h.sync_pwrite(memoryview(data), path) == 1
    ro = np.frombuffer(data, dtype=np.uint8)
    assert not ro.flags.writeable
    assert h.sync_pwrite(ro, path) == 1
    assert open(path, "rb").read() == data
    # Reading into it is a clear error, before any I/O.
    for target in (bytes(SIZE), memoryview(bytes(SIZE)), np.frombuffer(bytes(SIZE), dtype=np.uint8)):
        with pytest.raises(TypeError, match="read-only"):
            h.sync_pread(target, path)
        with pytest.raises(TypeError, match="read-only"):
            fe.aio_read(target, path, 4096, 8, False, False, False)
    with pytest.raises(TypeError, match="buffer protocol"):
        h.sync_pwrite(object(), path)
    assert h.wait() == 0


def test_an_async_op_holds_the_buffer_export(h, tmp_path):
    path = str(tmp_path / "hold.bin")
    with open(path, "wb") as f:
        f.write(pattern(SIZE, 6))
    ba = bytearray(SIZE)
    assert h.async_pread(ba, path) == 0
    with pytest.raises(BufferError):
        ba.extend(b"x")  # cannot be resized under the I/O
    assert h.wait() == 1
    ba.extend(b"x")  # released once wait() finished the op
    assert bytes(ba[:SIZE]) == pattern(SIZE, 6)


def test_strided_and_unpinned_tensors(h, tmp_path):
    path = str(tmp_path / "t.bin")
    base = torch.arange(8192, dtype=torch.float32).reshape(4096, 2)
    src = base[:, 1]
    assert h.sync_pwrite(src, path) == 1
    out = torch.zeros(4096, 2, dtype=torch.float32)
    assert h.sync_pread(out[:, 0], path) == 1
    assert torch.equal(out[:, 0], src) and torch.count_nonzero(out[:, 1]) == 0


def test_locked_tensor_owns_its_memory(tmp_path):
    import deepnvme

    nat = deepnvme.native()
    h = fe.aio_handle()
    regions = nat.pinned_stats()[0]
    t = h.new_cpu_locked_tensor(3 * PAGE, torch.empty(0, dtype=torch.float16))
    assert t.dtype == torch.float16 and t.numel() == 3 * PAGE and t.data_ptr() % PAGE == 0
    assert h.is_pinned(t) and h.is_pinned(t[PAGE:])
    assert nat.pinned_stats()[0] == regions + 1
    view = t[10:20]
    del t
    assert nat.pinned_stats()[0] == regions + 1  # a view still holds it
    del view
    assert nat.pinned_stats()[0] == regions  # freed with the last reference
    # free_cpu_locked_tensor frees as DeepSpeed's does; the object stays usable.
    from _util import vmlck_kb

    lck0 = vmlck_kb()
    t = h.new_cpu_locked_tensor(PAGE, torch.empty(0, dtype=torch.uint8))
    t.fill_(7)
    assert vmlck_kb() == lck0 + PAGE // 1024
    assert h.free_cpu_locked_tensor(t) is True
    assert vmlck_kb() == lck0  # unlocked at once, as DeepSpeed's free does
    assert not h.is_pinned(t)
    assert h.free_cpu_locked_tensor(t) is False
    assert int(t.sum()) == 7 * PAGE
    assert nat.pinned_stats()[0] == regions


def test_locked_numpy_and_pin_handle():
    pin = fe.pin_handle()
    a = pin.new_cpu_locked_tensor(1000, np.zeros(0, dtype=np.float32))
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size == 1000
    assert pin.is_pinned(a) and pin.is_pinned(memoryview(a))
    assert not pin.is_pinned(np.zeros(1000, dtype=np.float32))
    assert pin.free_cpu_locked_tensor(locked_tensor=a) is True
    assert not pin.is_pinned(a)
    t = pin.new_cpu_locked_tensor(num_elem=16, example_tensor=torch.empty(0, dtype=torch.int64))
    assert pin.free_cpu_locked_tensor_by_ptr(address=t.data_ptr()) is True


def test_memcpy(h):
    dest = torch.zeros(100, dtype=torch.float32)
    src = torch.arange(100, dtype=torch.float32)
    assert fe.deepspeed_memcpy(dest, src) == 0
    assert torch.equal(dest, src)
    nd = np.zeros(100, dtype=np.float32)
    assert fe.deepspeed_memcpy(nd, np.arange(100, dtype=np.float32)) == 0
    assert (nd == np.arange(100)).all()
    with pytest.raises(RuntimeError, match="4-byte"):
        fe.deepspeed_memcpy(torch.zeros(10, dtype=torch.float16), torch.zeros(10, dtype=torch.float16))


def test_gds_handle_is_a_clear_error_without_gds():
    import deepnvme

    if deepnvme.native().gds_unavailable_reason() is None:
        pytest.skip("GPUDirect Storage is usable here")
    with pytest.raises(RuntimeError):
        fe.gds_handle()


@pytest.mark.parametrize("first", ["compiled", "pyo3"])
def test_one_core_with_both_front_ends(first):
    """Memory locked through one front end is pinned for, and freed by, the other."""
    import deepnvme

    if deepnvme._compiled_mismatch() is not None:
        pytest.skip("the compiled modules are not usable here: " + deepnvme._compiled_mismatch())
    code = f"""
import torch, deepnvme
import deepnvme.frontend as fe
aio = deepnvme._load_compiled("async_io")
pin = deepnvme._load_compiled("pin_memory")
one, other = (aio.aio_handle(), fe.aio_handle()) if "{first}" == "compiled" else (fe.aio_handle(), aio.aio_handle())
t = one.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
assert other.is_pinned(t) and pin.pin_handle().is_pinned(t) and fe.pin_handle().is_pinned(t)
assert other.free_cpu_locked_tensor(t) is True
assert not one.is_pinned(t) and not other.is_pinned(t)
assert one.free_cpu_locked_tensor(t) is False
print("ONE-CORE-OK")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and "ONE-CORE-OK" in proc.stdout, proc.stdout + proc.stderr


def test_no_torch_round_trip(tmp_path):
    """Without torch the front end works on numpy arrays and buffers; locked memory is numpy."""
    code = f"""
import sys
sys.modules["torch"] = None
import numpy as np
import deepnvme.frontend as fe
h = fe.aio_handle()
a = h.new_cpu_locked_tensor(8192, None)
assert isinstance(a, np.ndarray) and a.dtype == np.uint8 and h.is_pinned(a)
a[:] = np.arange(8192) % 251
path = {str(tmp_path / 'nt.bin')!r}
assert h.sync_pwrite(a, path) == 1
b = bytearray(8192)
assert h.sync_pread(b, path) == 1 and bytes(b) == a.tobytes()
import deepnvme
assert deepnvme.load_op("async_io") is fe
assert "torch" not in [m for m, v in sys.modules.items() if v is not None]
print("NO-TORCH-OK")
"""
    proc = run_python(code, env={"DEEPNVME_FRONTEND": ""})
    assert proc.returncode == 0 and "NO-TORCH-OK" in proc.stdout, proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "pyo3 front end" in l]
    # Why: no torch, or (a wheel-only install) no compiled modules at all.
    assert len(lines) == 1 and ("torch is not importable" in lines[0] or "not installed" in lines[0]), proc.stderr


def test_deepspeed_gets_pyo3_on_a_torch_mismatch_with_one_line():
    import importlib.util

    import deepnvme

    if any(importlib.util.find_spec(f"deepnvme.{op}") is None for op in deepnvme.OPS):
        pytest.skip("no compiled modules here (a wheel install): there is nothing to mismatch")
    code = """
import deepnvme
deepnvme.build_info = lambda: {"torch": "1.0.0"}
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
aio = AsyncIOBuilder().load()
assert AsyncIOBuilder().is_compatible()
pin = PinMemoryBuilder().load()
assert aio.__name__ == "deepnvme.frontend" and pin is aio, aio
t = aio.aio_handle().new_cpu_locked_tensor(16, __import__("torch").empty(0))
print("MISMATCH-OK")
"""
    proc = run_python(code, env={"DEEPNVME_FRONTEND": ""})
    assert proc.returncode == 0 and "MISMATCH-OK" in proc.stdout, proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "front end" in l]
    assert len(lines) == 1, proc.stderr
    assert "pyo3" in lines[0] and "torch 1.0.0" in lines[0], lines


@pytest.mark.parametrize("forced", ["pyo3", "compiled"])
def test_deepnvme_frontend_forces_the_choice(forced):
    import deepnvme

    if forced == "compiled" and deepnvme._compiled_mismatch() is not None:
        pytest.skip("the compiled modules are not usable here")
    code = """
from deepspeed.ops.op_builder import AsyncIOBuilder
print("MODULE", AsyncIOBuilder().load().__name__)
"""
    proc = run_python(code, env={"DEEPNVME_FRONTEND": forced})
    expected = "deepnvme.frontend" if forced == "pyo3" else "deepnvme.async_io"
    assert proc.returncode == 0 and f"MODULE {expected}" in proc.stdout, proc.stdout + proc.stderr
    assert "front end" not in proc.stderr, proc.stderr


def test_build_info_records_the_torch_and_pybind11_abi():
    import importlib.util

    import deepnvme

    running = deepnvme.torch_abi()
    assert running["torch"] == torch.__version__
    assert running["pybind11"] and running["pybind11"].startswith("internals v"), running
    if any(importlib.util.find_spec(f"deepnvme.{op}") is None for op in deepnvme.OPS):
        assert deepnvme.build_info() is None  # a wheel install has no compiled modules to describe
        return
    assert deepnvme.build_info() == running, "the compiled modules were built for another torch"


def test_a_description_from_another_build_is_refused_naming_both(tmp_path):
    # The native module unpacks deepnvme._objects.Description by position;
    # a package whose fields differ (another build) must fail the first op
    # with both lists, never move bytes with a misread description.
    code = f"""
        import collections
        import deepnvme._objects as o
        o.Description = collections.namedtuple("Description", o.Description._fields[1:] + ("ptr",))
        import deepnvme.frontend as fe
        h = fe.aio_handle()
        try:
            h.sync_pwrite(bytearray(4096), {str(tmp_path / "x.bin")!r})
        except RuntimeError as e:
            print("REFUSED", e)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "REFUSED" in proc.stdout and "different builds" in proc.stdout, proc.stdout + proc.stderr
    assert 'has fields ["nbytes"' in proc.stdout and 'unpacks ["ptr"' in proc.stdout, proc.stdout
    assert not (tmp_path / "x.bin").exists() or os.path.getsize(tmp_path / "x.bin") == 0
