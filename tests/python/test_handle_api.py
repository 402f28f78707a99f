"""Every aio_handle method, across single_submit x overlap_events and a few
block sizes / queue depths / intra_op_parallelism values.

Return conventions (DeepSpeed's): read/write -> 0; async_* and
pread/pwrite(async=True) -> 0 and wait() returns the count; sync_* and
pread/pwrite(async=False) -> the number of ops completed, earlier async
ones included; wait() with nothing pending -> 0.
"""

import os

import pytest
import torch

from _util import PAGE, fill, pattern, tbytes, tensor_from_bytes

BOOLS = (False, True)
# (block_size, queue_depth, intra_op_parallelism)
SHAPES = [
    (4096, 1, 1),
    (1000, 3, 3),       # block size not a multiple of 512: rounded for O_DIRECT, never lost
    (65536, 8, 2),
    (1 << 20, 128, 4),  # DeepSpeed's defaults, four workers
]


def test_constructor_defaults_and_getters(aio):
    h = aio.aio_handle()
    assert h.get_block_size() == 1 << 20
    assert h.get_queue_depth() == 128
    assert h.get_single_submit() is False
    assert h.get_overlap_events() is False
    assert h.get_intra_op_parallelism() == 1
    assert h.get_alignment() == 512


@pytest.mark.parametrize("single_submit", BOOLS)
@pytest.mark.parametrize("overlap_events", BOOLS)
@pytest.mark.parametrize("block_size,queue_depth,iop", SHAPES)
def test_getters_return_constructor_values(aio, block_size, queue_depth, single_submit, overlap_events, iop):
    h = aio.aio_handle(block_size=block_size, queue_depth=queue_depth, single_submit=single_submit,
                       overlap_events=overlap_events, intra_op_parallelism=iop)
    assert h.get_block_size() == block_size
    assert h.get_queue_depth() == queue_depth
    assert h.get_single_submit() is single_submit
    assert h.get_overlap_events() is overlap_events
    assert h.get_intra_op_parallelism() == iop
    assert h.get_alignment() == iop * 512


