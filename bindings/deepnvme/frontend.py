"""The pyo3 front end: DeepSpeed's DeepNVMe Python API from deepnvme's Rust
core, with no compiled torch extension.

What DeepSpeed's ``AsyncIOBuilder().load()``, ``PinMemoryBuilder().load()``
and ``GDSBuilder().load()`` return when this front end is chosen (see
``deepnvme.choose_frontend``). Same names, argument names, defaults, return
codes and exceptions as DeepSpeed's ``py_ds_aio.cpp``, ``py_ds_gds.cpp`` and
``py_ds_pin_memory.cpp``:

* ``aio_handle``, ``aio_read``, ``aio_write``, ``deepspeed_memcpy`` (async_io)
* ``pin_handle`` (pin_memory)
* ``gds_handle`` (gds; creating one raises where GPUDirect Storage is missing)

Buffers may be torch tensors (any torch version: only their Python
interface is used), numpy arrays, or any writable buffer-protocol object
(bytearray, memoryview, mmap). A read into a read-only buffer is a
TypeError. ``new_cpu_locked_tensor`` returns a torch tensor (a numpy array
for a numpy example, or without torch) that owns its page-locked memory:
it is freed when the last reference goes, or by ``free_cpu_locked_tensor``.

It imports without torch: ``_native`` links nothing of it.
"""

from deepnvme._native import (  # noqa: F401
    aio_handle,
    aio_read,
    aio_write,
    deepspeed_memcpy,
    gds_handle,
    pin_handle,
)

__all__ = ["aio_handle", "aio_read", "aio_write", "deepspeed_memcpy", "gds_handle", "pin_handle"]

#: Which front end this module is (the compiled modules say "compiled").
FRONTEND = "pyo3"
