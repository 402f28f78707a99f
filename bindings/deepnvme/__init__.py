"""deepnvme: DeepSpeed's DeepNVMe ops backed by a Rust core.

    from deepspeed.ops.op_builder import AsyncIOBuilder
    h = AsyncIOBuilder().load().aio_handle()      # Rust-backed, no libaio

Without DeepSpeed, the same API is at the top level, with or without torch:

    import numpy as np, deepnvme
    h = deepnvme.aio_handle(1 << 20, 32, False, True, 1)
    h.sync_pwrite(np.arange(1 << 20, dtype=np.float32), "/nvme/a.bin")

``deepnvme.aio_handle``, ``pin_handle``, ``gds_handle``, ``aio_read``,
``aio_write`` and ``deepspeed_memcpy`` are ``deepnvme.frontend``'s (the
pyo3 front end, which needs no torch), loaded on first use.

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

``deepnvme.copy2`` and ``deepnvme.copytree`` are shutil's, except that a
stripe set's file is copied by its bytes (a byte copy of one holds none of
them); with DeepSpeed imported, ``shutil.copytree`` is deepnvme's, so the
engine's checkpoint copies of NVMe swap files hold their bytes.

``deepnvme.frontend`` is the pyo3 front end: the same API from ``_native``
alone (no compiled torch extension; any torch, numpy arrays, buffers). The
only front end of a wheel-only install, and DeepSpeed's choice when the
compiled modules do not match the running torch (see ``choose_frontend``).

This module imports nothing heavy at import time: a .pth file imports it at
interpreter start to hook DeepSpeed's op builders (see _deepspeed_hook).
"""

import atexit
import importlib
import importlib.util
import os
import sys

# DeepSpeed's op API, served at the top level by the pyo3 front end.
FRONTEND_API = ("aio_handle", "pin_handle", "gds_handle", "aio_read", "aio_write", "deepspeed_memcpy")
# Copies of stripe set files by their bytes (_copy.py), imported on first use.
COPY_API = ("copy2", "copytree")

__all__ = [
    "DeepNVMeWarning", "OPS", "FRONTEND_ENV", "choose_frontend", "load_op", "op_unavailable_reason", "native", "stats",
    "provided_ops", "include_dir", "library_dir", "libraries", *COPY_API, *FRONTEND_API,
]

OPS = ("async_io", "pin_memory", "gds")


def _flush_core_log():
    """At exit, logs the core's informational lines not yet handed to the
    ``deepnvme`` logger (its thread delivers them a moment after they are
    made; see _log.py). Registered when the package is imported, so it runs
    after the application's own exit callbacks. Only where the core was
    loaded (the pyo3 module, or the compiled ops, which link the same one)."""
    loaded = ("deepnvme._native", "deepnvme.async_io", "deepnvme.pin_memory", "deepnvme.gds")
    if not any(name in sys.modules for name in loaded):
        return
    try:
        importlib.import_module("deepnvme._native")._flush_log()
    except Exception:  # pragma: no cover - exiting: nothing left to report to
        pass


atexit.register(_flush_core_log)


class DeepNVMeWarning(UserWarning):
    """What deepnvme warns about through Python's ``warnings`` (the one-time
    note that heavy NVMe offload wears out consumer SSDs), from either front
    end. Silence it with
    ``warnings.filterwarnings("ignore", category=deepnvme.DeepNVMeWarning)``.
    Informational lines go to ``logging.getLogger("deepnvme")`` instead."""


