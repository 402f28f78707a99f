"""Buffer kinds: locked (new_cpu_locked_tensor), unpinned CPU (bounce), narrows
of a locked buffer at aligned and odd offsets, non-contiguous tensors, and
several dtypes. Every case must round-trip exactly and must not touch memory
outside the tensor it was given.
"""

import zlib

import pytest
import torch

from _util import DTYPES, PAGE, fill, pattern, tbytes, tensor_from_bytes

SENTINEL = 0xC3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("src_kind", ["locked", "bounce"])
@pytest.mark.parametrize("dst_kind", ["locked", "bounce"])
def test_dtype_round_trip(handle, locked, data_dir, dtype, src_kind, dst_kind):
    numel = 3 * PAGE + 6  # nbytes divisible by 2 workers for every dtype, not page-aligned
    itemsize = torch.empty(0, dtype=dtype).element_size()
    data = pattern(numel * itemsize, 11)
    src = locked(numel, dtype) if src_kind == "locked" else torch.empty(numel, dtype=dtype)
    fill(src, data)
    assert handle.is_pinned(src) == (src_kind == "locked")
    p = str(data_dir / "d.bin")
    assert handle.sync_pwrite(src, p) == 1
    assert (data_dir / "d.bin").read_bytes() == data
    dst = locked(numel, dtype) if dst_kind == "locked" else torch.empty(numel, dtype=dtype)
    dst.view(torch.uint8).fill_(SENTINEL)
    assert handle.sync_pread(dst, p) == 1
    assert dst.dtype == dtype
    assert tbytes(dst) == data


