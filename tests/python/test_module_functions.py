"""async_io's module functions: aio_read, aio_write, deepspeed_memcpy."""

import pytest
import torch

from _util import PAGE, fill, pattern, tbytes, tensor_from_bytes


@pytest.mark.parametrize("single_submit", [False, True])
@pytest.mark.parametrize("overlap_events", [False, True])
@pytest.mark.parametrize("block_size,queue_depth", [(4096, 1), (8192, 4), (1 << 20, 32)])
def test_aio_write_then_aio_read(aio, locked, data_dir, single_submit, overlap_events, block_size, queue_depth):
    n = 9 * PAGE + 321
    data = pattern(n, 900)
    for kind in ("locked", "bounce"):
        src = locked(n) if kind == "locked" else torch.empty(n, dtype=torch.uint8)
        fill(src, data)
        p = str(data_dir / f"aio-{kind}.bin")
        assert aio.aio_write(src, p, block_size, queue_depth, single_submit, overlap_events, False) == 0
        assert (data_dir / f"aio-{kind}.bin").read_bytes() == data
        dst = locked(n) if kind == "bounce" else torch.zeros(n, dtype=torch.uint8)
        dst.zero_()
        assert aio.aio_read(dst, p, block_size, queue_depth, single_submit, overlap_events, False) == 0
        assert tbytes(dst) == data


def test_aio_functions_validate_prints_pass(aio, data_dir, capfd):
    data = pattern(3 * PAGE, 901)
    p = str(data_dir / "v.bin")
    capfd.readouterr()
    assert aio.aio_write(tensor_from_bytes(data), p, 4096, 4, False, False, True) == 0
    dst = torch.zeros(len(data), dtype=torch.uint8)
    assert aio.aio_read(dst, p, 4096, 4, False, False, True) == 0
    out = capfd.readouterr()
    assert (out.out + out.err).count("Pass:") == 2
    assert tbytes(dst) == data


def test_aio_read_missing_file_returns_minus_one(aio, data_dir, capfd):
    p = data_dir / "missing.bin"
    assert aio.aio_read(torch.zeros(PAGE, dtype=torch.uint8), str(p), 4096, 4, False, False, False) == -1
    err = capfd.readouterr().err
    assert str(p) in err


def test_aio_read_size_mismatch_returns_minus_one(aio, data_dir, capfd):
    p = data_dir / "short.bin"
    p.write_bytes(pattern(100, 1))
    dst = torch.zeros(PAGE, dtype=torch.uint8)
    assert aio.aio_read(dst, str(p), 4096, 4, False, False, False) == -1
    err = capfd.readouterr().err
    assert str(p) in err and str(PAGE) in err and "100" in err


def test_aio_invalid_knobs_return_minus_one_or_raise(aio, data_dir):
    t = tensor_from_bytes(pattern(PAGE, 2))
    try:
        rc = aio.aio_write(t, str(data_dir / "x"), 0, 4, False, False, False)
    except RuntimeError:
        return
    assert rc == -1


# ------------------------------------------------------- deepspeed_memcpy ----

def test_memcpy_copies_dest_size0_float32_elements(aio):
    src = torch.arange(100, dtype=torch.float32) + 0.5
    dest = torch.full((40,), -1.0)
    assert aio.deepspeed_memcpy(dest, src) == 0
    assert torch.equal(dest, src[:40])


def test_memcpy_2d_dest_copies_only_size0_elements(aio):
    """DeepSpeed's memcpy copies dest.size(0) float32 elements, not numel()."""
    src = torch.arange(100, dtype=torch.float32)
    dest = torch.full((4, 3), -1.0)
    assert aio.deepspeed_memcpy(dest, src) == 0
    flat = dest.reshape(-1)
    assert torch.equal(flat[:4], src[:4])
    assert torch.equal(flat[4:], torch.full((8,), -1.0))


def test_memcpy_equal_sizes_and_locked_buffers(aio, locked):
    src = locked(4096, torch.float32)
    src.copy_(torch.randn(4096, generator=torch.Generator().manual_seed(3)))
    dest = torch.zeros(4096)
    assert aio.deepspeed_memcpy(dest, src) == 0
    assert torch.equal(dest, src)
    dest2 = locked(4096, torch.float32)
    assert aio.deepspeed_memcpy(dest2, dest) == 0
    assert torch.equal(dest2, src)


@pytest.mark.parametrize("dest_dtype,src_dtype", [
    (torch.float64, torch.float32),
    (torch.float32, torch.float64),
    (torch.float16, torch.float32),
    (torch.float32, torch.float16),
    (torch.int64, torch.int64),
    (torch.uint8, torch.uint8),
], ids=str)
def test_memcpy_wrong_dtype_raises(aio, dest_dtype, src_dtype):
    src = torch.ones(64, dtype=src_dtype)
    dest = torch.zeros(64, dtype=dest_dtype)
    guard = torch.zeros(64, dtype=dest_dtype)
    with pytest.raises(RuntimeError):
        aio.deepspeed_memcpy(dest, src)
    assert torch.equal(dest, guard), "a refused memcpy still wrote"


@pytest.mark.parametrize("src_len", [0, 1, 39])
def test_memcpy_too_small_src_raises(aio, src_len):
    src = torch.ones(src_len, dtype=torch.float32)
    dest = torch.full((40,), -1.0)
    with pytest.raises(RuntimeError) as info:
        aio.deepspeed_memcpy(dest, src)
    assert "40" in str(info.value) or "160" in str(info.value), str(info.value)
    assert torch.equal(dest, torch.full((40,), -1.0)), "a refused memcpy still wrote"


def test_memcpy_empty_dest_copies_nothing(aio):
    assert aio.deepspeed_memcpy(torch.zeros(0), torch.ones(5)) == 0
