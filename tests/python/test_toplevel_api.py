"""The package's top level for Python users without DeepSpeed:
deepnvme.aio_handle, pin_handle, gds_handle, aio_read, aio_write and
deepspeed_memcpy are deepnvme.frontend's, imported on first use, and work
on numpy arrays, buffers and torch tensors, in a process with torch and in
one where torch cannot be imported. These run in every pass of the suite
(whatever DEEPNVME_FRONTEND says): the top level is always the pyo3 front
end, which needs no compiled extension."""

import numpy as np
import pytest
import torch

from _util import PAGE, pattern, run_python

import deepnvme
import deepnvme.frontend as fe

NAMES = ("aio_handle", "pin_handle", "gds_handle", "aio_read", "aio_write", "deepspeed_memcpy")


def test_the_names_are_the_frontends():
    assert deepnvme.FRONTEND_API == NAMES
    for name in NAMES:
        assert getattr(deepnvme, name) is getattr(fe, name), name
        assert name in deepnvme.__all__ and name in dir(deepnvme), name
    with pytest.raises(AttributeError, match="no attribute 'aio_handel'"):
        deepnvme.aio_handel  # noqa: B018  (the typo is the point)


def test_numpy_round_trip_through_the_top_level(tmp_path):
    h = deepnvme.aio_handle(block_size=8192, queue_depth=4, single_submit=False, overlap_events=True,
                            intra_op_parallelism=2)
    a = np.frombuffer(pattern(4 * PAGE, 3), dtype=np.float32).copy()
    path = str(tmp_path / "a.bin")
    assert h.sync_pwrite(a, path) == 1
    b = np.zeros_like(a)
    assert h.async_pread(b, path) == 0 and h.wait() == 1
    assert b.tobytes() == a.tobytes()
    locked = deepnvme.pin_handle().new_cpu_locked_tensor(PAGE, np.zeros(0, dtype=np.int16))
    assert isinstance(locked, np.ndarray) and locked.dtype == np.int16 and h.is_pinned(locked)


def test_functions_and_tensors_through_the_top_level(tmp_path):
    data = pattern(2 * PAGE, 4)
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    path = str(tmp_path / "t.bin")
    assert deepnvme.aio_write(src, path, 4096, 4, False, False, True) == 0
    dst = torch.zeros(2 * PAGE, dtype=torch.uint8)
    assert deepnvme.aio_read(dst, path, 4096, 4, False, False, True) == 0
    assert bytes(dst.numpy()) == data
    out = torch.zeros(16, dtype=torch.float32)
    deepnvme.deepspeed_memcpy(out, torch.arange(16, dtype=torch.float32))
    assert torch.equal(out, torch.arange(16, dtype=torch.float32))


