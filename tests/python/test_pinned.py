"""The process-wide pinned-tensor manager, seen from aio_handle and pin_handle:
narrow recognition, cross-handle sharing, unmanaged tensors, exact-base frees,
free_cpu_locked_tensor_by_ptr, VmLck and deepnvme's pinned_stats()."""

import pytest
import torch

from _util import PAGE, vmlck_kb

N = 4 * 1024  # elements


def test_narrow_of_locked_buffer_is_pinned(handle, locked):
    buf = locked(N, torch.float32)
    assert handle.is_pinned(buf)
    assert handle.is_pinned(buf.narrow(0, 1024, 1024))
    assert handle.is_pinned(buf.narrow(0, 1, 7))  # odd, unaligned offset
    assert handle.is_pinned(buf.narrow(0, N - 1, 1))  # the last element
    assert handle.is_pinned(buf.view(64, 64)[3])  # a row of a reshaped view
    assert handle.is_pinned(buf.view(torch.uint8))  # a dtype view of the whole buffer


def test_buffer_is_shared_across_handles(new_handle, locked):
    a = new_handle(1024, 2, False, False, 1)
    b = new_handle(4096, 8, True, True, 3)
    buf = a.new_cpu_locked_tensor(N, torch.empty(0, dtype=torch.float))
    try:
        assert b.is_pinned(buf)
        assert b.is_pinned(buf.narrow(0, 100, 200))
    finally:
        # freed through the other handle: the manager is one per process
        assert b.free_cpu_locked_tensor(buf) is True
    assert a.free_cpu_locked_tensor(buf) is False


