"""DeepSpeed's loader, ds_report, the environment (O_DIRECT, no libaio) and GDS.

The suite relies on deepnvme's .pth hook: DeepSpeed's own op builders must
hand out deepnvme's modules, with no JIT build and no libaio.
"""

import ctypes.util
import os
import re
import subprocess
import sys

import pytest
import torch

from _util import ANSI, o_direct_supported, run_python
from conftest import module_name


def test_tmp_path_supports_o_direct(tmp_path):
    ok, why = o_direct_supported(str(tmp_path))
    assert ok, (
        f"{tmp_path} does not accept O_DIRECT ({why}); the suite must run on a disk file "
        f"system (ext4/xfs): pass --basetemp=/path/on/disk"
    )


def test_async_io_builder_returns_deepnvme_module(aio):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    assert aio.__name__ == module_name("async_io")
    assert AsyncIOBuilder().load() is aio
    assert AsyncIOBuilder().is_compatible() is True
    for name in ("aio_handle", "aio_read", "aio_write", "deepspeed_memcpy"):
        assert hasattr(aio, name), name
    for method in (
        "get_block_size", "get_queue_depth", "get_single_submit", "get_overlap_events",
        "get_intra_op_parallelism", "get_alignment", "read", "write", "pread", "pwrite",
        "sync_pread", "sync_pwrite", "async_pread", "async_pwrite", "new_cpu_locked_tensor",
        "free_cpu_locked_tensor", "is_pinned", "wait",
    ):
        assert hasattr(aio.aio_handle, method), method


def test_pin_memory_builder_returns_deepnvme_module(pin_mod):
    from deepspeed.ops.op_builder import PinMemoryBuilder

    assert pin_mod.__name__ == module_name("pin_memory")
    assert PinMemoryBuilder().load() is pin_mod
    assert PinMemoryBuilder().is_compatible() is True
    for method in ("new_cpu_locked_tensor", "free_cpu_locked_tensor", "free_cpu_locked_tensor_by_ptr", "is_pinned"):
        assert hasattr(pin_mod.pin_handle, method), method


def test_native_core_reports_engine_and_stats(native):
    assert native.engine_name() in ("io_uring", "psync")
    regions, requested, locked = native.pinned_stats()
    assert regions >= 0 and requested >= 0 and locked >= 0
    soft, hard = native.memlock_rlimit()
    assert soft >= 0 and hard >= 0


def test_libaio_is_not_needed(aio):
    """deepnvme works without libaio: nothing it loaded maps libaio."""
    with open("/proc/self/maps") as f:
        mapped = f.read()
    assert "libaio" not in mapped, "a deepnvme module pulled in libaio"
    if ctypes.util.find_library("aio") is not None:
        pytest.skip("libaio is installed on this machine (not uninstalled on purpose); "
                    "the /proc/self/maps check above shows it is not used")
    assert ctypes.util.find_library("aio") is None


def test_ds_report_lists_ops_installed_and_compatible():
    """deepnvme's ops are installed and compatible; DeepSpeed's (in a mix,
    DEEPNVME_OPS) are left as DeepSpeed reports them; a line names who
    provides which."""
    import deepnvme

    provided = deepnvme.provided_ops()
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ds_report")],
        capture_output=True, text=True, timeout=120,
    )
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out
    for op in ("async_io", "pin_memory"):
        m = re.search(rf"^{op} \.+ \[(\w+)\] \.+ \[(\w+)\]", out, re.M)
        assert m, f"ds_report does not list {op}:\n{out}"
        if op in provided:
            assert m.groups() == ("YES", "OKAY"), f"{op}: {m.group(0)}"
        else:
            assert m.group(1) == "NO", f"{op} is DeepSpeed's here, not installed: {m.group(0)}"
    ours = ", ".join(provided) or "none"
    theirs = ", ".join(op for op in deepnvme.OPS if op not in provided) or "none"
    assert f"Rust core provides {ours}; DeepSpeed's C++ (JIT) provides {theirs}" in out, out


def test_engine_psync_round_trip_in_subprocess(tmp_path):
    """The psync engine (DEEPNVME_ENGINE=psync) moves the same bytes as io_uring."""
    code = f"""
        import os, random, torch, deepnvme
        from deepspeed.ops.op_builder import AsyncIOBuilder
        h = AsyncIOBuilder().load().aio_handle(4096, 4, False, True, 2)
        assert deepnvme.native().engine_name() == "psync", deepnvme.native().engine_name()
        data = random.Random(7).randbytes(3 * 4096 + 1000)
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
        assert h.sync_pwrite(src, {str(tmp_path / 'p.bin')!r}) == 1
        assert open({str(tmp_path / 'p.bin')!r}, 'rb').read() == data
        dst = h.new_cpu_locked_tensor(len(data), torch.empty(0, dtype=torch.uint8))
        assert h.sync_pread(dst, {str(tmp_path / 'p.bin')!r}) == 1
        assert bytes(dst.numpy()) == data
        assert h.free_cpu_locked_tensor(dst)
        print("PSYNC-OK")
    """
    proc = run_python(code, env={"DEEPNVME_ENGINE": "psync"})
    assert proc.returncode == 0 and "PSYNC-OK" in proc.stdout, proc.stdout + proc.stderr


# ---------------------------------------------------------------- GDS ----

# On the CPU accelerator DeepSpeed itself maps `deepspeed.ops.op_builder.GDSBuilder`
# to its NotImplementedBuilder; deepnvme leaves that choice alone. The GDS
# builder class (the one the CUDA accelerator returns) is tested directly.


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer; this machine has a GPU")
def test_gds_builder_is_not_compatible_without_gpu():
    from deepspeed.ops.op_builder.gds import GDSBuilder

    assert GDSBuilder().is_compatible() is False


def test_gds_builder_load_imports_deepnvme_gds():
    from deepspeed.ops.op_builder.gds import GDSBuilder

    gds = GDSBuilder().load()
    assert gds.__name__ == module_name("gds")
    assert hasattr(gds, "gds_handle")


def test_deepnvme_gds_module_imports():
    """Independent of DeepSpeed's builder mapping: the module itself must import."""
    import deepnvme

    gds = deepnvme.load_op("gds")
    for method in ("new_pinned_device_tensor", "free_pinned_device_tensor", "pin_device_tensor",
                   "unpin_device_tensor", "sync_pread", "async_pwrite", "wait", "get_alignment"):
        assert hasattr(gds.gds_handle, method), method


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_gds_handle_without_gpu_raises_clear_runtime_error():
    import deepnvme

    gds = deepnvme.load_op("gds")
    with pytest.raises(RuntimeError) as info:
        gds.gds_handle(1 << 20, 32, False, False, 1)
    msg = str(info.value)
    assert "not wired" not in msg, msg
    assert re.search(r"GPU|CUDA|cuFile|GPUDirect", msg), msg
    # The process is still alive and the CPU handle still works.
    assert deepnvme.load_op("async_io").aio_handle().wait() == 0


def test_gds_unavailable_reason_is_a_sentence():
    import deepnvme

    reason = deepnvme.op_unavailable_reason("gds")
    if torch.cuda.is_available() and reason is None:
        return
    assert isinstance(reason, str) and len(reason) > 10
    assert deepnvme.op_unavailable_reason("async_io") is None
    assert deepnvme.op_unavailable_reason("pin_memory") is None
    with pytest.raises(ValueError):
        deepnvme.load_op("nope")
