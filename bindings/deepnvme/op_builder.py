"""DeepSpeed op builders for deepnvme's ops: ``AsyncIOBuilder``,
``PinMemoryBuilder`` and ``GDSBuilder``, subclasses of DeepSpeed's own
``OpBuilder`` with DeepSpeed's op names (``async_io``, ``pin_memory``,
``gds``), build variables and module names.

    from deepnvme.op_builder import AsyncIOBuilder
    aio = AsyncIOBuilder().load()        # JIT-built by DeepSpeed's jit_load, cached by torch
    ext = AsyncIOBuilder().builder()     # the CppExtension DeepSpeed's setup.py builds

What they build: DeepSpeed's binding file, unchanged (read from the
installed deepspeed, hash-checked), plus deepnvme's torch shims (cpp/src,
installed as deepnvme/csrc), compiled against the running torch and linked
against the Rust core shared object the package ships (``deepnvme._native``,
absolute rpath). Nothing of the core is compiled into the op, so a process
has one core -- one pinned-memory manager -- however each op was built: by
these builders (JIT or ahead of time), by bindings/setup.py, or the pyo3
front end. Where the package has no core yet (a source checkout), the
builder builds one with cargo and makes it the one ``deepnvme._native``
resolves to. The abi3 wheel's core carries no C++ bridge; there the builders
are incompatible and say why (a second core would split the manager).

DeepSpeed can use them with a few lines in its op_builder files
(``builder_class``; see docs/deepspeed-compatibility.md, "OpBuilder").
Importing this module imports neither torch nor DeepSpeed; the classes are
made on first use, on DeepSpeed's OpBuilder.
"""

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from deepnvme import _binding_sources, _core_build

__all__ = ["AsyncIOBuilder", "PinMemoryBuilder", "GDSBuilder", "builder_class", "core_location"]

# op -> (class name, DeepSpeed's BUILD_VAR, DeepSpeed's module name, the shims it compiles)
_AIO_SHIMS = ("io_handle.cc", "module_functions.cc", "tensor_glue.cc", "pin_tensor.cc", "tensor_info.cc")
OPS = {
    "async_io": ("AsyncIOBuilder", "DS_BUILD_AIO", "deepspeed.ops.aio.async_io_op", _AIO_SHIMS),
    "pin_memory": ("PinMemoryBuilder", "DS_BUILD_PIN_MEMORY", "deepspeed.ops.pin_memory.pin_memory_op",
                   ("pin_tensor.cc", "tensor_info.cc")),
    "gds": ("GDSBuilder", "DS_BUILD_GDS", "deepspeed.ops.gds.gds_op", _AIO_SHIMS + ("gds_handle.cc",)),
}
_CLASS_OP = {cls: op for op, (cls, _, _, _) in OPS.items()}
# The op's shims compile as one translation unit that includes them all:
# parsing torch's headers is most of a shim's compile time, and this pays it
# once per op instead of once per shim (a cold build in about half the CPU).
_UNITY = "deepnvme_shims.cc"
CXX_FLAGS = ["-std=c++20", "-O2", "-g0", "-Wno-deprecated-declarations"]
# DeepSpeed's pin_memory_load.py keeps the loaded pin_memory module here, process-wide.
_PIN_MEMORY_CACHE = "_deepspeed_pin_memory_op_module"
_PACKAGE = Path(__file__).resolve().parent


class CoreUnavailable(RuntimeError):
    """No core these builders can link (the reason is the message)."""


class _Core:
    """The core an op links: the folder holding _native, and the headers and
    shims that match it."""

    def __init__(self, lib_dir, include, cxxbridge, csrc, origin):
        self.lib_dir, self.include, self.cxxbridge, self.csrc, self.origin = lib_dir, include, cxxbridge, csrc, origin


def _checkout_root():
    """The source checkout this package lives in, when it does."""
    root = _PACKAGE.parent.parent
    if (root / "Cargo.toml").is_file() and (root / "cpp" / "src").is_dir() and (root / "cpp" / "include").is_dir():
        return root
    return None


