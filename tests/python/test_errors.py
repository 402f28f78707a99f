"""Error paths. The contract (src/ffi.rs): a request DeepSpeed refuses returns
-1 and prints the reason on stderr; a transfer that fails raises RuntimeError
(never a silent success, never an abort); a bad handle config raises."""

import os
import re

import pytest
import torch

from _util import PAGE, pattern, run_python, tensor_from_bytes


def _err(capfd):
    out = capfd.readouterr()
    return out.err + out.out


@pytest.mark.parametrize("method", ["sync_pread", "pread", "async_pread", "read"])
def test_read_past_eof_returns_minus_one_naming_file_and_sizes(handle, data_dir, capfd, method):
    p = data_dir / "small.bin"
    p.write_bytes(pattern(1000, 1))
    dst = torch.full((2000,), 7, dtype=torch.uint8)
    capfd.readouterr()
    if method == "sync_pread":
        rc = handle.sync_pread(dst, str(p))
    elif method == "pread":
        rc = handle.pread(dst, str(p), False, False)
    elif method == "async_pread":
        rc = handle.async_pread(dst, str(p))
    else:
        rc = handle.read(dst, str(p), False)
    assert rc == -1
    err = _err(capfd)
    assert str(p) in err, err
    assert "2000" in err and "1000" in err, err
    assert bool((dst == 7).all()), "a refused read wrote into the buffer"
    assert handle.wait() == 0, "a refused op was queued"
    # the handle keeps working
    ok = torch.zeros(1000, dtype=torch.uint8)
    assert handle.sync_pread(ok, str(p)) == 1


def test_read_past_eof_with_offset(handle, data_dir, capfd):
    p = data_dir / "small.bin"
    p.write_bytes(pattern(3 * PAGE, 1))
    capfd.readouterr()
    assert handle.sync_pread(torch.zeros(2 * PAGE, dtype=torch.uint8), str(p), 2 * PAGE) == -1
    err = _err(capfd)
    assert str(p) in err and str(2 * PAGE) in err and str(3 * PAGE) in err, err


@pytest.mark.parametrize("method", ["sync_pread", "async_pread", "pread", "read"])
def test_nonexistent_file_returns_minus_one_naming_file_and_errno(handle, data_dir, capfd, method):
    p = data_dir / "does-not-exist.bin"
    dst = torch.zeros(PAGE, dtype=torch.uint8)
    capfd.readouterr()
    rc = {
        "sync_pread": lambda: handle.sync_pread(dst, str(p)),
        "async_pread": lambda: handle.async_pread(dst, str(p)),
        "pread": lambda: handle.pread(dst, str(p), False, True),
        "read": lambda: handle.read(dst, str(p), False),
    }[method]()
    assert rc == -1
    err = _err(capfd)
    assert str(p) in err, err
    assert re.search(r"errno\s*:?\s*2\b|ENOENT", err), err
    assert not p.exists()
    assert handle.wait() == 0


def test_write_into_missing_directory_returns_minus_one(handle, data_dir, capfd):
    p = data_dir / "no-such-dir" / "x.bin"
    capfd.readouterr()
    assert handle.sync_pwrite(tensor_from_bytes(pattern(PAGE, 1)), str(p)) == -1
    err = _err(capfd)
    assert str(p) in err and re.search(r"errno\s*:?\s*2\b|ENOENT", err), err


@pytest.mark.parametrize("iop,nbytes", [(2, 1001), (3, 3 * PAGE + 1), (4, 4098)])
def test_size_not_divisible_by_parallelism_returns_minus_one(new_handle, data_dir, capfd, iop, nbytes):
    h = new_handle(4096, 4, False, False, iop)
    p = data_dir / "div.bin"
    p.write_bytes(pattern(nbytes, 2))
    capfd.readouterr()
    assert h.sync_pwrite(tensor_from_bytes(pattern(nbytes, 3)), str(p)) == -1
    assert h.sync_pread(torch.zeros(nbytes, dtype=torch.uint8), str(p)) == -1
    assert h.async_pwrite(tensor_from_bytes(pattern(nbytes, 3)), str(p)) == -1
    err = _err(capfd)
    assert "intra_op_parallelism" in err and str(nbytes) in err, err
    assert p.read_bytes() == pattern(nbytes, 2), "a refused write changed the file"
    assert h.wait() == 0


