"""deepnvme: DeepSpeed's DeepNVMe ops backed by a Rust core.

    from deepspeed.ops.op_builder import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle()      # Rust-backed, no libaio

The modules are DeepSpeed's own pybind bindings (``py_ds_aio.cpp``,
``py_ds_pin_memory.cpp``, ``py_ds_gds.cpp``), compiled unchanged against
deepnvme's headers:

* ``deepnvme.async_io``   -- ``aio_handle``, ``aio_read``, ``aio_write``, ``deepspeed_memcpy``
* ``deepnvme.pin_memory`` -- ``pin_handle``
* ``deepnvme.gds``        -- ``gds_handle``

``deepnvme._native`` is the Rust core itself (pyo3): one shared object that
every op reaches (through the torch glue, ``libdeepnvme_torch.so``), so there
is one pinned-memory manager per process. It links nothing of torch, so it
imports without torch.

This module imports nothing heavy at import time: a .pth file imports it at
interpreter start to hook DeepSpeed's op builders (see _deepspeed_hook).
"""

import importlib
import importlib.util

__all__ = ["OPS", "load_op", "op_unavailable_reason", "native", "stats"]
__version__ = "0.1.0"

OPS = ("async_io", "pin_memory", "gds")


def native():
    """The Rust core's Python module (engine, pinned stats, GDS status).

    Needs no torch: _native links nothing of it."""
    return importlib.import_module("deepnvme._native")


def stats():
    """What deepnvme did in this process, over every handle and front end:
    a dict with ops, failed_ops, bytes_read, bytes_written, bounced_bytes
    (bytes that went through a bounce buffer because the memory was not
    page-locked), io_time_s, p50_us and p99_us (per-op latency). Set
    DEEPNVME_STATS=1 to print it on stderr at exit."""
    return native().stats()


def load_op(name):
    """The DeepNVMe op module `name` ('async_io', 'pin_memory' or 'gds')."""
    if name not in OPS:
        raise ValueError(f"deepnvme has no op {name!r}; it provides {', '.join(OPS)}")
    import torch  # noqa: F401  (the ops' torch glue links libtorch; torch loads it first)
    return importlib.import_module(f"deepnvme.{name}")


def op_unavailable_reason(name):
    """None when op `name` can be used here, else a sentence saying why not."""
    if name not in OPS:
        return f"deepnvme has no op {name!r}"
    if importlib.util.find_spec(f"deepnvme.{name}") is None:
        return f"deepnvme.{name} was not built (reinstall deepnvme)"
    if name == "gds":
        try:
            return native().gds_unavailable_reason()
        except Exception as error:  # pragma: no cover - a broken install
            return f"deepnvme's core failed to load: {error}"
    return None
