"""GPU checks of deepnvme's GDS path, through DeepSpeed's own loader.

Run by tests/gpu/run.sh on a machine with an NVIDIA GPU (skipped elsewhere):
device round trips at file offsets; registered, unregistered and narrow
device buffers; pin/unpin; async queues; CPU tensors through a gds_handle;
the same round trips through aio_handle's bounce path for CUDA tensors; and
a side-by-side GB/s of gds and of the bounce path.
"""

import os
import time

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import deepnvme  # noqa: E402
from deepspeed.ops.op_builder import AsyncIOBuilder  # noqa: E402
from deepspeed.ops.op_builder.gds import GDSBuilder  # noqa: E402

BLOCK = 1 << 20
MiB = 1 << 20
BENCH_MB = int(os.environ.get("DEEPNVME_GPU_BENCH_MB", "512"))


@pytest.fixture(scope="module")
def gds_module():
    reason = deepnvme.op_unavailable_reason("gds")
    assert reason is None, f"GDS unavailable on this GPU machine: {reason}"
    module = GDSBuilder().load()
    assert module.__name__ == "deepnvme.gds"
    return module


@pytest.fixture(scope="module")
def aio_module():
    module = AsyncIOBuilder().load()
    assert module.__name__ == "deepnvme.async_io"
    return module


@pytest.fixture
def data_dir():
    # cuFile needs O_DIRECT: a disk-backed directory, not tmpfs.
    root = os.environ.get("DEEPNVME_GPU_TEST_DIR", os.path.join(os.getcwd(), "target", "gpu-test"))
    os.makedirs(root, exist_ok=True)
    return root


def random_bytes(n, device="cuda"):
    return torch.randint(0, 256, (n, ), dtype=torch.uint8, device=device)


def file_bytes(path, offset, n):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


@pytest.mark.parametrize("offset", [0, 4096, 3 * MiB])
def test_registered_round_trip_at_offsets(gds_module, data_dir, offset):
    h = gds_module.gds_handle(BLOCK, 32, False, False, 2)
    n = 8 * MiB
    path = os.path.join(data_dir, f"reg_{offset}.bin")
    src = h.new_pinned_device_tensor(n, torch.empty(0, dtype=torch.uint8, device="cuda"))
    src.copy_(random_bytes(n))
    assert h.sync_pwrite(src, path, offset) == 1
    assert file_bytes(path, offset, n) == bytes(src.cpu().tolist())
    dst = h.new_pinned_device_tensor(n, torch.empty(0, dtype=torch.uint8, device="cuda"))
    assert h.sync_pread(dst, path, offset) == 1
    assert torch.equal(src, dst)
    assert h.free_pinned_device_tensor(src) and h.free_pinned_device_tensor(dst)


def test_unregistered_and_narrow_buffers(gds_module, data_dir):
    h = gds_module.gds_handle(BLOCK, 32, False, False, 1)
    path = os.path.join(data_dir, "narrow.bin")
    plain = random_bytes(4 * MiB)  # never registered: cuFile bounces it
    assert h.sync_pwrite(plain, path, 0) == 1
    base = h.new_pinned_device_tensor(6 * MiB, torch.empty(0, dtype=torch.uint8, device="cuda"))
    base.zero_()
    view = base.narrow(0, MiB, 4 * MiB)  # inside a registered region, at an offset
    assert h.sync_pread(view, path, 0) == 1
    assert torch.equal(view, plain)
    assert int(base[:MiB].count_nonzero()) == 0 and int(base[5 * MiB:].count_nonzero()) == 0
    assert h.free_pinned_device_tensor(base)


def test_pin_and_unpin(gds_module):
    h = gds_module.gds_handle()
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    assert h.pin_device_tensor(t) is True
    assert h.unpin_device_tensor(t) is True
    assert h.unpin_device_tensor(t) is False  # no longer registered: a no-op
    with pytest.raises(RuntimeError):
        h.pin_device_tensor(torch.empty(16, dtype=torch.uint8))  # host memory is refused