@pytest.mark.parametrize("offset", [-1, -4096])
def test_negative_file_offset_returns_minus_one(handle, data_dir, capfd, offset):
    p = data_dir / "neg.bin"
    p.write_bytes(pattern(2 * PAGE, 4))
    t = torch.zeros(PAGE, dtype=torch.uint8)
    capfd.readouterr()
    assert handle.sync_pread(t, str(p), offset) == -1
    assert handle.sync_pwrite(t, str(p), offset) == -1
    assert handle.async_pread(t, str(p), offset) == -1
    assert handle.async_pwrite(t, str(p), offset) == -1
    fd = os.open(p, os.O_WRONLY)
    try:
        assert handle.async_pwrite(t, fd, offset) == -1
        os.fstat(fd)
    finally:
        os.close(fd)
    assert handle.read(t, str(p), False, offset) == -1
    assert handle.write(t, str(p), False, offset) == -1
    err = _err(capfd)
    assert str(offset) in err, err
    assert p.read_bytes() == pattern(2 * PAGE, 4)
    assert handle.wait() == 0


@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_failed_transfer_raises_at_wait_naming_errno(handle, locked, data_dir, buf_kind):
    """async_pwrite through a read-only fd: EBADF. The C++ ignored it."""
    p = data_dir / "ro.bin"
    original = pattern(2 * PAGE, 5)
    p.write_bytes(original)
    fd = os.open(p, os.O_RDONLY)
    try:
        data = pattern(2 * PAGE, 6)
        t = locked(2 * PAGE) if buf_kind == "locked" else torch.empty(2 * PAGE, dtype=torch.uint8)
        t.copy_(tensor_from_bytes(data))
        assert handle.async_pwrite(t, fd) == 0
        with pytest.raises(RuntimeError) as info:
            handle.wait()
        msg = str(info.value)
        assert re.search(r"EBADF|errno\s*:?\s*9\b|Bad file descriptor", msg), msg
        os.fstat(fd)  # the caller's fd is still open after the failure
    finally:
        os.close(fd)
    assert p.read_bytes() == original
    # the failed op is gone; the handle keeps working
    assert handle.wait() == 0
    assert handle.sync_pwrite(t, str(p)) == 1
    assert p.read_bytes() == data


def test_failure_among_many_ops_is_reported_and_others_finish(handle, data_dir):
    ro = data_dir / "ro.bin"
    ro.write_bytes(b"x" * PAGE)
    fd = os.open(ro, os.O_RDONLY)
    datas = [pattern(PAGE, 10 + i) for i in range(3)]
    try:
        assert handle.async_pwrite(tensor_from_bytes(datas[0]), str(data_dir / "a")) == 0
        assert handle.async_pwrite(tensor_from_bytes(datas[1]), fd) == 0
        assert handle.async_pwrite(tensor_from_bytes(datas[2]), str(data_dir / "c")) == 0
        with pytest.raises(RuntimeError):
            handle.wait()
    finally:
        os.close(fd)
    assert (data_dir / "a").read_bytes() == datas[0]
    assert (data_dir / "c").read_bytes() == datas[2]
    assert handle.wait() == 0


def test_blocking_call_raises_when_earlier_async_op_failed(handle, data_dir):
    ro = data_dir / "ro.bin"
    ro.write_bytes(b"x" * PAGE)
    fd = os.open(ro, os.O_RDONLY)
    try:
        assert handle.async_pwrite(tensor_from_bytes(pattern(PAGE, 1)), fd) == 0
        with pytest.raises(RuntimeError):
            handle.sync_pwrite(tensor_from_bytes(pattern(PAGE, 2)), str(data_dir / "ok"))
    finally:
        os.close(fd)
    assert (data_dir / "ok").read_bytes() == pattern(PAGE, 2)
    assert handle.wait() == 0


def test_read_from_a_directory_fails_loudly(handle, data_dir):
    """A path that opens but cannot be read: -1 or RuntimeError, never success."""
    d = data_dir / "adir"
    d.mkdir()
    dst = torch.full((16,), 9, dtype=torch.uint8)
    try:
        rc = handle.sync_pread(dst, str(d))
    except RuntimeError as e:
        assert str(d) in str(e)
    else:
        assert rc == -1
    assert handle.wait() == 0


