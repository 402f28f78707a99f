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

Which ops deepnvme takes over is ``DEEPNVME_OPS`` (``all`` by default; e.g.
``pin_memory`` leaves async_io and gds to DeepSpeed's own JIT-built C++,
which then runs on deepnvme's pinned manager): see ``provided_ops()``.
Third-party C++ can share the manager through ``include_dir()`` and
``library_dir()`` (link ``libraries()``).

This module imports nothing heavy at import time: a .pth file imports it at
interpreter start to hook DeepSpeed's op builders (see _deepspeed_hook).
"""

import importlib
import importlib.util
import os

__all__ = [
    "OPS", "load_op", "op_unavailable_reason", "native", "stats",
    "provided_ops", "include_dir", "library_dir", "libraries",
]
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


OPS_ENV = "DEEPNVME_OPS"


def provided_ops(value=None):
    """The ops deepnvme takes over from DeepSpeed's builders, as a tuple in
    OPS order, from ``DEEPNVME_OPS`` (or `value`): ``all`` (the default), or
    a comma-separated list of op names (``none`` for no op). The others keep
    DeepSpeed's own behaviour (its JIT-built C++).

    pin_memory is implied by any other op: deepnvme's async_io and gds use
    the Rust pinned manager, and DeepSpeed's own pin_memory defines the same
    class (deepspeed_pin_tensor_t) with another layout, so the two cannot
    share a process. Unknown names raise ValueError."""
    if value is None:
        value = os.environ.get(OPS_ENV, "all")
    names = {n.strip().lower() for n in value.split(",") if n.strip()}
    if not names or names == {"all"}:
        return OPS
    if names == {"none"}:
        return ()
    unknown = sorted(names - set(OPS))
    if unknown:
        raise ValueError(
            f"{OPS_ENV}={value!r}: unknown op(s) {', '.join(unknown)}; "
            f"use 'all', 'none' or a comma-separated list of {', '.join(OPS)}")
    if names & {"async_io", "gds"}:
        names.add("pin_memory")
    return tuple(op for op in OPS if op in names)


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def include_dir():
    """deepnvme's C++ headers (DeepSpeed's header names, e.g.
    ``deepspeed_pin_tensor.h``), installed with the package."""
    return os.path.join(_package_dir(), "include")


def library_dir():
    """The folder holding deepnvme's shared objects (libdeepnvme_pin.so,
    libdeepnvme_torch.so, _native): pass it as a library dir and an rpath."""
    return _package_dir()


def libraries():
    """What a third-party torch extension links to use
    ``deepspeed_pin_tensor_t::shared()``: the pinned manager's torch front
    (which brings the core, _native, with it)."""
    return ["deepnvme_pin"]