def test_arrays_of_references_are_refused_everywhere(tmp_path):
    """numpy object arrays and structured arrays with object fields hold
    PyObject pointers, not data: every entry point of the top level refuses
    them with TypeError, for reads and writes (a read used to overwrite the
    pointers with file bytes, and the process crashed at `del`)."""
    path = str(tmp_path / "refs.bin")
    with open(path, "wb") as f:
        f.write(pattern(8 * PAGE, 5))
    objects = np.array([object() for _ in range(512)], dtype=object)
    structured = np.zeros(256, dtype=[("x", "<f8"), ("o", "O")])
    nested = np.zeros(128, dtype=[("inner", [("n", "<i4"), ("o", "O")])])
    h = deepnvme.aio_handle(8192, 4, False, True, 1)
    plain = np.zeros(512, dtype=np.float64)
    for buf in (objects, structured, nested, memoryview(objects)):
        calls = [
            lambda: h.sync_pread(buf, path), lambda: h.sync_pwrite(buf, path),
            lambda: h.async_pread(buf, path), lambda: h.async_pwrite(buf, path),
            lambda: h.pread(buf, path, False, False), lambda: h.pwrite(buf, path, False, True),
            lambda: h.read(buf, path, False), lambda: h.write(buf, path, False),
            lambda: deepnvme.aio_read(buf, path, 4096, 4, False, False, False),
            lambda: deepnvme.aio_write(buf, path, 4096, 4, False, False, False),
            lambda: deepnvme.deepspeed_memcpy(buf, plain), lambda: deepnvme.deepspeed_memcpy(plain, buf),
            lambda: h.is_pinned(buf),
        ]
        for call in calls:
            with pytest.raises(TypeError, match="references"):
                call()
    assert h.wait() == 0
    with open(path, "rb") as f:
        assert f.read() == pattern(8 * PAGE, 5), "a refused write changed the file"
    del objects, structured, nested  # the references are intact
    # Structured arrays of plain fields are plain data.
    flat = np.zeros(PAGE // 8, dtype=[("a", "<i4"), ("b", "<f4")])
    assert h.sync_pread(flat, path) == 1 and flat.tobytes() == pattern(8 * PAGE, 5)[:PAGE]


def test_gds_handle_without_gds_is_a_clear_error():
    if deepnvme.native().gds_unavailable_reason() is None:
        pytest.skip("GPUDirect Storage works here")
    with pytest.raises(RuntimeError, match="GPUDirect Storage"):
        deepnvme.gds_handle()


def test_without_torch_and_loaded_only_when_used(tmp_path):
    code = f"""
import sys
sys.modules["torch"] = None   # any `import torch` now fails
import numpy as np
import deepnvme
# The .pth hook imports deepnvme at startup: that alone loads no core.
assert "deepnvme._native" not in sys.modules and "deepnvme.frontend" not in sys.modules
h = deepnvme.aio_handle(1 << 20, 32, False, True, 1)
assert "deepnvme.frontend" in sys.modules
a = np.arange(1 << 16, dtype=np.float32)
path = {str(tmp_path / 'nt.bin')!r}
assert h.sync_pwrite(a, path) == 1
b = np.empty_like(a)
assert h.sync_pread(b, path) == 1 and np.array_equal(a, b)
assert deepnvme.aio_handle is deepnvme.frontend.aio_handle
assert "torch" not in [m for m, v in sys.modules.items() if v is not None]
print("TOP-LEVEL-NO-TORCH-OK")
"""
    proc = run_python(code, env={"DEEPNVME_FRONTEND": ""})
    assert proc.returncode == 0 and "TOP-LEVEL-NO-TORCH-OK" in proc.stdout, proc.stdout + proc.stderr


def test_one_version_everywhere():
    # Cargo.toml's workspace version is the one source: the installed
    # distribution (setup.py or maturin), deepnvme.__version__ and the
    # native module's (CARGO_PKG_VERSION) all say it.
    import importlib.metadata
    import os

    from deepnvme._core_build import cargo_package_version

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cargo = cargo_package_version(os.path.join(root, "Cargo.toml"))
    assert deepnvme.__version__ == cargo
    assert deepnvme.native().__version__ == cargo
    assert importlib.metadata.version("deepnvme") == cargo


@pytest.mark.parametrize("dtype", ["datetime64[ns]", "timedelta64[us]", "U2", "S3", "complex64"])
def test_arrays_of_every_item_size_move_every_byte(tmp_path, dtype):
    """The item size comes from the dtype: a typestr like '<U2' (2
    characters, 8 bytes) or '<M8[ns]' used to give 2 and 1, and the op
    moved a quarter or an eighth of the array, returning success."""
    h = deepnvme.aio_handle()
    raw = pattern(1000 * np.dtype(dtype).itemsize, 7)
    a = np.frombuffer(raw, dtype=np.uint8).view(dtype).copy()
    path = str(tmp_path / "a.bin")
    assert h.sync_pwrite(a, path) == 1
    with open(path, "rb") as f:
        assert f.read() == raw
    b = np.zeros_like(a)
    assert h.sync_pread(b, path) == 1
    assert b.tobytes() == raw


def test_a_read_into_a_numpy_scalar_is_refused(tmp_path):
    """A numpy scalar's array interface is a temporary copy: bytes read
    there were dropped while the call returned success."""
    h = deepnvme.aio_handle()
    a = np.arange(4, dtype=np.float64)
    path = str(tmp_path / "s.bin")
    assert h.sync_pwrite(a, path) == 1
    with pytest.raises(TypeError, match="numpy scalar"):
        h.sync_pread(a[0], path)
    with pytest.raises(TypeError, match="numpy scalar"):
        deepnvme.aio_read(a[1], path, 4096, 4, False, False, False)
    assert h.sync_pwrite(a[2], str(tmp_path / "one.bin")) == 1  # written from: fine
    with open(tmp_path / "one.bin", "rb") as f:
        assert f.read() == a[2].tobytes()


def test_an_async_read_into_an_array_resized_under_it_fails_at_wait(tmp_path):
    """`resize(..., refcheck=False)` moves or shrinks an array's memory while
    a bounced read into it is pending: wait() reports it instead of copying
    into memory the array no longer owns (that corrupted the heap)."""
    path = str(tmp_path / "r.bin")
    with open(path, "wb") as f:
        f.write(pattern(4 << 20, 9))
    proc = run_python(f"""
        import numpy as np, deepnvme
        h = deepnvme.aio_handle()
        a = np.zeros(4 << 20, dtype=np.uint8)
        assert h.async_pread(a, {path!r}) == 0
        a.resize(64, refcheck=False)
        try:
            h.wait()
            print("NO ERROR", flush=True)
        except RuntimeError as e:
            print("RAISED", e, flush=True)
        b = np.zeros(4 << 20, dtype=np.uint8)
        assert h.sync_pread(b, {path!r}) == 1
        print("HANDLE OK", flush=True)
    """, timeout=120)
    assert proc.returncode == 0 and "RAISED" in proc.stdout and "HANDLE OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