@pytest.mark.parametrize("single_submit", BOOLS)
@pytest.mark.parametrize("overlap_events", BOOLS)
@pytest.mark.parametrize("block_size,queue_depth,iop", SHAPES)
def test_every_transfer_method_round_trips(new_handle, locked, data_dir, block_size, queue_depth,
                                           single_submit, overlap_events, iop):
    h = new_handle(block_size, queue_depth, single_submit, overlap_events, iop)
    # Divisible by the parallelism, not by 512: every op has unaligned edges.
    n = iop * 12_289  # three pages and a byte per worker
    seeds = iter(range(1000))

    def src(kind):
        data = pattern(n, next(seeds))
        if kind == "locked":
            t = locked(n)
            fill(t, data)
        else:
            t = tensor_from_bytes(data)
        return t, data

    # Writes: each write method, from a locked and from an unpinned buffer.
    written = {}
    for kind in ("locked", "bounce"):
        t, d = src(kind); p = data_dir / f"sync_pwrite-{kind}"
        assert h.sync_pwrite(t, str(p)) == 1; written[p] = d
        t, d = src(kind); p = data_dir / f"pwrite-{kind}"
        assert h.pwrite(t, str(p), False, False) == 1; written[p] = d
        t, d = src(kind); p = data_dir / f"write-{kind}"
        assert h.write(t, str(p), False) == 0; written[p] = d
        t1, d1 = src(kind); p1 = data_dir / f"async_pwrite-{kind}"
        t2, d2 = src(kind); p2 = data_dir / f"pwrite_async-{kind}"
        t3, d3 = src(kind); p3 = data_dir / f"async_pwrite_fd-{kind}"
        fd = os.open(p3, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            assert h.async_pwrite(t1, str(p1)) == 0
            assert h.pwrite(t2, str(p2), False, True) == 0
            assert h.async_pwrite(t3, fd) == 0
            assert h.wait() == 3
        finally:
            os.close(fd)
        written.update({p1: d1, p2: d2, p3: d3})
    for p, d in written.items():
        assert p.read_bytes() == d, p.name

    # Reads: each read method, into a locked and into an unpinned buffer.
    for kind in ("locked", "bounce"):
        # each read method reads a file written by a different write method
        files = [(p, d) for p, d in written.items() if p.name.endswith(kind)]
        assert len(files) == 6
        for i, method in enumerate(("sync_pread", "pread", "read", "async_pread", "pread_async")):
            p, d = files[(i + 1) % len(files)]
            dst = locked(n) if kind == "locked" else torch.zeros(n, dtype=torch.uint8)
            dst.fill_(0x5A)
            if method == "sync_pread":
                assert h.sync_pread(dst, str(p)) == 1
            elif method == "pread":
                assert h.pread(dst, str(p), False, False) == 1
            elif method == "read":
                assert h.read(dst, str(p), False) == 0
            elif method == "async_pread":
                assert h.async_pread(dst, str(p)) == 0
                assert h.wait() == 1
            else:
                assert h.pread(dst, str(p), False, True) == 0
                assert h.wait() == 1
            assert tbytes(dst) == d, f"{method} into {kind}"
    assert h.wait() == 0


def test_wait_with_nothing_pending_returns_zero(new_handle):
    h = new_handle()
    assert h.wait() == 0
    assert h.wait() == 0


def test_sync_counts_earlier_async_ops(handle, data_dir):
    n = 3 * PAGE
    datas = [pattern(n, s) for s in range(3)]
    assert handle.async_pwrite(tensor_from_bytes(datas[0]), str(data_dir / "a")) == 0
    assert handle.async_pwrite(tensor_from_bytes(datas[1]), str(data_dir / "b")) == 0
    # The blocking write waits for everything pending and counts it.
    assert handle.sync_pwrite(tensor_from_bytes(datas[2]), str(data_dir / "c")) == 3
    assert handle.wait() == 0
    assert [(data_dir / x).read_bytes() for x in "abc"] == datas
    # Same for a blocking read after async reads, and for pread(async=False).
    bufs = [torch.zeros(n, dtype=torch.uint8) for _ in range(3)]
    assert handle.async_pread(bufs[0], str(data_dir / "a")) == 0
    assert handle.pread(bufs[1], str(data_dir / "b"), False, False) == 2
    assert handle.async_pread(bufs[2], str(data_dir / "c")) == 0
    assert handle.sync_pread(bufs[0], str(data_dir / "a")) == 2
    assert [tbytes(b) for b in bufs] == datas
    assert handle.wait() == 0


@pytest.mark.parametrize("queue", [2, 3])
@pytest.mark.parametrize("single_submit,overlap_events", [(False, False), (True, True), (False, True), (True, False)])
def test_async_queues(new_handle, locked, data_dir, queue, single_submit, overlap_events):
    h = new_handle(4096, 2, single_submit, overlap_events, 2)
    n = 5 * 4096 + 1234 * 2
    datas = [pattern(n, 100 + i) for i in range(queue)]
    srcs = []
    for i, d in enumerate(datas):
        t = locked(n) if i % 2 else tensor_from_bytes(d)
        fill(t, d)
        srcs.append(t)
        assert h.async_pwrite(t, str(data_dir / f"q{i}")) == 0
    assert h.wait() == queue
    assert [(data_dir / f"q{i}").read_bytes() for i in range(queue)] == datas
    dsts = [torch.zeros(n, dtype=torch.uint8) if i % 2 else locked(n) for i in range(queue)]
    for i, t in enumerate(dsts):
        assert h.async_pread(t, str(data_dir / f"q{i}")) == 0
    assert h.wait() == queue
    assert [tbytes(t) for t in dsts] == datas
    assert h.wait() == 0


def test_mixed_read_and_write_queue(handle, data_dir):
    n = 2 * PAGE + 100
    a, b = pattern(n, 1), pattern(n, 2)
    (data_dir / "in").write_bytes(a)
    dst = torch.zeros(n, dtype=torch.uint8)
    assert handle.async_pread(dst, str(data_dir / "in")) == 0
    assert handle.async_pwrite(tensor_from_bytes(b), str(data_dir / "out")) == 0
    assert handle.wait() == 2
    assert tbytes(dst) == a
    assert (data_dir / "out").read_bytes() == b


@pytest.mark.parametrize("method", ["read", "write", "pread", "pwrite"])
def test_validate_prints_pass(handle, data_dir, capfd, method):
    n = 4 * PAGE + 24
    data = pattern(n, 3)
    p = data_dir / "v.bin"
    p.write_bytes(data)
    t = tensor_from_bytes(data) if method in ("write", "pwrite") else torch.zeros(n, dtype=torch.uint8)
    capfd.readouterr()
    if method == "read":
        assert handle.read(t, str(p), True) == 0
    elif method == "write":
        assert handle.write(t, str(p), True) == 0
    elif method == "pread":
        assert handle.pread(t, str(p), True, False) == 1
    else:
        assert handle.pwrite(t, str(p), True, False) == 1
    out = capfd.readouterr()
    text = out.out + out.err
    assert "Pass:" in text, text
    assert "Fail" not in text, text
    assert tbytes(t) == data
    assert p.read_bytes() == data


def test_validate_async_prints_pass_at_wait(handle, data_dir, capfd):
    n = 2 * PAGE
    data = pattern(n, 4)
    p = data_dir / "va.bin"
    capfd.readouterr()
    assert handle.pwrite(tensor_from_bytes(data), str(p), True, True) == 0
    assert handle.wait() == 1
    out = capfd.readouterr()
    assert "Pass:" in out.out + out.err
    assert p.read_bytes() == data


def test_read_and_write_print_elapsed_time(handle, data_dir, capfd):
    data = pattern(PAGE, 5)
    t = tensor_from_bytes(data)
    capfd.readouterr()
    assert handle.write(t, str(data_dir / "e"), False) == 0
    assert handle.read(torch.zeros_like(t), str(data_dir / "e"), False) == 0
    out = capfd.readouterr()
    assert (out.out + out.err).count("Elapsed time(usec)") == 2


def test_read_write_with_file_offset(handle, data_dir):
    base = pattern(5 * PAGE, 6)
    p = data_dir / "o.bin"
    p.write_bytes(base)
    patch = pattern(1000, 7)
    assert handle.write(tensor_from_bytes(patch), str(p), False, 3 * PAGE + 5) == 0
    expect = bytearray(base)
    expect[3 * PAGE + 5:3 * PAGE + 1005] = patch
    assert p.read_bytes() == bytes(expect)
    dst = torch.zeros(777, dtype=torch.uint8)
    assert handle.read(dst, str(p), False, 4097) == 0
    assert tbytes(dst) == bytes(expect[4097:4097 + 777])


def test_keyword_arguments_match_deepspeed(handle, data_dir):
    data = pattern(2 * PAGE, 8)
    t = tensor_from_bytes(data)
    p = str(data_dir / "kw")
    assert handle.sync_pwrite(buffer=t, filename=p, file_offset=0) == 1
    assert handle.async_pwrite(buffer=t, filename=p, file_offset=0) == 0
    assert handle.wait() == 1
    d = torch.zeros_like(t)
    assert handle.sync_pread(buffer=d, filename=p, file_offset=0) == 1
    assert handle.async_pread(buffer=d, filename=p, file_offset=0) == 0
    assert handle.wait() == 1
    assert tbytes(d) == data


def test_new_and_free_cpu_locked_tensor(handle):
    for dtype in (torch.uint8, torch.float16, torch.float32, torch.int64):
        t = handle.new_cpu_locked_tensor(1000, torch.empty(3, dtype=dtype))
        try:
            assert t.dtype == dtype
            assert t.shape == (1000,)
            assert t.device.type == "cpu"
            assert t.is_contiguous()
            assert t.data_ptr() % PAGE == 0
            assert handle.is_pinned(t)
            t.fill_(1)  # writable
        finally:
            assert handle.free_cpu_locked_tensor(t) is True
        assert handle.free_cpu_locked_tensor(t) is False


@pytest.mark.parametrize("kind", ["plain", "locked"])
def test_empty_tensors_move_nothing_and_count_as_deepspeed_does(aio, data_dir, kind):
    """An empty tensor has no data pointer: its ops make no slice from it
    (the core's debug build checks that) and return DeepSpeed's counts."""
    path = str(data_dir / "empty.bin")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    h = aio.aio_handle(1 << 20, 8, False, True, 2)
    if kind == "locked":
        t = h.new_cpu_locked_tensor(0, torch.empty(0, dtype=torch.uint8))
    else:
        t = torch.empty(0, dtype=torch.uint8)
    assert h.sync_pwrite(t, path) == 1
    assert h.sync_pread(t, path) == 1
    assert h.async_pwrite(t, path) == 0
    assert h.async_pread(t, path) == 0
    assert h.wait() == 2
    with open(path, "rb") as f:
        assert f.read() == b"x" * 4096, "an empty write changed the file"
