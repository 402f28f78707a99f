"""A tensor whose storage is replaced while its op is in flight (issue:
"the op holds the tensor, not its storage"). `t.set_(...)`, `t.resize_(...)`
or `t.data = ...` used to free the memory the I/O still targeted. The op now
holds the storage it was given until it is finished, and `wait()` reports
the swap instead of copying into memory of another size."""

import pytest
import torch

from _util import pattern, tbytes, tensor_from_bytes

MiB = 1 << 20


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("swap", ["set_", "data", "resize_"])
def test_a_bounced_read_into_a_swapped_tensor_fails_at_wait(aio, data_dir, swap):
    data = pattern(4 * MiB, 3)
    path = str(data_dir / "src.bin")
    write_file(path, data)
    h = aio.aio_handle(MiB, 8, False, True, 1)
    t = torch.zeros(4 * MiB, dtype=torch.uint8)  # plain memory: bounced
    assert h.async_pread(t, path, 0) == 0
    replacement = torch.full((64,), 7, dtype=torch.uint8)
    if swap == "set_":
        t.set_(replacement)
    elif swap == "data":
        t.data = replacement
    else:
        t.resize_(8 * MiB)  # grows: the storage moves
    with pytest.raises(RuntimeError, match="storage replaced"):
        h.wait()
    if swap != "resize_":
        assert torch.equal(t, torch.full((64,), 7, dtype=torch.uint8)), "the new storage was written"
    # The handle still works.
    back = torch.zeros(4 * MiB, dtype=torch.uint8)
    assert h.sync_pread(back, path, 0) == 1
    assert tbytes(back) == data


@pytest.mark.parametrize("kind", ["locked", "plain"])
def test_a_write_whose_tensor_is_repointed_writes_the_memory_it_was_given(aio, data_dir, kind):
    """The op writes the memory it was given (held alive by the op, so never
    freed memory), and finishes normally: nothing was lost."""
    data = pattern(8 * MiB, 5)
    h = aio.aio_handle(MiB, 4, False, True, 2)
    if kind == "locked":
        src = h.new_cpu_locked_tensor(8 * MiB, torch.empty(0, dtype=torch.uint8))
        src.copy_(tensor_from_bytes(data))
    else:
        src = tensor_from_bytes(data)
    path = str(data_dir / "w.bin")
    assert h.async_pwrite(src, path, 0) == 0
    view = src.view(-1)
    src.set_(torch.zeros(16, dtype=torch.uint8))
    assert h.wait() == 1
    with open(path, "rb") as f:
        assert f.read() == data
    if kind == "locked":
        assert h.free_cpu_locked_tensor(view)


def test_an_unchanged_tensor_is_not_reported(aio, data_dir):
    h = aio.aio_handle()
    t = torch.arange(1000, dtype=torch.float32)
    path = str(data_dir / "ok.bin")
    assert h.async_pwrite(t, path, 0) == 0
    t.add_(1)  # in place: same storage
    assert h.wait() == 1


WAIT_ELSEWHERE = r"""
import os, sys, threading
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder

path, rounds = sys.argv[1], int(sys.argv[2])
aio = AsyncIOBuilder().load()
h = aio.aio_handle(1 << 20, 8, False, True, 2)
n = os.path.getsize(path)
want = torch.from_file(path, shared=False, size=n, dtype=torch.uint8)
outcomes = {"copied": 0, "refused": 0}
for r in range(rounds):
    t = torch.zeros(n, dtype=torch.uint8)  # plain: bounced
    assert h.async_pread(t, path, 0) == 0
    errors = []
    def waiter():
        try:
            h.wait()
            outcomes["copied"] += 1
        except RuntimeError as e:
            assert "storage replaced" in str(e), e
            outcomes["refused"] += 1
    w = threading.Thread(target=waiter)
    w.start()
    # The submitting thread frees and moves the tensor's bytes while another
    # thread's wait() finishes its read: the copy must land in the memory the
    # op was given, checked under the GIL, or not at all.
    t.resize_(2 * n)
    t.fill_(1)
    w.join()
    if t.numel() == n:  # (never: resize_ grew it)
        assert torch.equal(t, want)
print("OK", outcomes["copied"], outcomes["refused"], flush=True)
"""


def test_a_wait_in_another_thread_never_copies_into_freed_memory(data_dir):
    """Thread A submits a bounced read into a plain tensor; thread B's
    wait() finishes it while A resizes the tensor (freeing its bytes). The
    copy happens under the GIL after checking where the bytes are, so it
    either lands in the memory the op was given (A's resize came later) or is
    refused naming the swap; it never writes into freed memory (a SIGSEGV or
    heap corruption before: the gate of an op was opened by any thread's
    wait())."""
    from _util import run_python
    path = str(data_dir / "src.bin")
    write_file(path, pattern(32 * MiB, 9))
    proc = run_python(WAIT_ELSEWHERE.replace("sys.argv[1], int(sys.argv[2])", f"{path!r}, 40"), timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