def test_async_queue_and_cpu_tensors(gds_module, data_dir):
    h = gds_module.gds_handle(BLOCK, 8, True, True, 2)
    tensors = [random_bytes(2 * MiB) for _ in range(3)]
    paths = [os.path.join(data_dir, f"q{i}.bin") for i in range(3)]
    for t, p in zip(tensors, paths):
        assert h.async_pwrite(t, p, 0) == 0
    cpu = torch.randint(0, 256, (MiB + 1000, ), dtype=torch.uint8)
    cpu_path = os.path.join(data_dir, "cpu.bin")
    assert h.async_pwrite(cpu, cpu_path, 0) == 0  # a CPU tensor takes the CPU path
    assert h.wait() == 4
    for t, p in zip(tensors, paths):
        back = torch.empty_like(t)
        assert h.sync_pread(back, p, 0) == 1 and torch.equal(back, t)
    assert os.path.getsize(cpu_path) == cpu.numel()
    back = torch.empty_like(cpu)
    assert h.sync_pread(back, cpu_path, 0) == 1 and torch.equal(back, cpu)


def test_errors_are_reported_not_fatal(gds_module, data_dir, capfd):
    h = gds_module.gds_handle()
    path = os.path.join(data_dir, "short.bin")
    t = random_bytes(MiB)
    assert h.sync_pwrite(t, path, 0) == 1
    assert h.sync_pread(torch.empty(2 * MiB, dtype=torch.uint8, device="cuda"), path, 0) == -1
    assert "runs past the end of the file" in capfd.readouterr().err


@pytest.mark.parametrize("offset", [0, 512, 4096 + 7])
def test_aio_bounce_path_for_cuda_tensors(aio_module, data_dir, offset):
    h = aio_module.aio_handle(BLOCK, 32, False, True, 2)
    src = random_bytes(4 * MiB + 2)
    path = os.path.join(data_dir, f"bounce_{offset}.bin")
    assert h.sync_pwrite(src, path, offset) == 1
    assert file_bytes(path, offset, src.numel()) == bytes(src.cpu().tolist())
    dst = torch.zeros_like(src)
    assert h.sync_pread(dst, path, offset) == 1
    assert torch.equal(dst, src)
    # Non-contiguous (an even count: DeepSpeed refuses sizes that do not
    # divide among the workers).
    strided = torch.zeros(2 * (2 * MiB + 2), dtype=torch.uint8, device="cuda")[::2]
    assert h.sync_pread(strided, path, offset) == 1
    assert torch.equal(strided, src[:strided.numel()])


def _gbps(n, seconds):
    return n / seconds / 1e9


def test_bandwidth_gds_vs_bounce(gds_module, aio_module, data_dir):
    n = BENCH_MB * MiB
    g = gds_module.gds_handle(BLOCK, 32, False, True, 4)
    a = aio_module.aio_handle(BLOCK, 32, False, True, 4)
    dev = g.new_pinned_device_tensor(n, torch.empty(0, dtype=torch.uint8, device="cuda"))
    dev.copy_(random_bytes(n))
    results = {}
    for name, h in (("gds", g), ("aio bounce", a)):
        path = os.path.join(data_dir, f"bench_{name.replace(' ', '_')}.bin")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        assert h.sync_pwrite(dev, path, 0) == 1
        write = time.perf_counter() - t0
        back = torch.empty_like(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        assert h.sync_pread(back, path, 0) == 1
        torch.cuda.synchronize()
        read = time.perf_counter() - t0
        assert torch.equal(back, dev)
        results[name] = (_gbps(n, write), _gbps(n, read))
        os.remove(path)
    g.free_pinned_device_tensor(dev)
    print(f"\nGB/s for {BENCH_MB} MiB CUDA tensor (block 1 MiB, qd 32, parallelism 4; 1 GB = 1e9 B)")
    print(f"{'path':<12}{'write':>10}{'read':>10}")
    for name, (w, r) in results.items():
        print(f"{name:<12}{w:>10.2f}{r:>10.2f}")