def _installed_native():
    """The _native file Python would import as deepnvme._native, or None."""
    try:
        spec = importlib.util.find_spec("deepnvme._native")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _prebuilt_core():
    """The package's own core when it carries the bridge and its headers
    match (an install by bindings/setup.py), else None."""
    info_path = _PACKAGE / _core_build.CORE_INFO
    if not info_path.is_file():
        return None
    info = json.loads(info_path.read_text())
    cxxbridge = _PACKAGE / "include" / "cxxbridge"
    if not (_PACKAGE / info["native"]).is_file():
        raise CoreUnavailable(f"{info_path} names {info['native']}, which is not in {_PACKAGE}")
    actual = _core_build.bridge_sha256(cxxbridge)
    if actual != info["bridge_sha256"]:
        raise CoreUnavailable(f"the bridge headers in {cxxbridge} (sha256 {actual[:12]}) are not the ones "
                              f"_native was built with ({info['bridge_sha256'][:12]}); reinstall deepnvme")
    return _Core(_PACKAGE, _PACKAGE / "include", cxxbridge, _PACKAGE / "csrc", "prebuilt")


def _core_or_reason():
    """(how the core will be had: 'prebuilt' or 'cargo', None) or (None, why not)."""
    if _core is not None:
        return _core.origin, None
    try:
        if _prebuilt_core() is not None:
            return "prebuilt", None
    except CoreUnavailable as error:
        return None, str(error)
    native = _installed_native()
    if native is not None and ".abi3." not in os.path.basename(native):
        return None, (f"this install's core ({native}) has no {_core_build.CORE_INFO} (an install older than "
                      "deepnvme.op_builder); reinstall deepnvme (bindings/install.sh)")
    if native is not None:
        return None, (f"this install's core ({native}) is the abi3 wheel's, without the C++ bridge the compiled "
                      "ops link against, and linking another core would give the process two pinned-memory "
                      "managers; install deepnvme with its compiled ops (bindings/install.sh, or pip install "
                      "--no-build-isolation ./bindings)")
    if _checkout_root() is None:
        return None, f"{_PACKAGE} has no core (_native) and is not in a deepnvme source checkout to build one from"
    if shutil.which("cargo") is None:
        return None, "this source checkout has no built core and cargo is not on PATH to build one"
    return "cargo", None


_core = None


def core_location():
    """The core the builders link, made ready (in a source checkout: built
    with cargo, and made the deepnvme._native of this process). Raises
    CoreUnavailable naming why there is none."""
    global _core
    if _core is not None:
        return _core
    how, why = _core_or_reason()
    if how is None:
        raise CoreUnavailable(why)
    if how == "prebuilt":
        _core = _prebuilt_core()
        return _core
    root = _checkout_root()
    staticlib, cxx_include = _core_build.cargo_build(root, log=_log_stderr)
    digest = hashlib.sha256(Path(staticlib).read_bytes()).hexdigest()[:16]
    lib_dir = Path(_build_root()) / "deepnvme-core" / digest
    if not (lib_dir / _core_build.NATIVE_FILE).is_file():
        _core_build.link_native(staticlib, lib_dir, lib_dir / "link", log=_log_stderr)
    # The core the op links must be the one `import deepnvme._native` gives:
    # the package has none, so this one becomes it, loaded now.
    import deepnvme

    if str(lib_dir) not in deepnvme.__path__:
        deepnvme.__path__.append(str(lib_dir))
    native = importlib.import_module("deepnvme._native")
    if Path(native.__file__).resolve() != (lib_dir / _core_build.NATIVE_FILE).resolve():
        raise CoreUnavailable(f"deepnvme._native is {native.__file__}, not the core built for the ops ({lib_dir})")
    _core = _Core(lib_dir, root / "cpp" / "include", Path(cxx_include), root / "cpp" / "src", "cargo")
    return _core


def _log_stderr(msg):
    print(msg, file=sys.stderr, flush=True)