def __getattr__(name):
    """deepnvme.aio_handle and the rest of FRONTEND_API: deepnvme.frontend's,
    imported on first use, so that `import deepnvme` (which the .pth hook
    does at every interpreter start) stays free of the core."""
    if name in FRONTEND_API:
        value = getattr(importlib.import_module("deepnvme.frontend"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in COPY_API:
        value = getattr(importlib.import_module("deepnvme._copy"), name)
        globals()[name] = value
        return value
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    raise AttributeError(f"module 'deepnvme' has no attribute {name!r}")


def _version():
    """The version Cargo.toml gives (the one source): from the installed
    distribution's metadata (setup.py and maturin both take it from there),
    else from the checkout this package lives in."""
    import importlib.metadata

    try:
        return importlib.metadata.version("deepnvme")
    except importlib.metadata.PackageNotFoundError:
        pass
    cargo = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "Cargo.toml")
    try:
        from deepnvme._core_build import cargo_package_version

        return cargo_package_version(cargo)
    except (OSError, ValueError):
        return "0+unknown"


def __dir__():
    return sorted(set(globals()) | set(FRONTEND_API) | set(COPY_API))


def native():
    """The Rust core's Python module (engine, pinned stats, GDS status).

    Needs no torch: _native links nothing of it."""
    return importlib.import_module("deepnvme._native")


def stats():
    """What deepnvme did in this process, over every handle and front end:
    a dict with ops, failed_ops, bytes_read, bytes_written, bounced_bytes
    (bytes that went through a bounce buffer because the memory was not
    page-locked), io_time_s (sum of op latencies), wait_time_s (time
    callers were blocked in calls waiting for I/O), p50_us and p99_us
    (per-op latency). Set DEEPNVME_STATS=1 to print it on stderr at exit."""
    return native().stats()


def load_op(name):
    """The DeepNVMe op module `name` ('async_io', 'pin_memory' or 'gds') of
    the front end `choose_frontend()` picks: the compiled module
    deepnvme.<name>, or deepnvme.frontend (which has all three ops' API)."""
    if name not in OPS:
        raise ValueError(f"deepnvme has no op {name!r}; it provides {', '.join(OPS)}")
    frontend, _ = choose_frontend()
    if frontend == "pyo3":
        return importlib.import_module("deepnvme.frontend")
    return _load_compiled(name)


def _load_compiled(name):
    import torch  # noqa: F401  (the ops' torch glue links libtorch; torch loads it first)
    return importlib.import_module(f"deepnvme.{name}")


def load_pin_memory_for_stock_ops():
    """The compiled pin_memory module, whatever the front end: DeepSpeed's
    own JIT-built async_io and gds (DEEPNVME_OPS leaving them to DeepSpeed)
    link deepspeed_pin_tensor_t's C++ symbols from it, and the pyo3 front
    end has none to give."""
    try:
        return _load_compiled("pin_memory")
    except Exception as error:
        stock = ", ".join(op for op in OPS if op not in provided_ops())
        raise RuntimeError(
            f"deepnvme: {OPS_ENV} leaves {stock} to DeepSpeed's C++, which needs deepnvme's compiled pin_memory "
            f"module, and it failed to load ({error}); install the compiled modules (bindings/install.sh) "
            f"or unset {OPS_ENV}") from error


def op_unavailable_reason(name):
    """None when op `name` can be used here, else a sentence saying why not.
    It imports what load_op(name) would return."""
    if name not in OPS:
        return f"deepnvme has no op {name!r}"
    try:
        load_op(name)
    except Exception as error:
        return f"deepnvme.{name} failed to load: {error}"
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


# ---------------------------------------------------------------------------
# Which front end DeepSpeed gets.
# ---------------------------------------------------------------------------

FRONTEND_ENV = "DEEPNVME_FRONTEND"
FRONTENDS = ("compiled", "pyo3")
_BUILD_INFO = "_build_info.json"
_choice = None


def build_info():
    """What the compiled modules were built against (torch version and
    pybind11 ABI), written by bindings/setup.py; None without them."""
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _BUILD_INFO)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def torch_abi():
    """The running torch's version, C++ ABI and pybind11 ABI tag, as
    build_info() records them; None without torch. The pybind11 tag (the
    internals version and pybind11's version) is read from the headers torch
    ships, which are what the compiled modules were compiled against; torch
    does not report it at run time."""
    try:
        import torch
    except ImportError:
        return None
    return {
        "torch": torch.__version__,
        "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)),
        "pybind11": _pybind11_tag(torch),
    }


def _pybind11_tag(torch):
    """'internals v<N>, pybind11 <x.y.z>' from torch's bundled pybind11
    headers, or None where torch ships none."""
    import os
    import re

    include = os.path.join(os.path.dirname(torch.__file__), "include", "pybind11")

    def define(path, name):
        try:
            with open(os.path.join(include, path)) as f:
                m = re.search(rf"#\s*define\s+{name}\s+(\d+)", f.read())
        except OSError:
            return None
        return m.group(1) if m else None

    internals = define(os.path.join("detail", "internals.h"), "PYBIND11_INTERNALS_VERSION")
    version = [define(os.path.join("detail", "common.h"), f"PYBIND11_VERSION_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    if internals is None or None in version:
        return None
    return f"internals v{internals}, pybind11 {'.'.join(version)}"


def _compiled_mismatch():
    """None when the compiled modules can be loaded here, else why not."""
    if any(importlib.util.find_spec(f"deepnvme.{op}") is None for op in OPS):
        return "the compiled modules are not installed (a wheel-only install)"
    built = build_info()
    if built is None:
        return f"the compiled modules' build record ({_BUILD_INFO}) is missing"
    running = torch_abi()
    if running is None:
        return "torch is not importable, and the compiled modules need it"
    for key, value in built.items():
        if key in running and running[key] != value:
            what = "torch" if key == "torch" else f"torch's {key.replace('_', ' ')}"
            return f"they were built for {what} {value} and this is {running[key]}"
    return None


def choose_frontend():
    """(front end, reason): 'compiled' (DeepSpeed's bindings compiled against
    the core) or 'pyo3' (deepnvme.frontend). DEEPNVME_FRONTEND forces one;
    by default the compiled modules while they match the running torch,
    else the pyo3 front end, said in one line on stderr. Decided once."""
    global _choice
    if _choice is not None:
        return _choice
    import os
    import sys

    forced = os.environ.get(FRONTEND_ENV, "").strip().lower()
    if forced and forced not in FRONTENDS:
        print(f"deepnvme: ignoring {FRONTEND_ENV}={forced!r} (expected one of {', '.join(FRONTENDS)})",
              file=sys.stderr, flush=True)
        forced = ""
    if forced:
        _choice = (forced, f"{FRONTEND_ENV}={forced}")
        return _choice
    why = _compiled_mismatch()
    if why is None:
        try:
            # Only the ops deepnvme provides here: in a mix, importing
            # deepnvme.async_io (or gds) would register pybind11 classes
            # with the names DeepSpeed's own JIT-built module registers next
            # ("generic_type: type aio_handle is already registered").
            for op in provided_ops():
                _load_compiled(op)
        except Exception as error:  # e.g. an undefined symbol from another torch
            why = f"importing them failed: {error}"
    if why is None:
        _choice = ("compiled", "the compiled modules match the running torch")
    else:
        _choice = ("pyo3", why)
        print(f"deepnvme: DeepSpeed gets the pyo3 front end (deepnvme.frontend), not the compiled modules: {why}",
              file=sys.stderr, flush=True)
    return _choice
