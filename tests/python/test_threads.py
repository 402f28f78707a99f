"""GIL release and concurrency.

GIL: with sys.setswitchinterval(60) the interpreter never forces a switch,
so a peer thread that wants the GIL can run only when the main thread gives
it up voluntarily, i.e. inside a call that releases the GIL. DeepSpeed's
tests/unit/v1/nvme/test_aio_gil.py does this with CUDA-pinned memory; here
it runs with new_cpu_locked_tensor memory and with plain (bounce) tensors.
A control shows the trick detects a call that keeps the GIL.
"""

import threading

import pytest
import torch

from _util import fill, pattern, peer_progress_during, tbytes, tensor_from_bytes

NBYTES = 8 << 20          # per call; enough that each call blocks for milliseconds
TIMEOUT = 60




def test_gil_trick_detects_a_call_that_holds_the_gil():
    """Control: pure-Python work of similar length never lets the peer run."""
    def busy():
        x = 0
        for i in range(200_000):
            x += i
        return x

    assert peer_progress_during(busy, max_calls=8) is None


@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
@pytest.mark.parametrize("operation", ["pread", "pwrite", "sync_pread", "sync_pwrite", "wait"])
def test_blocking_calls_release_the_gil(new_handle, locked, data_dir, operation, buf_kind):
    h = new_handle(1 << 20, 8, True, True, 2)
    payload = pattern(NBYTES, 1234)
    source = data_dir / "source.bin"
    source.write_bytes(payload)
    target = str(data_dir / "target.bin")
    buf = locked(NBYTES) if buf_kind == "locked" else torch.empty(NBYTES, dtype=torch.uint8)
    if "write" in operation:
        fill(buf, payload)
        # first write outside the measured loop: the one-time warning talks to Python
        assert h.sync_pwrite(buf, target) == 1
    else:
        buf.zero_()

    def call():
        if operation == "pread":
            assert h.pread(buf, str(source), False, False) == 1
        elif operation == "pwrite":
            assert h.pwrite(buf, target, False, False) == 1
        elif operation == "sync_pread":
            assert h.sync_pread(buf, str(source)) == 1
        elif operation == "sync_pwrite":
            assert h.sync_pwrite(buf, target) == 1
        else:
            assert h.async_pread(buf, str(source)) == 0
            assert h.wait() == 1

    assert peer_progress_during(call, max_calls=16) is not None, f"{operation} held the GIL across all blocking calls"
    if "write" in operation:
        assert (data_dir / "target.bin").read_bytes() == payload
    else:
        assert tbytes(buf) == payload


@pytest.mark.parametrize("buf_kind", ["locked", "bounce"])
def test_concurrent_blocking_reads_on_shared_handle(new_handle, locked, data_dir, buf_kind):
    h = new_handle(4096, 2, True, True, 2)
    n = 64 * 1024
    payloads = [pattern(n, 10), pattern(n, 11)]
    paths = []
    for i, p in enumerate(payloads):
        path = data_dir / f"src-{i}.bin"
        path.write_bytes(p)
        paths.append(str(path))
    bufs = [locked(n) if buf_kind == "locked" else torch.zeros(n, dtype=torch.uint8) for _ in range(2)]
    for rounds in range(10):
        for b in bufs:
            b.zero_()
        start = threading.Barrier(3, timeout=TIMEOUT)
        statuses = [None, None]
        errors = []

        def run_read(i):
            try:
                start.wait()
                statuses[i] = h.sync_pread(bufs[i], paths[i], 0)
            except Exception as error:  # reported below
                errors.append(error)

        readers = [threading.Thread(target=run_read, args=(i,), daemon=True) for i in range(2)]
        for r in readers:
            r.start()
        start.wait()
        for r in readers:
            r.join(timeout=TIMEOUT)
        assert not errors, errors
        assert all(not r.is_alive() for r in readers)
        assert statuses == [1, 1], f"round {rounds}: {statuses}"
        assert [tbytes(b) for b in bufs] == payloads
    assert h.wait() == 0


def test_concurrent_reads_and_locked_tensor_alloc_free(new_handle, data_dir, native):
    h = new_handle(4096, 2, True, True, 2)
    n = 64 * 1024
    payload = pattern(n, 20)
    src = data_dir / "src.bin"
    src.write_bytes(payload)
    stats0 = native.pinned_stats()
    read_bufs = [torch.zeros(n, dtype=torch.uint8), h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))]
    start = threading.Barrier(3, timeout=TIMEOUT)
    errors = []

    def run_reads(buf):
        try:
            start.wait()
            for _ in range(32):
                assert h.sync_pread(buf, str(src), 0) == 1
                assert tbytes(buf) == payload
        except Exception as error:
            errors.append(error)

    def manage_locked_tensors():
        try:
            start.wait()
            for i in range(64):
                t = h.new_cpu_locked_tensor(4096 + i, torch.empty(0, dtype=torch.uint8))
                assert h.is_pinned(t)
                t.fill_(i)
                assert h.free_cpu_locked_tensor(t)
        except Exception as error:
            errors.append(error)

    workers = [threading.Thread(target=run_reads, args=(read_bufs[0],), daemon=True),
               threading.Thread(target=manage_locked_tensors, daemon=True)]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join(timeout=TIMEOUT)
    assert not errors, errors
    assert all(not w.is_alive() for w in workers)
    # the locked read buffer still works and is still managed
    assert h.sync_pread(read_bufs[1], str(src)) == 1
    assert tbytes(read_bufs[1]) == payload
    assert h.free_cpu_locked_tensor(read_bufs[1])
    assert native.pinned_stats() == stats0


def test_threads_submitting_async_ops_then_one_wait(new_handle, data_dir):
    h = new_handle(8192, 4, False, True, 2)
    n = 3 * 4096 + 2
    threads_n, per_thread = 4, 8
    errors = []
    start = threading.Barrier(threads_n, timeout=TIMEOUT)
    srcs = {}

    def submit(k):
        try:
            start.wait()
            for j in range(per_thread):
                data = pattern(n, 1000 + k * 100 + j)
                t = tensor_from_bytes(data)
                srcs[(k, j)] = (t, data)
                assert h.async_pwrite(t, str(data_dir / f"f{k}-{j}")) == 0
        except Exception as error:
            errors.append(error)

    ts = [threading.Thread(target=submit, args=(k,), daemon=True) for k in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=TIMEOUT)
    assert not errors, errors
    assert h.wait() == threads_n * per_thread
    for (k, j), (_, data) in srcs.items():
        assert (data_dir / f"f{k}-{j}").read_bytes() == data


def test_handles_used_from_many_threads_each(aio, data_dir):
    """One handle per thread, mixed ops; nothing crosses between handles."""
    errors = []

    def worker(k):
        try:
            h = aio.aio_handle(4096, 4, k % 2 == 0, k % 3 == 0, 1 + k % 2)
            for j in range(10):
                data = pattern(2 * 4096 + 2 * j, k * 1000 + j)
                p = str(data_dir / f"t{k}-{j}")
                assert h.sync_pwrite(tensor_from_bytes(data), p) == 1
                dst = torch.zeros(len(data), dtype=torch.uint8)
                assert h.async_pread(dst, p) == 0
                assert h.wait() == 1
                assert tbytes(dst) == data
        except Exception as error:
            errors.append((k, error))

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=TIMEOUT)
    assert not errors, errors
    assert all(not t.is_alive() for t in ts)