def test_write_to_a_bad_caller_fd_returns_minus_one(handle, data_dir, capfd):
    w = max(int(x) for x in os.listdir("/proc/self/fd")) + 100
    with pytest.raises(OSError):
        os.fstat(w)  # not an open descriptor
    capfd.readouterr()
    assert handle.async_pwrite(tensor_from_bytes(pattern(PAGE, 1)), w) == -1
    err = _err(capfd)
    assert str(w) in err and re.search(r"EBADF|errno\s*:?\s*9\b|Bad file descriptor", err), err
    assert handle.wait() == 0


def test_negative_fd_message_names_the_fd(handle, capfd):
    capfd.readouterr()
    assert handle.async_pwrite(tensor_from_bytes(pattern(PAGE, 1)), -5) == -1
    err = _err(capfd)
    assert "-5" in err, err


@pytest.mark.parametrize("args", [
    (0, 128, False, False, 1),
    (-4096, 128, False, False, 1),
    (4096, -1, False, False, 1),
    (4096, 0, False, False, 1),
    (4096, 8, False, False, 0),
    (4096, 8, False, False, -2),
], ids=["block0", "block-neg", "qd-neg", "qd0", "iop0", "iop-neg"])
def test_invalid_handle_config_raises(aio, args):
    with pytest.raises(RuntimeError) as info:
        aio.aio_handle(*args)
    assert re.search(r"block_size|queue_depth|intra_op_parallelism", str(info.value)), str(info.value)


def test_wrong_argument_types_raise_type_error(handle, data_dir):
    with pytest.raises(TypeError):
        handle.sync_pread("not a tensor", str(data_dir / "x"))
    with pytest.raises(TypeError):
        handle.async_pwrite(torch.zeros(4, dtype=torch.uint8), 1.5)


def test_meta_tensor_is_refused(handle, data_dir, capfd):
    p = data_dir / "meta.bin"
    p.write_bytes(b"\0" * PAGE)
    t = torch.empty(PAGE, dtype=torch.uint8, device="meta")
    try:
        rc = handle.sync_pread(t, str(p))
    except RuntimeError:
        return
    assert rc == -1


@pytest.mark.parametrize("method", ["sync_pread", "sync_pwrite", "async_pwrite"])
def test_sparse_tensor_is_refused_by_name(handle, data_dir, capfd, method):
    """A sparse tensor has no one block of bytes: -1 and a message that says
    so (the compiled front end raised torch's copy error, naming 0 bytes)."""
    p = data_dir / "sparse.bin"
    p.write_bytes(b"\0" * PAGE)
    t = torch.ones(PAGE, dtype=torch.uint8).to_sparse()
    rc = getattr(handle, method)(t, str(p))
    if method.startswith("async"):
        assert rc == -1 or handle.wait() == -1
    else:
        assert rc == -1
    assert "sparse" in capfd.readouterr().err
    assert p.read_bytes() == b"\0" * PAGE


def _arrays_of_references():
    """Buffers whose items are references to Python objects, by name."""
    import numpy as np

    objects = np.array([object() for _ in range(512)], dtype=object)
    return {
        "object": objects,
        "structured": np.zeros(256, dtype=[("x", "<f8"), ("o", "O")]),
        "strided": np.empty((512, 2), dtype=object)[:, 0],
        "memoryview": memoryview(objects),
    }


@pytest.mark.parametrize("kind", ["object", "structured", "strided", "memoryview"])
@pytest.mark.parametrize("method", ["sync_pread", "sync_pwrite", "async_pread", "async_pwrite", "pread", "pwrite",
                                    "read", "write"])
def test_buffers_of_references_are_refused_with_type_error(handle, data_dir, method, kind):
    """An object array's bytes are PyObject pointers: a read would overwrite
    them with file bytes (a crash at the next refcount change), a write would
    put heap addresses in the file. Every call refuses them, on both front
    ends (the compiled ones take only tensors)."""
    buf = _arrays_of_references()[kind]
    p = data_dir / "refs.bin"
    p.write_bytes(pattern(8 * PAGE, 3))
    call = {
        "sync_pread": lambda: handle.sync_pread(buf, str(p)),
        "sync_pwrite": lambda: handle.sync_pwrite(buf, str(p)),
        "async_pread": lambda: handle.async_pread(buf, str(p)),
        "async_pwrite": lambda: handle.async_pwrite(buf, str(p)),
        "pread": lambda: handle.pread(buf, str(p), False, False),
        "pwrite": lambda: handle.pwrite(buf, str(p), False, False),
        "read": lambda: handle.read(buf, str(p), False),
        "write": lambda: handle.write(buf, str(p), False),
    }[method]
    with pytest.raises(TypeError):
        call()
    assert handle.wait() == 0, "a refused op was queued"
    assert p.read_bytes() == pattern(8 * PAGE, 3), "a refused write changed the file"
    if kind != "memoryview":
        del buf  # the references are intact: no crash when they are released


