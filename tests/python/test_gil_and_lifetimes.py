"""The GIL and tensor lifetimes around blocking calls.

DeepSpeed's bindings keep the GIL for async submits and for the handle's
destructor. deepnvme releases it while it waits for I/O or for the handle's
lock, so that (a) another thread that needs the GIL (torch needs it to let go
of a tensor whose Python object is gone) can never deadlock against a thread
waiting on the same handle, and (b) the tensor of an op stays alive until
the op finishes even when the caller drops every Python reference to it.
"""

import threading

import torch

from _util import pattern, run_python, tbytes, tensor_from_bytes

MiB = 1 << 20


def test_async_submits_and_waits_on_one_handle_from_two_threads(aio, data_dir):
    """Thread A waits while thread B, holding the GIL in async_pwrite, submits
    ops whose tensors are temporaries (released by `wait()` in thread A)."""
    h = aio.aio_handle(1 << 16, 8, False, True, 2)
    rounds = 60
    errors = []
    done = threading.Event()

    def submitter():
        try:
            for i in range(rounds):
                # A temporary: only the op holds it once this statement ends.
                assert h.async_pwrite(tensor_from_bytes(pattern(256 * 1024, i)), str(data_dir / f"s{i}.bin"), 0) == 0
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            done.set()

    def waiter():
        try:
            while not done.is_set():
                h.wait()
            h.wait()
        except Exception as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=submitter, daemon=True), threading.Thread(target=waiter, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlock between async submits and wait()"
    assert not errors, errors
    for i in range(rounds):
        assert (data_dir / f"s{i}.bin").read_bytes() == pattern(256 * 1024, i)


def test_a_dropped_tensor_stays_valid_until_its_async_read_finishes(aio, data_dir):
    """The op holds the tensor: a read into a tensor the caller no longer
    references still lands in that tensor's memory, not in reused memory."""
    h = aio.aio_handle(1 << 16, 8, False, True, 1)
    path = data_dir / "src.bin"
    path.write_bytes(pattern(4 * MiB, 7))
    seen = {}

    def submit():
        dst = torch.zeros(4 * MiB, dtype=torch.uint8)
        view = dst.narrow(0, 0, 4 * MiB)
        seen["ptr"] = dst.data_ptr()
        assert h.async_pread(view, str(path), 0) == 0
        return dst.untyped_storage()  # keep only the storage, to check it afterwards

    storage = submit()
    # Churn the allocator: if the op had let go of the tensor, its memory
    # could be handed out here and overwritten by the read.
    junk = [torch.full((4 * MiB, ), 0xEE, dtype=torch.uint8) for _ in range(4)]
    assert h.wait() == 1
    assert storage.data_ptr() == seen["ptr"]
    got = torch.empty(0, dtype=torch.uint8).set_(storage)
    assert tbytes(got) == pattern(4 * MiB, 7)
    for j in junk:
        assert int(j.min()) == 0xEE and int(j.max()) == 0xEE, "a read landed in memory reused by another tensor"


def test_writes_never_waited_for_finish_at_exit_without_a_false_failure(tmp_path):
    """Async writes of locked tensors left pending when the interpreter exits
    are finished by the handle's drop: every file is whole, and nothing on
    stderr says a write failed (the storage check a write makes on finishing
    only informs, and cannot run once the interpreter is shutting down)."""
    proc = run_python(f"""
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder
        h = AsyncIOBuilder().load().aio_handle(4096, 1, False, False, 1)
        for i in range(3):
            b = h.new_cpu_locked_tensor(2 << 20, torch.empty(0, dtype=torch.uint8))
            b.fill_(0x5A)
            assert h.async_pwrite(b, "{tmp_path}/w" + str(i) + ".bin") == 0
        print("EXITING", flush=True)
    """)
    assert proc.returncode == 0 and "EXITING" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "deepnvme error" not in proc.stderr, "a false failure report at exit: " + proc.stderr[-3000:]
    for i in range(3):
        assert (tmp_path / f"w{i}.bin").read_bytes() == b"\x5a" * (2 << 20), f"w{i}.bin is not whole"