def test_unmanaged_tensor_is_not_pinned(handle, locked):
    assert not handle.is_pinned(torch.empty(N, dtype=torch.float))
    assert not handle.is_pinned(torch.zeros(PAGE, dtype=torch.uint8)[PAGE // 2:])
    assert not handle.is_pinned(torch.empty(0))
    # a plain copy of a locked buffer is not locked
    buf = locked(N)
    assert not handle.is_pinned(buf.clone())
    assert handle.free_cpu_locked_tensor(torch.empty(N)) is False


def test_pin_handle_buffer_recognized_by_aio_handle(pin_mod, handle):
    ph = pin_mod.pin_handle()
    buf = ph.new_cpu_locked_tensor(N, torch.empty(0, dtype=torch.float))
    try:
        assert buf.dtype == torch.float32 and buf.shape == (N,)
        assert buf.data_ptr() % PAGE == 0
        assert ph.is_pinned(buf)
        assert handle.is_pinned(buf)
        assert handle.is_pinned(buf.narrow(0, 1024, 1024))
        assert ph.is_pinned(buf.narrow(0, 1024, 1024))
    finally:
        assert handle.free_cpu_locked_tensor(buf) is True  # freed through the other op
    assert ph.free_cpu_locked_tensor(buf) is False


def test_a_sparse_example_gives_a_dense_locked_tensor(pin_mod):
    """pin_handle takes the example's options: a sparse example made a
    sparse tensor over the locked bytes (the compiled front end), which could
    not be freed and crashed when printed."""
    ph = pin_mod.pin_handle()
    example = torch.zeros(4, dtype=torch.float32).to_sparse()
    buf = ph.new_cpu_locked_tensor(N, example)
    assert buf.layout == torch.strided and buf.dtype == torch.float32 and buf.shape == (N,)
    buf.fill_(2.0)
    assert float(buf.sum()) == 2.0 * N and "tensor(" in repr(buf)
    assert ph.free_cpu_locked_tensor(buf) is True


def test_aio_handle_buffer_recognized_by_pin_handle(pin_mod, handle):
    ph = pin_mod.pin_handle()
    buf = handle.new_cpu_locked_tensor(N, torch.empty(0, dtype=torch.int64))
    try:
        assert handle.is_pinned(buf)
        assert ph.is_pinned(buf)
        assert not ph.is_pinned(torch.empty(N, dtype=torch.int64))
    finally:
        assert ph.free_cpu_locked_tensor(buf) is True
    assert handle.free_cpu_locked_tensor(buf) is False


def test_two_pin_handles_share_one_manager(pin_mod):
    a, b = pin_mod.pin_handle(), pin_mod.pin_handle()
    buf = a.new_cpu_locked_tensor(100, torch.empty(0, dtype=torch.float16))
    assert b.is_pinned(buf)
    assert b.free_cpu_locked_tensor(buf) is True
    assert a.free_cpu_locked_tensor(buf) is False


def test_free_by_ptr_base_interior_unknown(pin_mod, native):
    ph = pin_mod.pin_handle()
    base_stats = native.pinned_stats()
    buf = ph.new_cpu_locked_tensor(3 * PAGE, torch.empty(0, dtype=torch.uint8))
    ptr = buf.data_ptr()
    assert native.pinned_stats()[0] == base_stats[0] + 1
    # interior addresses are not allocation bases: nothing is freed
    assert ph.free_cpu_locked_tensor_by_ptr(ptr + 1) is False
    assert ph.free_cpu_locked_tensor_by_ptr(ptr + PAGE) is False
    # an address no allocation ever had
    assert ph.free_cpu_locked_tensor_by_ptr(torch.empty(16).data_ptr()) is False
    assert ph.free_cpu_locked_tensor_by_ptr(0) is False
    assert ph.is_pinned(buf)
    buf[-1] = 7  # still allocated and writable
    assert native.pinned_stats()[0] == base_stats[0] + 1
    # the exact base frees it, once
    assert ph.free_cpu_locked_tensor_by_ptr(ptr) is True
    assert ph.free_cpu_locked_tensor_by_ptr(ptr) is False
    assert native.pinned_stats() == base_stats


def test_free_of_a_narrow_frees_nothing(handle, native):
    buf = handle.new_cpu_locked_tensor(4 * PAGE, torch.empty(0, dtype=torch.uint8))
    try:
        stats = native.pinned_stats()
        assert handle.free_cpu_locked_tensor(buf.narrow(0, 1, 10)) is False
        assert handle.free_cpu_locked_tensor(buf.narrow(0, PAGE, PAGE)) is False
        # A view that starts at the base passes DeepSpeed's base check; it
        # is not the allocation, so nothing is freed (the C++ frees it all).
        assert handle.free_cpu_locked_tensor(buf.narrow(0, 0, PAGE)) is False
        assert handle.free_cpu_locked_tensor(buf[:1]) is False
        assert native.pinned_stats() == stats
        assert handle.is_pinned(buf)
    finally:
        # The whole allocation in another shape and dtype is the allocation.
        assert handle.free_cpu_locked_tensor(buf.view(torch.int32).view(PAGE, 1)) is True


def test_pinned_stats_and_vmlck_track_allocations(handle, native):
    nbytes = 64 * PAGE
    stats0 = native.pinned_stats()
    lck0 = vmlck_kb()
    bufs = [handle.new_cpu_locked_tensor(nbytes // 4, torch.empty(0, dtype=torch.float32)) for _ in range(3)]
    regions, requested, locked_bytes = native.pinned_stats()
    assert regions == stats0[0] + 3
    assert requested == stats0[1] + 3 * nbytes
    assert locked_bytes >= stats0[2] + 3 * nbytes
    assert vmlck_kb() >= lck0 + 3 * nbytes // 1024, "new_cpu_locked_tensor did not mlock"
    for b in bufs:
        assert handle.free_cpu_locked_tensor(b) is True
    assert native.pinned_stats() == stats0
    assert vmlck_kb() == lck0


def test_many_allocations_distinct_and_recognized(pin_mod, handle, native):
    ph = pin_mod.pin_handle()
    stats0 = native.pinned_stats()
    bufs = [ph.new_cpu_locked_tensor(1 + 37 * i, torch.empty(0, dtype=torch.uint8)) for i in range(200)]
    try:
        ptrs = [b.data_ptr() for b in bufs]
        assert len(set(ptrs)) == len(ptrs)
        assert all(p % PAGE == 0 for p in ptrs)
        assert all(handle.is_pinned(b) for b in bufs)
        for i, b in enumerate(bufs):
            b.fill_(i % 251)
        assert all(int(b[0]) == i % 251 and int(b[-1]) == i % 251 for i, b in enumerate(bufs))
    finally:
        freed = [ph.free_cpu_locked_tensor(b) for b in bufs[::2]] + \
                [ph.free_cpu_locked_tensor_by_ptr(b.data_ptr()) for b in bufs[1::2]]
    assert all(freed)
    assert native.pinned_stats() == stats0


def test_zero_element_locked_tensor_is_freed(handle, pin_mod, native):
    stats0 = native.pinned_stats()
    t = handle.new_cpu_locked_tensor(0, torch.empty(0, dtype=torch.float32))
    try:
        assert t.numel() == 0 and t.dtype == torch.float32
        handle.free_cpu_locked_tensor(t)
        assert native.pinned_stats() == stats0
    finally:
        # do not leave the leaked region behind for later tests
        pin_mod.pin_handle().free_cpu_locked_tensor_by_ptr(t.untyped_storage().data_ptr())


def test_negative_num_elem_raises(handle, native):
    stats0 = native.pinned_stats()
    with pytest.raises(RuntimeError):
        handle.new_cpu_locked_tensor(-1, torch.empty(0))
    assert native.pinned_stats() == stats0


def test_locked_memory_goes_with_its_last_tensor(handle, pin_mod, native):
    """A locked tensor nobody frees (DeepSpeed's swappers allocate with
    new_cpu_locked_tensor and never free; an engine's destroy() just drops
    them) is unlocked and unmapped when its last reference goes -- a view
    keeps it -- instead of staying locked until the process exits."""
    import gc

    stats0 = native.pinned_stats()
    lck0 = vmlck_kb()
    for make in (handle.new_cpu_locked_tensor, pin_mod.pin_handle().new_cpu_locked_tensor):
        t = make(16 * PAGE, torch.empty(0, dtype=torch.uint8))
        t.fill_(3)
        view = t[PAGE:2 * PAGE]
        del t
        gc.collect()
        assert handle.is_pinned(view) and native.pinned_stats()[0] == stats0[0] + 1
        assert int(view.sum()) == 3 * PAGE
        del view
        gc.collect()
        assert native.pinned_stats() == stats0
        assert vmlck_kb() == lck0


def test_a_freed_tensor_stays_readable_until_it_goes(handle, native):
    """free_cpu_locked_tensor unmanages and unlocks at once (DeepSpeed's
    free); the tensor, still referenced, keeps valid memory instead of
    pointing at an unmapped page, and a later free of its address frees
    nothing else."""
    stats0 = native.pinned_stats()
    t = handle.new_cpu_locked_tensor(PAGE, torch.empty(0, dtype=torch.uint8))
    t.fill_(9)
    assert handle.free_cpu_locked_tensor(t) is True
    assert native.pinned_stats() == stats0 and not handle.is_pinned(t)
    assert int(t.sum()) == 9 * PAGE
    other = handle.new_cpu_locked_tensor(PAGE, torch.empty(0, dtype=torch.uint8))
    try:
        assert other.data_ptr() != t.data_ptr()  # the address is not reused while t lives
    finally:
        del t
        assert handle.is_pinned(other)
        assert handle.free_cpu_locked_tensor(other) is True
