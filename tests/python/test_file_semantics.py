"""What lands in the file: offset partitions, writes into the middle of an
existing file (no O_TRUNC), the fd overload (never closes the caller's fd),
sizes and offsets that are not O_DIRECT-aligned (the C++ wrote nothing).
"""

import fcntl
import os

import pytest
import torch

from _util import PAGE, fill, pattern, tbytes, tensor_from_bytes

PART_SIZES = {
    "aligned": [4 * PAGE, 4 * PAGE, 4 * PAGE, 4 * PAGE],
    "unaligned": [3 * PAGE + 2, 1000, 2 * PAGE + 10, 6],
}


@pytest.mark.parametrize("sizes", list(PART_SIZES), ids=list(PART_SIZES))
@pytest.mark.parametrize("use_fd", [False, True], ids=["path", "fd"])
@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_offset_partitions_write_then_read(new_handle, locked, data_dir, sizes, use_fd, buf_kind):
    h = new_handle(4096, 4, False, True, 2)
    sizes = PART_SIZES[sizes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    parts = [pattern(s, 200 + i) for i, s in enumerate(sizes)]
    p = data_dir / "parts.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600) if use_fd else None
    srcs = []
    try:
        # Submit the parts in reverse order, all in flight at once.
        for i in reversed(range(len(sizes))):
            t = locked(sizes[i]) if buf_kind == "locked" else torch.empty(sizes[i], dtype=torch.uint8)
            fill(t, parts[i])
            srcs.append(t)
            target = fd if use_fd else str(p)
            assert h.async_pwrite(t, target, offsets[i]) == 0
        assert h.wait() == len(sizes)
    finally:
        if fd is not None:
            os.close(fd)
    assert p.read_bytes() == b"".join(parts)

    # Read the parts back, each at its offset, in one async batch.
    dsts = [locked(s) if buf_kind == "bounce" else torch.zeros(s, dtype=torch.uint8) for s in sizes]
    for t, off in zip(dsts, offsets):
        assert h.async_pread(t, str(p), off) == 0
    assert h.wait() == len(sizes)
    assert [tbytes(t) for t in dsts] == parts
    # And synchronously, one at a time.
    for t, off, part in zip(dsts, offsets, parts):
        t.zero_()
        assert h.sync_pread(t, str(p), off) == 1
        assert tbytes(t) == part


@pytest.mark.parametrize("method", ["sync_pwrite", "async_pwrite", "async_pwrite_fd", "pwrite", "write", "aio_write"])
@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_write_into_middle_keeps_rest_of_file(aio, handle, locked, data_dir, method, buf_kind):
    size = 16 * PAGE + 123
    base = pattern(size, 300)
    p = data_dir / "existing.bin"
    expect = bytearray(base)
    # (offset, length): aligned, odd offset, odd length, a tail inside the last page
    patches = [(4 * PAGE, 2 * PAGE), (PAGE * 9 + 7, 1000), (1, 4098), (size - 200, 100)]
    if method == "aio_write":
        patches = [(0, 3 * PAGE + 1)]  # aio_write has no offset: it writes at 0
    p.write_bytes(base)
    for i, (off, n) in enumerate(patches):
        data = pattern(n, 400 + i)
        t = locked(n) if buf_kind == "locked" else torch.empty(n, dtype=torch.uint8)
        fill(t, data)
        if method == "sync_pwrite":
            assert handle.sync_pwrite(t, str(p), off) == 1
        elif method == "async_pwrite":
            assert handle.async_pwrite(t, str(p), off) == 0
            assert handle.wait() == 1
        elif method == "async_pwrite_fd":
            fd = os.open(p, os.O_WRONLY)
            try:
                assert handle.async_pwrite(t, fd, off) == 0
                assert handle.wait() == 1
            finally:
                os.close(fd)
        elif method == "pwrite":
            assert handle.pwrite(t, str(p), False, False, off) == 1
        elif method == "write":
            assert handle.write(t, str(p), False, off) == 0
        else:
            assert aio.aio_write(t, str(p), 4096, 4, False, False, False) == 0
        expect[off:off + n] = data
        assert os.path.getsize(p) == size, f"{method} changed the file size (truncated?)"
        assert p.read_bytes() == bytes(expect), f"{method} at {off} lost the rest of the file"


def test_write_past_end_extends_file(handle, data_dir):
    p = data_dir / "grow.bin"
    head = pattern(1000, 1)
    p.write_bytes(head)
    data = pattern(2 * PAGE, 2)
    off = 3 * PAGE + 10
    assert handle.sync_pwrite(tensor_from_bytes(data), str(p), off) == 1
    got = p.read_bytes()
    assert len(got) == off + len(data)
    assert got[:1000] == head
    assert got[1000:off] == bytes(off - 1000)
    assert got[off:] == data


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_DIRECT, os.O_RDWR | os.O_DIRECT],
                         ids=["wronly", "rdwr", "wronly-direct", "rdwr-direct"])
