"""No leaks: open descriptors (/proc/self/fd), locked memory (VmLck), the
manager's pinned_stats(); and dropping a handle with ops in flight finishes
them (the files are right afterwards) without a crash."""

import gc
import os

import pytest
import torch

from _util import PAGE, fill, open_fd_count, open_fds, pattern, tbytes, tensor_from_bytes, vmlck_kb


def _mixed_ops(h, locked_bufs, data_dir, rounds):
    """Hundreds of small ops: sync and async, bounce and locked, reads and writes,
    path and fd targets, aligned and unaligned sizes."""
    done = 0
    for r in range(rounds):
        n = (PAGE if r % 2 == 0 else 1000 + 2 * r)
        data = pattern(n, r)
        lk = locked_bufs[r % len(locked_bufs)].narrow(0, 0, n)
        fill(lk, data)
        p = str(data_dir / f"f{r % 7}")
        assert h.sync_pwrite(lk, p) == 1
        plain = torch.zeros(n, dtype=torch.uint8)
        assert h.async_pread(plain, p) == 0
        assert h.async_pwrite(tensor_from_bytes(data), str(data_dir / f"g{r % 5}")) == 0
        assert h.wait() == 2
        assert tbytes(plain) == data
        fd = os.open(data_dir / f"h{r % 3}", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            assert h.async_pwrite(lk, fd, 0) == 0
            assert h.sync_pread(plain, p) == 2
        finally:
            os.close(fd)
        assert h.write(plain, p, False) == 0
        assert h.read(lk, p, False) == 0
        done += 7
    return done


def test_no_fd_vmlck_or_pinned_growth_after_many_ops(aio, data_dir, native):
    h = aio.aio_handle(4096, 4, False, True, 2)
    locked_bufs = [h.new_cpu_locked_tensor(2 * PAGE, torch.empty(0, dtype=torch.uint8)) for _ in range(3)]
    try:
        _mixed_ops(h, locked_bufs, data_dir, 4)  # warm up: lazily created engines, etc.
        fds0, lck0, stats0 = open_fds(), vmlck_kb(), native.pinned_stats()
        done = _mixed_ops(h, locked_bufs, data_dir, 60)
        assert done >= 400
        assert h.wait() == 0
        assert open_fds() == fds0, "descriptors leaked"
        assert vmlck_kb() == lck0, "locked memory leaked (bounce buffers?)"
        assert native.pinned_stats() == stats0
    finally:
        for b in locked_bufs:
            assert h.free_cpu_locked_tensor(b)


def test_failed_and_refused_ops_leak_nothing(aio, data_dir, native, capfd):
    h = aio.aio_handle(4096, 4, False, False, 2)
    ro = data_dir / "ro.bin"
    ro.write_bytes(pattern(PAGE, 1))
    # warm up both paths once
    assert h.sync_pwrite(tensor_from_bytes(pattern(PAGE, 2)), str(data_dir / "w")) == 1
    fds0, lck0, stats0 = open_fds(), vmlck_kb(), native.pinned_stats()
    for i in range(50):
        assert h.sync_pread(torch.zeros(2 * PAGE, dtype=torch.uint8), str(ro)) == -1  # past EOF
        assert h.sync_pread(torch.zeros(PAGE, dtype=torch.uint8), str(data_dir / "nope")) == -1
        assert h.sync_pwrite(torch.zeros(PAGE + 1, dtype=torch.uint8), str(data_dir / "w")) == -1  # not divisible
        fd = os.open(ro, os.O_RDONLY)
        try:
            assert h.async_pwrite(tensor_from_bytes(pattern(PAGE, 3)), fd) == 0
            with pytest.raises(RuntimeError):
                h.wait()
        finally:
            os.close(fd)
    capfd.readouterr()
    assert open_fds() == fds0
    assert vmlck_kb() == lck0
    assert native.pinned_stats() == stats0


def test_creating_and_dropping_handles_leaks_nothing(aio, data_dir, native):
    def cycle():
        h = aio.aio_handle(4096, 8, True, False, 3)
        assert h.sync_pwrite(tensor_from_bytes(pattern(3 * PAGE, 1)), str(data_dir / "c")) == 1
        assert h.write(tensor_from_bytes(pattern(3 * PAGE, 1)), str(data_dir / "c"), False) == 0
        del h

    cycle()
    gc.collect()
    fds0, lck0, stats0 = open_fd_count(), vmlck_kb(), native.pinned_stats()
    threads0 = len(os.listdir("/proc/self/task"))
    for _ in range(30):
        cycle()
    gc.collect()
    assert open_fd_count() == fds0, "handles leak descriptors (io_uring rings?)"
    assert vmlck_kb() == lck0
    assert native.pinned_stats() == stats0
    assert len(os.listdir("/proc/self/task")) == threads0, "handles leak worker threads"


@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_drop_handle_with_writes_in_flight_finishes_them(aio, data_dir, buf_kind):
    h = aio.aio_handle(4096, 1, True, False, 2)  # small blocks, qd 1: the ops take a while
    n = 2 << 20
    datas = [pattern(n, 50 + i) for i in range(4)]
    keep = []
    for i, d in enumerate(datas):
        if buf_kind == "locked":
            t = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
            keep.append(t)
        else:
            t = torch.empty(n, dtype=torch.uint8)
        fill(t, d)
        assert h.async_pwrite(t, str(data_dir / f"inflight{i}.bin")) == 0
        del t  # the op keeps its buffer alive (unpinned), or `keep` does (locked)
    del h
    gc.collect()
    for i, d in enumerate(datas):
        assert (data_dir / f"inflight{i}.bin").read_bytes() == d, f"file {i}"
    if keep:
        h2 = aio.aio_handle()
        for t in keep:
            assert h2.free_cpu_locked_tensor(t)


def test_drop_handle_with_reads_in_flight_delivers_data(aio, data_dir):
    n = 1 << 20
    datas = [pattern(n, 60 + i) for i in range(3)]
    for i, d in enumerate(datas):
        (data_dir / f"r{i}.bin").write_bytes(d)
    h = aio.aio_handle(4096, 2, False, True, 2)
    dsts = [torch.zeros(n, dtype=torch.uint8) for _ in datas]
    for i, t in enumerate(dsts):
        assert h.async_pread(t, str(data_dir / f"r{i}.bin")) == 0
    del h
    gc.collect()
    assert [tbytes(t) for t in dsts] == datas


def test_drop_in_flight_in_a_subprocess_exits_cleanly(tmp_path):
    """Interpreter shutdown with a handle still holding ops: no crash, files complete."""
    from _util import run_python

    code = f"""
        import random, torch
        from deepspeed.ops.op_builder import AsyncIOBuilder
        h = AsyncIOBuilder().load().aio_handle(4096, 1, True, False, 2)
        for i in range(3):
            data = random.Random(i).randbytes(1 << 20)
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
            assert h.async_pwrite(t, {str(tmp_path)!r} + f"/x{{i}}.bin") == 0
        # no wait(), no del: the interpreter exits with the ops in flight
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import random
    for i in range(3):
        assert (tmp_path / f"x{i}.bin").read_bytes() == random.Random(i).randbytes(1 << 20)