@pytest.mark.parametrize("offset_bytes", [0, PAGE, 8 * PAGE, 7, 513, PAGE + 1], ids=lambda v: f"at{v}")
@pytest.mark.parametrize("length", [4 * PAGE, 3 * PAGE + 10], ids=lambda v: f"len{v}")
def test_narrow_of_locked_buffer(handle, locked, data_dir, offset_bytes, length):
    total = 16 * PAGE
    base = locked(total)
    base.fill_(SENTINEL)
    view = base.narrow(0, offset_bytes, length)
    assert handle.is_pinned(view)
    data = pattern(length, offset_bytes + length)
    fill(view, data)
    p = str(data_dir / "n.bin")
    assert handle.sync_pwrite(view, p) == 1
    assert (data_dir / "n.bin").read_bytes() == data

    base.fill_(SENTINEL)
    assert handle.sync_pread(view, p) == 1
    assert tbytes(view) == data
    # Nothing outside the narrow was written.
    raw = tbytes(base)
    assert set(raw[:offset_bytes]) <= {SENTINEL}
    assert set(raw[offset_bytes + length:]) <= {SENTINEL}

    # And asynchronously, through a narrow of a float32 locked buffer at an odd element offset.
    f = locked(total // 4, torch.float32)
    f.view(torch.uint8).fill_(SENTINEL)
    fview = f.narrow(0, 3, length // 4 // 2 * 2)
    fdata = pattern(fview.nbytes, 99)
    fill(fview, fdata)
    assert handle.async_pwrite(fview, str(data_dir / "nf.bin")) == 0
    assert handle.wait() == 1
    assert (data_dir / "nf.bin").read_bytes() == fdata
    f.view(torch.uint8).fill_(SENTINEL)
    assert handle.async_pread(fview, str(data_dir / "nf.bin")) == 0
    assert handle.wait() == 1
    assert tbytes(fview) == fdata
    fraw = tbytes(f)
    assert set(fraw[:12]) == {SENTINEL}
    assert set(fraw[12 + fview.nbytes:]) <= {SENTINEL}


def _noncontiguous_views(locked):
    """(name, view, backing) for several non-contiguous tensors, plain and locked-backed."""
    out = []
    plain2d = torch.empty(96, 40, dtype=torch.float32)
    out.append(("transposed-plain", plain2d.t(), plain2d))
    lk = locked(96 * 40, torch.float32)
    out.append(("transposed-locked", lk.view(96, 40).t(), lk))
    plain1d = torch.empty(2 * 3000, dtype=torch.int64)
    out.append(("strided-plain", plain1d[::2], plain1d))
    lk1 = locked(2 * 3000, torch.int64)
    out.append(("strided-locked", lk1[::2], lk1))
    lk2 = locked(64 * 64, torch.float16)
    out.append(("column-block-locked", lk2.view(64, 64)[:, 8:40], lk2))
    u8 = locked(3 * 4000 + 1)
    out.append(("odd-stride-uint8-locked", u8[1::3], u8))  # 4000 bytes, starting at an odd address
    return out


@pytest.mark.parametrize("mode", ["sync", "async", "pread", "read"])
def test_noncontiguous_round_trip(handle, locked, data_dir, mode):
    """The C++ lost reads into a non-contiguous pinned destination; ours must not."""
    for name, view, backing in _noncontiguous_views(locked):
        assert not view.is_contiguous(), name
        data = pattern(view.nbytes, zlib.crc32(name.encode()))
        fill(view, data)
        p = str(data_dir / f"{name}.bin")
        # write from the non-contiguous tensor: the file holds its logical order
        if mode == "sync":
            assert handle.sync_pwrite(view, p) == 1
        elif mode == "async":
            assert handle.async_pwrite(view, p) == 0
            assert handle.wait() == 1
        elif mode == "pread":
            assert handle.pwrite(view, p, False, False) == 1
        else:
            assert handle.write(view, p, False) == 0
        assert (data_dir / f"{name}.bin").read_bytes() == data, name

        # read into it: the tensor holds the file's bytes, the gaps keep theirs
        backing.view(torch.uint8).fill_(SENTINEL)
        if mode == "sync":
            assert handle.sync_pread(view, p) == 1
        elif mode == "async":
            assert handle.async_pread(view, p) == 0
            assert handle.wait() == 1
        elif mode == "pread":
            assert handle.pread(view, p, False, False) == 1
        else:
            assert handle.read(view, p, False) == 0
        assert tbytes(view) == data, f"{name}: read into a non-contiguous tensor lost data"
        # Elements of the backing buffer that are not in the view keep the sentinel.
        mask = torch.ones(backing.numel(), dtype=torch.bool)
        positions = torch.as_strided(torch.arange(backing.numel()), view.shape, view.stride(),
                                     view.storage_offset() - backing.storage_offset())
        mask[positions.reshape(-1)] = False
        gaps = backing.reshape(-1).view(torch.uint8).view(backing.numel(), -1)[mask]
        assert bool((gaps == SENTINEL).all()), f"{name}: bytes outside the view were overwritten"


def test_noncontiguous_aio_module_functions(aio, data_dir):
    x = torch.empty(50, 30, dtype=torch.float32)
    view = x.t()
    data = pattern(view.nbytes, 21)
    fill(view, data)
    p = str(data_dir / "m.bin")
    assert aio.aio_write(view, p, 4096, 2, False, False, False) == 0
    assert (data_dir / "m.bin").read_bytes() == data
    y = torch.zeros(50, 30, dtype=torch.float32)
    assert aio.aio_read(y.t(), p, 4096, 2, False, False, False) == 0
    assert tbytes(y.t()) == data


def test_multidimensional_contiguous_tensor(handle, locked, data_dir):
    lk = locked(4 * 5 * 256, torch.float32)
    t = lk.view(4, 5, 256)
    data = pattern(t.nbytes, 22)
    fill(t, data)
    assert handle.sync_pwrite(t, str(data_dir / "3d")) == 1
    out = torch.empty(4, 5, 256)
    assert handle.sync_pread(out, str(data_dir / "3d")) == 1
    assert tbytes(out) == data


def test_unpinned_buffer_at_odd_address(handle, data_dir):
    """A plain tensor whose data starts at an odd address (storage offset 1)."""
    backing = torch.empty(5 * PAGE + 1, dtype=torch.uint8)
    view = backing[1:]
    assert view.data_ptr() % 2 == 1
    data = pattern(view.nbytes, 23)
    fill(view, data)
    assert handle.sync_pwrite(view, str(data_dir / "odd")) == 1
    assert (data_dir / "odd").read_bytes() == data
    backing.fill_(SENTINEL)
    assert handle.sync_pread(view, str(data_dir / "odd")) == 1
    assert tbytes(view) == data
    assert int(backing[0]) == SENTINEL


def test_write_buffer_is_not_modified(handle, locked, data_dir):
    for t in (locked(3 * PAGE), torch.empty(3 * PAGE, dtype=torch.uint8)):
        data = pattern(t.nbytes, 24)
        fill(t, data)
        assert handle.sync_pwrite(t, str(data_dir / "w")) == 1
        assert tbytes(t) == data


def test_bounced_write_snapshots_buffer_at_submission(handle, data_dir):
    """An unpinned source is copied when the op is submitted (DeepSpeed's bounce):
    changing it afterwards does not change what lands in the file."""
    data = pattern(4 * PAGE, 25)
    t = tensor_from_bytes(data)
    assert handle.async_pwrite(t, str(data_dir / "snap")) == 0
    t.fill_(0)
    assert handle.wait() == 1
    assert (data_dir / "snap").read_bytes() == data


def test_validate_with_noncontiguous_buffers_prints_pass(handle, data_dir, capfd):
    x = torch.empty(64, 32, dtype=torch.float32)
    fill(x.t(), pattern(x.nbytes, 26))
    p = str(data_dir / "vnc.bin")
    capfd.readouterr()
    assert handle.pwrite(x.t(), p, True, False) == 1
    y = torch.zeros(64, 32)
    assert handle.pread(y.t(), p, True, False) == 1
    out = capfd.readouterr()
    assert (out.out + out.err).count("Pass:") == 2
    assert "Fail" not in out.out + out.err
    assert tbytes(y.t()) == tbytes(x.t())