def test_fd_overload_never_closes_callers_fd(handle, locked, data_dir, flags):
    p = data_dir / "fd.bin"
    fd = os.open(p, flags | os.O_CREAT, 0o600)
    flags_at_open = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        for i, kind in enumerate(["locked", "bounce", "locked", "bounce"]):
            n = 2 * PAGE if i < 2 else 1000 + 2 * i
            data = pattern(n, 500 + i)
            t = locked(n) if kind == "locked" else torch.empty(n, dtype=torch.uint8)
            fill(t, data)
            assert handle.async_pwrite(t, fd, 0) == 0
            assert handle.wait() == 1
            os.fstat(fd)  # still open
            assert p.read_bytes()[:n] == data
        # The descriptor is still usable by its owner, at the offset the caller left it.
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.get_blocking(fd)
        assert (fcntl.fcntl(fd, fcntl.F_GETFL) & ~0o100000) == (flags_at_open & ~0o100000)  # ignoring O_LARGEFILE
        if not flags & os.O_DIRECT:
            os.pwrite(fd, b"owner", 0)
            assert p.read_bytes()[:5] == b"owner"
    finally:
        os.close(fd)  # raises EBADF if the handle had closed it


def test_fd_survives_handle_deletion(aio, data_dir):
    import gc

    p = data_dir / "fd2.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        h = aio.aio_handle(4096, 2, False, False, 1)
        data = pattern(3 * PAGE, 1)
        assert h.async_pwrite(tensor_from_bytes(data), fd) == 0
        del h
        gc.collect()
        os.fstat(fd)
        assert p.read_bytes() == data
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", ["sync_pwrite", "async_pwrite", "pwrite", "write", "aio_write", "async_pwrite_fd"])
@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_1000_byte_write_makes_1000_byte_file(aio, new_handle, locked, data_dir, method, buf_kind):
    """The C++ silently wrote nothing for sizes that are not a multiple of the
    device block (O_DIRECT EINVAL ignored, issue #1070)."""
    h = new_handle(1 << 20, 128, False, False, 1)
    data = pattern(1000, 600)
    t = locked(1000) if buf_kind == "locked" else torch.empty(1000, dtype=torch.uint8)
    fill(t, data)
    p = data_dir / "k.bin"
    if method == "sync_pwrite":
        assert h.sync_pwrite(t, str(p)) == 1
    elif method == "async_pwrite":
        assert h.async_pwrite(t, str(p)) == 0
        assert h.wait() == 1
    elif method == "pwrite":
        assert h.pwrite(t, str(p), False, False) == 1
    elif method == "write":
        assert h.write(t, str(p), False) == 0
    elif method == "aio_write":
        assert aio.aio_write(t, str(p), 1 << 20, 128, False, False, False) == 0
    else:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
        try:
            assert h.async_pwrite(t, fd) == 0
            assert h.wait() == 1
        finally:
            os.close(fd)
    assert os.path.getsize(p) == 1000
    assert p.read_bytes() == data
    # and reading those 1000 bytes back works, into either kind of buffer
    for dst in (locked(1000), torch.zeros(1000, dtype=torch.uint8)):
        assert h.sync_pread(dst, str(p)) == 1
        assert tbytes(dst) == data


@pytest.mark.parametrize("offset", [1, 511, 513, PAGE - 1, PAGE + 1, 5 * PAGE + 3333])
@pytest.mark.parametrize("length", [1, 2, 511, 4098, 3 * PAGE])
def test_odd_offsets_and_lengths(new_handle, locked, data_dir, offset, length):
    h = new_handle(4096, 4, True, False, 2 if length % 2 == 0 else 1)
    size = 8 * PAGE
    base = pattern(size, 700)
    p = data_dir / "odd.bin"
    p.write_bytes(base)
    data = pattern(length, offset * 31 + length)
    src = locked(length)
    fill(src, data)
    assert h.sync_pwrite(src, str(p), offset) == 1
    expect = bytearray(base)
    expect[offset:offset + length] = data
    assert p.read_bytes() == bytes(expect)
    for dst in (locked(length), torch.zeros(length, dtype=torch.uint8)):
        assert h.sync_pread(dst, str(p), offset) == 1
        assert tbytes(dst) == data
    # a read of a different odd window of the same file
    win = min(length, size - offset - 1)
    if win % h.get_intra_op_parallelism() == 0 and win > 0:
        dst = torch.zeros(win, dtype=torch.uint8)
        assert h.sync_pread(dst, str(p), offset + 1) == 1
        assert tbytes(dst) == bytes(expect[offset + 1:offset + 1 + win])


def test_read_exactly_to_end_of_file(handle, data_dir):
    data = pattern(5 * PAGE + 17 * 2, 800)
    p = data_dir / "end.bin"
    p.write_bytes(data)
    for off in (0, 2, PAGE, len(data) - 2):
        dst = torch.zeros(len(data) - off, dtype=torch.uint8)
        assert handle.sync_pread(dst, str(p), off) == 1
        assert tbytes(dst) == data[off:]


def test_created_file_mode_is_0600(handle, data_dir):
    p = data_dir / "mode.bin"
    old = os.umask(0)
    try:
        assert handle.sync_pwrite(tensor_from_bytes(pattern(PAGE, 1)), str(p)) == 1
    finally:
        os.umask(old)
    assert (os.stat(p).st_mode & 0o777) == 0o600


@pytest.mark.parametrize("iop", [4, 8, 16])
def test_tiny_ops_with_many_workers(new_handle, locked, data_dir, iop):
    """Fewer bytes than workers have pages (some slices empty), and one byte per worker."""
    h = new_handle(512, 2, True, False, iop)
    for n in (iop, 3 * iop, 1000 * iop, 4097 * iop):
        data = pattern(n, n)
        p = data_dir / f"tiny{n}.bin"
        assert h.sync_pwrite(tensor_from_bytes(data), str(p)) == 1
        assert p.read_bytes() == data
        dst = locked(n)
        dst.zero_()
        assert h.sync_pread(dst, str(p)) == 1
        assert tbytes(dst) == data
