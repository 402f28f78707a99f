"""Cases that need a CUDA GPU. They are skipped here (no GPU); they must run on
a GPU machine, where torch.cuda.is_available() is True:

* torch-pinned host memory (tensor.pin_memory() needs the CUDA runtime),
* CUDA tensors bounced through host memory by aio_handle,
* DeepSpeed's own GIL test shape with CUDA-pinned memory,
* gds_handle with device buffers (skipped, naming the reason, where cuFile is unavailable).
"""

import os

import pytest

from conftest import module_name
import torch

from _util import PAGE, fill, pattern, peer_progress_during, tbytes

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (torch.cuda.is_available() is False here); run on a GPU machine",
)


def test_torch_pinned_buffer_is_pinned_and_round_trips(handle, data_dir):
    n = 3 * PAGE + 10
    data = pattern(n, 1)
    t = torch.empty(n, dtype=torch.uint8).pin_memory()
    fill(t, data)
    assert t.is_pinned()
    assert handle.is_pinned(t)
    assert handle.sync_pwrite(t, str(data_dir / "p")) == 1
    assert (data_dir / "p").read_bytes() == data
    d = torch.zeros(n, dtype=torch.uint8).pin_memory()
    assert handle.sync_pread(d, str(data_dir / "p")) == 1
    assert tbytes(d) == data


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cuda_tensor_round_trip(handle, data_dir, dtype, mode):
    numel = 4 * PAGE + 2
    itemsize = torch.empty(0, dtype=dtype).element_size()
    data = pattern(numel * itemsize, 2)
    src = torch.empty(numel, dtype=dtype, device="cuda")
    fill(src, data)  # copy_ from a CPU tensor
    assert not handle.is_pinned(src)
    p = str(data_dir / "c")
    if mode == "sync":
        assert handle.sync_pwrite(src, p) == 1
    else:
        assert handle.async_pwrite(src, p) == 0
        assert handle.wait() == 1
    assert (data_dir / "c").read_bytes() == data
    dst = torch.zeros(numel, dtype=dtype, device="cuda")
    if mode == "sync":
        assert handle.sync_pread(dst, p) == 1
    else:
        assert handle.async_pread(dst, p) == 0
        assert handle.wait() == 1
    assert tbytes(dst.cpu()) == data


def test_noncontiguous_cuda_tensor_round_trip(handle, data_dir):
    x = torch.empty(64, 48, dtype=torch.float32, device="cuda")
    view = x.t()
    data = pattern(view.nbytes, 3)
    fill(view, data)
    assert handle.sync_pwrite(view, str(data_dir / "nc")) == 1
    assert (data_dir / "nc").read_bytes() == data
    y = torch.zeros(64, 48, dtype=torch.float32, device="cuda")
    assert handle.sync_pread(y.t(), str(data_dir / "nc")) == 1
    assert tbytes(y.t().cpu()) == data


@pytest.mark.parametrize("operation", ["pread", "pwrite", "sync_pread", "sync_pwrite"])
def test_blocking_aio_releases_gil_with_cuda_pinned_memory(new_handle, data_dir, operation):
    """DeepSpeed's tests/unit/v1/nvme/test_aio_gil.py shape."""
    h = new_handle(4096, 2, True, True, 2)
    payload = os.urandom(4096)
    source = data_dir / "source.bin"
    source.write_bytes(payload)
    target = str(data_dir / "target.bin")
    if "pread" in operation:
        buf = torch.zeros(4096, dtype=torch.uint8).pin_memory()
    else:
        buf = torch.tensor(list(payload), dtype=torch.uint8).pin_memory()
        assert h.sync_pwrite(buf, target) == 1

    def call():
        if operation == "pread":
            assert h.pread(buf, str(source), False, False, 0) == 1
        elif operation == "pwrite":
            assert h.pwrite(buf, target, False, False, 0) == 1
        elif operation == "sync_pread":
            assert h.sync_pread(buf, str(source), 0) == 1
        else:
            assert h.sync_pwrite(buf, target, 0) == 1

    assert peer_progress_during(call, max_calls=32) is not None
    if "pread" in operation:
        assert bytes(buf.tolist()) == payload
    else:
        assert (data_dir / "target.bin").read_bytes() == payload


def test_gds_handle_device_buffers_round_trip(data_dir):
    import deepnvme
    from deepspeed.ops.op_builder import GDSBuilder

    reason = deepnvme.op_unavailable_reason("gds")
    if reason is not None:
        pytest.skip(f"GPUDirect Storage is unavailable here: {reason}")
    assert GDSBuilder().is_compatible()
    gds = GDSBuilder().load()
    assert gds.__name__ == module_name("gds")
    h = gds.gds_handle(1 << 20, 32, False, False, 1)
    n = 1 << 20
    data = pattern(n, 4)
    buf = h.new_pinned_device_tensor(n, torch.empty(0, dtype=torch.uint8, device="cuda"))
    try:
        fill(buf, data)
        assert h.sync_pwrite(buf, str(data_dir / "g")) == 1
        assert (data_dir / "g").read_bytes() == data
        buf.zero_()
        assert h.sync_pread(buf, str(data_dir / "g")) == 1
        assert tbytes(buf.cpu()) == data
        other = torch.zeros(n, dtype=torch.uint8, device="cuda")
        assert h.pin_device_tensor(other)
        assert h.async_pread(other, str(data_dir / "g")) == 0
        assert h.wait() == 1
        assert tbytes(other.cpu()) == data
        assert h.unpin_device_tensor(other)
    finally:
        assert h.free_pinned_device_tensor(buf)