FIFO_CHILD = r"""
import os, sys, time
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder

aio = AsyncIOBuilder().load()
fifo = FIFO
os.mkfifo(fifo)
h = aio.aio_handle(4096, 4, False, False, 2)
buf = torch.zeros(4096, dtype=torch.uint8)
locked = h.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
calls = {
    "sync_pread": lambda: h.sync_pread(buf, fifo),
    "sync_pwrite": lambda: h.sync_pwrite(buf, fifo),
    "async_pread": lambda: h.async_pread(locked, fifo),
    "async_pwrite": lambda: h.async_pwrite(locked, fifo),
    "pread": lambda: h.pread(buf, fifo, False, True),
    "pwrite": lambda: h.pwrite(locked, fifo, False, False),
    "read": lambda: h.read(buf, fifo, False),
    "write": lambda: h.write(locked, fifo, False),
    "aio_read": lambda: aio.aio_read(buf, fifo, 4096, 4, False, False, False),
    "aio_write": lambda: aio.aio_write(buf, fifo, 4096, 4, False, False, False),
}
r, w = os.pipe()
calls["async_pwrite_pipe_fd"] = lambda: h.async_pwrite(locked, w)
for name, call in calls.items():
    t0 = time.monotonic()
    print("CALL", name, flush=True)
    print("RC", name, call(), round(time.monotonic() - t0, 3), flush=True)
    sys.stderr.flush()
print("WAIT", h.wait(), flush=True)
h.free_cpu_locked_tensor(locked)
"""


def test_an_op_on_a_fifo_with_no_peer_fails_at_once(data_dir):
    """Every call on a fifo nobody has open (and on a pipe's fd) returns -1
    at once, naming the file and ESPIPE, instead of waiting for ever in
    open(2) for the other end."""
    fifo = str(data_dir / "p")
    proc = run_python(f"FIFO = {fifo!r}\n" + FIFO_CHILD, timeout=120)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out + err[-3000:]
    rcs = [line.split() for line in out.splitlines() if line.startswith("RC ")]
    assert len(rcs) == 11, out
    for _, name, rc, took in rcs:
        assert rc == "-1", f"{name} on a fifo returned {rc}: {out}"
        assert float(took) < 5, f"{name} took {took} s"
    assert "WAIT 0" in out, out
    assert err.count(fifo) >= 10 and "fifo" in err and "errno 29" in err, err


@pytest.mark.parametrize("variable, value", [("DEEPNVME_BOUNCE_MAX_MB", "64MB"), ("DEEPNVME_HUGE_PAGES", "disable"),
                                              ("DEEPNVME_LOG", "verbose")])
def test_a_malformed_knob_refuses_the_handle_naming_it(variable, value):
    """A knob whose value cannot be read is not silently replaced by its
    default: creating a handle raises naming the variable and the value."""
    proc = run_python("""
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder
        aio = AsyncIOBuilder().load()
        try:
            aio.aio_handle(1 << 20, 8, False, True, 1)
            print("CREATED", flush=True)
        except Exception as e:
            print("RAISED", type(e).__name__, e, flush=True)
    """, env={variable: value})
    out = proc.stdout
    assert proc.returncode == 0 and "RAISED" in out, out + proc.stderr[-3000:]
    assert f'{variable}="{value}"' in out, out


def test_a_failed_copy_names_the_op_without_a_backtrace(handle, data_dir):
    """A copy torch refuses (a read into an expand()ed tensor, whose
    elements share memory) raises naming the file and the offset, in a few
    lines: torch's C++ backtrace is left out."""
    p = data_dir / "src.bin"
    p.write_bytes(pattern(4096, 3))
    with pytest.raises(RuntimeError) as raised:
        handle.sync_pread(torch.zeros(1, dtype=torch.uint8).expand(4096), str(p))
    text = str(raised.value)
    assert str(p) in text and "offset 0" in text, text
    assert "frame #" not in text and len(text.splitlines()) <= 3, text