def _build_root():
    """torch's extensions folder: TORCH_EXTENSIONS_DIR, else torch's default
    (which get_default_build_root gives without the variable)."""
    from torch.utils.cpp_extension import get_default_build_root

    return os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()


def _version_script(op):
    """What the op exports: its PyInit; pin_memory also the pinned front
    (deepspeed_pin_tensor_t's members and DeepSpeed's holder symbol), which
    DeepSpeed's own async_io/gds resolve globally after pin_memory_load.py's
    RTLD_GLOBAL load. Everything else stays local, so no op can interpose
    on another's classes."""
    pinned = ('    deepspeed_pin_tensor_mgr_holder;\n    extern "C++" {\n      deepspeed_pin_tensor_t::*;\n    };\n'
              if op == "pin_memory" else "")
    return "{\n  global:\n    PyInit_*;\n" + pinned + "  local: *;\n};\n"


_announced = set()


def _stage(op, core):
    """Copies what op's build reads into a folder named by its contents
    under torch's extensions folder, and returns it. Stable paths and
    modification times keep torch's and ninja's caches valid across
    reinstalls; new contents get a new folder. The binding file sits alone
    in its folder: a quoted include searches the file's own folder first,
    and must find deepnvme's headers, not DeepSpeed's."""
    # The hash check is said once per op and process, as setup.py's build log does.
    log = _log_stderr if op not in _announced else (lambda msg: None)
    _announced.add(op)
    name, binding = _binding_sources.checked_binding(op, log=log)
    files = {f"binding/{op}/{name}": binding, f"link/{op}.map": _version_script(op).encode()}
    for shim in OPS[op][3] + ("glue.h",):
        files[f"csrc/{shim}"] = (core.csrc / shim).read_bytes()
    files[f"csrc/{_UNITY}"] = "".join(f'#include "{shim}"\n' for shim in OPS[op][3]).encode()
    for header in sorted(core.include.glob("*.h")):
        files[f"include/{header.name}"] = header.read_bytes()
    for rel in (_core_build.BRIDGE_HEADER, Path("rust") / "cxx.h"):
        files[f"cxxbridge/{rel.as_posix()}"] = (core.cxxbridge / rel).read_bytes()
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + hashlib.sha256(files[rel]).digest())
    dest = Path(_build_root()) / "deepnvme-src" / f"{op}-{digest.hexdigest()[:16]}"
    if not dest.is_dir():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for rel, data in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process staged the same contents first
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build_needs(op):
    """None when op can be built here, else why not. No libaio: the I/O is
    the Rust core's."""
    try:
        import torch.utils.cpp_extension  # noqa: F401
    except ImportError as error:
        return f"torch is not importable ({error})"
    try:
        _binding_sources.checked_binding(op, log=lambda msg: None)
    except RuntimeError as error:
        return str(error)
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) on PATH"
    how, why = _core_or_reason()
    return why if how is None else None


def _gds_runtime_reason():
    """Like DeepSpeed's GDSBuilder, gds is compatible only where GPUDirect
    Storage works (or DEEPNVME_GDS_CPU_ONLY=1 asks for a CPU-only gds_handle)."""
    if os.environ.get("DEEPNVME_GDS_CPU_ONLY") == "1":
        return None
    core_location()
    return importlib.import_module("deepnvme._native").gds_unavailable_reason()


_classes = {}


