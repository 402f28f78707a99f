"""FastPersist's writer (deepspeed.io.FastFileWriter) over deepnvme's
aio_handle: torch.save of a state dict streams through a locked I/O buffer
and the handle's async_pwrite at O_DIRECT offsets; torch.load must read back
exactly what was saved.

Two CPU substitutions, because DeepSpeed's FastFileWriter assumes a GPU build:

* the I/O buffer: DeepSpeed's checkpoint code makes it with
  ``get_accelerator().pin_memory`` (CUDA-pinned; torch cannot pin without a
  GPU). FastFileWriterConfig takes the tensor as it is, so the test passes a
  buffer from the handle's own ``new_cpu_locked_tensor`` (mlock-ed by
  deepnvme), which is what the aio path needs to skip bouncing.
* the byte cast: FastFileWriter loads DeepSpeed's ``utils`` op (C++, JIT-built
  with ninja) only for ``cast_to_byte_tensor``, which views a tensor's memory
  as uint8 (``at::from_blob(data_ptr, nbytes, uint8)``; tensors of at most one
  byte are returned as they are). The test substitutes the same view written
  in torch, so the suite does not depend on a JIT build of an op that is not
  under test. Every byte written still goes through the aio handle.
"""

import os
import types

import pytest
import torch

TENSORS = {
    "f32_3x5x7": (torch.float32, (3, 5, 7)),
    "f16_1001": (torch.float16, (1001,)),
    "bf16_333": (torch.bfloat16, (333,)),
    "f64_7x3": (torch.float64, (7, 3)),
    "i64_17": (torch.int64, (17,)),
    "i32_4099": (torch.int32, (4099,)),
    "u8_4097": (torch.uint8, (4097,)),
    "bool_13": (torch.bool, (13,)),
    "i8_1": (torch.int8, (1,)),
    "empty_f32": (torch.float32, (0,)),
}


def make_state_dict(seed):
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, (dtype, shape) in TENSORS.items():
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        else:
            t = torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=g).to(dtype)
        sd[name] = t
    # a view that shares storage with another entry, and a non-tensor value
    sd["f32_view_row"] = sd["f32_3x5x7"][1]
    sd["meta"] = {"step": 7, "name": "fastpersist"}
    return sd


def cast_to_byte_tensor(x):
    """Torch equivalent of DeepSpeed's utils op (csrc/utils/tensor_cast.cpp)."""
    if isinstance(x, (list, tuple)):
        return [cast_to_byte_tensor(t) for t in x]
    if x.nbytes <= 1:
        return x
    return x.reshape(-1).view(torch.uint8)


@pytest.fixture
def fast_file_writer(monkeypatch):
    import deepspeed.io.fast_file_writer as ffw

    class CpuUtilsBuilder:

        def load(self, verbose=False):
            return types.SimpleNamespace(cast_to_byte_tensor=cast_to_byte_tensor)

    monkeypatch.setattr(ffw, "UtilsBuilder", CpuUtilsBuilder)
    return ffw


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("double_buffer", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("buffer_bytes", [16 << 10, 1 << 20], ids=["16K", "1M"])
def test_torch_save_through_fast_file_writer_loads_equal(fast_file_writer, new_handle, locked, data_dir,
                                                         double_buffer, parallelism, buffer_bytes):
    from deepspeed.io import FastFileWriterConfig

    h = new_handle(block_size=8192, queue_depth=8, single_submit=False, overlap_events=True,
                   intra_op_parallelism=parallelism)
    pinned = locked(buffer_bytes, via=h)
    assert h.is_pinned(pinned)
    sd = make_state_dict(seed=buffer_bytes + parallelism)
    path = str(data_dir / "ckpt.pt")
    cfg = FastFileWriterConfig(dnvme_handle=h, pinned_tensor=pinned, double_buffer=double_buffer)
    writer = fast_file_writer.FastFileWriter(file_path=path, config=cfg)
    torch.save(sd, writer)
    writer.close()
    stats = dict(writer._stats)
    del writer

    # The payload went through the handle: the 16K buffer drains many times.
    from deepspeed.io.constants import AIO_WRITE_BYTES_KEY, WRITE_BYTES_KEY
    assert stats[AIO_WRITE_BYTES_KEY] > 0
    assert os.path.getsize(path) == stats[WRITE_BYTES_KEY]

    back = torch.load(path, weights_only=True)
    assert back.keys() == sd.keys()
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
            assert torch.equal(back[k].view(-1).view(torch.uint8) if v.nbytes else back[k],
                               v.reshape(-1).view(torch.uint8) if v.nbytes else v), k
        else:
            assert back[k] == v
    # storage sharing survives the round trip, as with a plain torch.save
    assert back["f32_view_row"].untyped_storage().data_ptr() == back["f32_3x5x7"].untyped_storage().data_ptr()