def builder_class(op, base):
    """deepnvme's builder for op ('async_io', 'pin_memory' or 'gds'), as a
    subclass of `base` (DeepSpeed's OpBuilder, from whichever module
    DeepSpeed's builders use: op_builder.builder while DeepSpeed's setup.py
    runs, deepspeed.ops.op_builder.builder at run time). One class per op
    and base."""
    key = (op, base)
    if key in _classes:
        return _classes[key]
    class_name, build_var, absolute, _ = OPS[op]

    def __init__(self):
        base.__init__(self, name=self.NAME)

    def absolute_name(self):
        return absolute

    def sources(self):
        staged = _stage(op, core_location())
        return [str(p) for p in sorted((staged / "binding" / op).iterdir())] + [str(staged / "csrc" / _UNITY)]

    def include_paths(self):
        staged = _stage(op, core_location())
        return [str(staged / "include"), str(staged / "cxxbridge")]

    def cxx_args(self):
        return list(CXX_FLAGS)

    def extra_ldflags(self):
        core = core_location()
        staged = _stage(op, core)
        return [
            f"-L{core.lib_dir}", f"-l:{_core_build.NATIVE_FILE}", f"-Wl,-rpath,{core.lib_dir}",
            # The op's own calls (a shim's into another) bind to itself.
            "-Wl,-Bsymbolic-functions", f"-Wl,--version-script={staged / 'link' / f'{op}.map'}",
        ]

    def is_compatible(self, verbose=False):
        why = _build_needs(op)
        if why is None and op == "gds":
            why = _gds_runtime_reason()
        if why is not None and verbose:
            self.warning(f"{op} (deepnvme.op_builder): {why}")
        return why is None and base.is_compatible(self, verbose)

    def load(self, verbose=False):
        if op == "pin_memory":
            # DeepSpeed's route (pin_memory_load.py): one module per process,
            # dlopened RTLD_GLOBAL so DeepSpeed's own async_io/gds, where they
            # share the process, find the pinned front.
            module = getattr(sys, _PIN_MEMORY_CACHE, None)
            if module is None:
                module = _load_once(self, base, verbose)
                setattr(sys, _PIN_MEMORY_CACHE, module)
            path = getattr(module, "__file__", "") or ""
            if path.endswith(".so"):
                import ctypes

                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return module
        return _load_once(self, base, verbose)

    cls = type(base)(class_name, (base,), {
        "BUILD_VAR": build_var, "NAME": op, "__module__": __name__, "__qualname__": class_name,
        "__doc__": f"DeepSpeed's {op} op on deepnvme's Rust core (no libaio): DeepSpeed's binding file, "
                   "deepnvme's torch shims, linked against the core the package ships.",
        "__init__": __init__, "absolute_name": absolute_name, "sources": sources, "include_paths": include_paths,
        "cxx_args": cxx_args, "extra_ldflags": extra_ldflags, "is_compatible": is_compatible, "load": load,
    })
    _classes[key] = cls
    return cls


def _load_once(builder, base, verbose):
    """The op from DeepSpeed's process-wide cache, else the ahead-of-time
    module where one is installed under DeepSpeed's module name, else a
    build by DeepSpeed's own jit_load (cached in torch's extensions folder)."""
    loaded_ops = base._loaded_ops  # DeepSpeed's, keyed by op name
    if builder.name in loaded_ops:
        return loaded_ops[builder.name]
    core_location()  # the core is this process's deepnvme._native before the op maps it
    module = None
    try:
        aot = importlib.util.find_spec(builder.absolute_name())
    except ImportError:
        aot = None
    if aot is not None:
        try:
            module = importlib.import_module(builder.absolute_name())
        except ImportError as error:  # e.g. built for another torch: rebuild for this one
            print(f"deepnvme: {builder.absolute_name()} does not load ({error}); JIT-building {builder.name}",
                  file=sys.stderr, flush=True)
    if module is None:
        module = base.jit_load(builder, verbose)  # DeepSpeed's own
    loaded_ops[builder.name] = module
    return module


def _deepspeed_op_builder():
    """DeepSpeed's OpBuilder as DeepSpeed's own builders import it."""
    try:
        # A DeepSpeed source tree's setup.py puts its op_builder at the top level.
        from op_builder import __deepspeed__  # noqa: F401
        from op_builder.builder import OpBuilder
    except ImportError:
        from deepspeed.ops.op_builder.builder import OpBuilder
    return OpBuilder


def __getattr__(name):
    op = _CLASS_OP.get(name)
    if op is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = builder_class(op, _deepspeed_op_builder())
    globals()[name] = cls
    return cls
