"""The Rust core is a torch-free shared object; the torch glue is another.

    deepnvme/_native.cpython-*.so    Rust core + cxx bridge + pyo3 module: no torch
    deepnvme/libdeepnvme_pin.so      the pinned manager's torch front (deepspeed_pin_tensor_t,
                                     DeepSpeed's holder symbol): links libtorch and _native
    deepnvme/libdeepnvme_torch.so    the rest of the cpp/src torch glue: links libtorch, _native
                                     and libdeepnvme_pin.so
    deepnvme/pin_memory.cpython-*.so links libdeepnvme_pin.so alone (what DeepSpeed's
                                     RTLD_GLOBAL load makes global stays the pinned front)
    deepnvme/{async_io,gds}.cpython-*.so   link the glue and libdeepnvme_pin.so

These tests read the installed objects' dynamic sections (with `readelf -d`
where binutils is installed, and always with a small ELF reader, _elf.py) so
that they fail if the split regresses: a torch library in the core's NEEDED
list, a torch symbol the core would need, or ops that no longer resolve. They
also import the core in interpreters where torch cannot be imported at all,
and check that a core loaded before torch is the one the ops then use.
"""

import glob
import os
import re
import shutil
import subprocess
import sysconfig

import pytest
import torch

import deepnvme
from _elf import read_dynamic
from _util import run_python

PKG = os.path.dirname(os.path.abspath(deepnvme.__file__))
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
CORE = os.path.join(PKG, "_native" + EXT_SUFFIX)
GLUE = os.path.join(PKG, "libdeepnvme_torch.so")
PIN = os.path.join(PKG, "libdeepnvme_pin.so")
OPS = {op: os.path.join(PKG, op + EXT_SUFFIX) for op in deepnvme.OPS}
TORCH_LIB_DIR = os.path.join(os.path.dirname(torch.__file__), "lib")

# libtorch.so, libtorch_cpu.so, libtorch_python.so, libtorch_cuda.so, libc10.so, libc10_cuda.so, ...
TORCH_NEEDED = re.compile(r"^lib(torch|c10)")
# Mangled names of torch, ATen, c10, pybind11 and of the glue's own classes.
TORCH_SYMBOL = re.compile(r"N3c10|N2at|N5torch|N8pybind11|THP|12io_op_desc_t|13cpu_op_desc_t|deepspeed_")
# What the core may export: pyo3's entry point and the C++ side of the cxx
# bridge (deepnvme::ffi) with cxx's runtime (rust::cxxbridge1).
CORE_EXPORT = re.compile(r"^(PyInit__native|_Z(T[VIS])?NK?(4rust10cxxbridge1|8deepnvme3ffi).*)$")
# What the glue may export: what DeepSpeed's binding files call.
GLUE_EXPORT = re.compile(r"deepspeed_|12io_op_desc_t|13cpu_op_desc_t|warn_consumer_ssd_writes")
# What the pinned front may export: deepspeed_pin_tensor_t's members,
# DeepSpeed's holder symbol, and the tensor description the glue reuses.
PIN_EXPORT = re.compile(r"^(_ZNK?22deepspeed_pin_tensor_t.*|deepspeed_pin_tensor_mgr_holder|_ZN8deepnvme15describe_tensor.*)$")

# The compiled layout (core, glue, ops); the pyo3 front end's own torch-free
# checks are in test_frontend.py.
pytestmark = pytest.mark.compiled_only

READELF = shutil.which("readelf")


def readelf_needed(path):
    """NEEDED entries as `readelf -d` prints them (None without binutils)."""
    if READELF is None:
        return None
    out = subprocess.run([READELF, "-d", "-W", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def needed(path):
    """The NEEDED list: readelf's where installed (checked against _elf), else _elf's."""
    ours = read_dynamic(path).needed
    theirs = readelf_needed(path)
    if theirs is not None:
        assert theirs == ours, (path, theirs, ours)
    return ours


def test_objects_are_installed():
    for path in [CORE, PIN, GLUE, *OPS.values()]:
        assert os.path.isfile(path), f"{path} is missing; reinstall deepnvme (bindings/install.sh)"
    # The old single-object layout put the glue inside _native; nothing else
    # of deepnvme may hold a copy of the core.
    shared_objects = sorted(os.path.basename(p) for p in glob.glob(os.path.join(PKG, "*.so")))
    assert shared_objects == sorted(os.path.basename(p) for p in [CORE, PIN, GLUE, *OPS.values()]), shared_objects


def test_core_needs_no_torch_library(record_property):
    core_needed = needed(CORE)
    record_property("core_needed", " ".join(core_needed))
    print(f"{os.path.basename(CORE)} NEEDED: {core_needed}")
    assert not [n for n in core_needed if TORCH_NEEDED.match(n)], core_needed
    assert read_dynamic(CORE).soname == os.path.basename(CORE)


def test_core_references_no_torch_symbol():
    undefined = read_dynamic(CORE).undefined
    torchy = sorted(s for s in undefined if TORCH_SYMBOL.search(s))
    assert not torchy, torchy
    # It resolves everything it needs from libc, libstdc++, libgcc and the
    # interpreter: nothing left for the glue (or torch) to provide.
    deepnvme_like = sorted(s for s in undefined if "deepnvme" in s or "cxxbridge" in s)
    assert not deepnvme_like, deepnvme_like


def test_core_exports_only_pyinit_and_the_bridge():
    defined = read_dynamic(CORE).defined
    assert "PyInit__native" in defined
    extra = sorted(s for s in defined if not CORE_EXPORT.match(s))
    assert not extra, extra[:20]
    # The bridge functions the glue calls are exported...
    assert any(s.startswith("_ZN8deepnvme3ffi13new_io_handle") for s in defined), "deepnvme::ffi::new_io_handle"
    assert any(s.startswith("_ZN8deepnvme3ffi12pinned_alloc") for s in defined), "deepnvme::ffi::pinned_alloc"
    # ...and Rust's own symbols are not (legacy-mangled ones end in 17h<hash>E).
    assert not [s for s in defined if re.search(r"17h[0-9a-f]{16}E", s)]


def test_glue_links_torch_and_the_core(record_property):
    glue_needed = needed(GLUE)
    record_property("glue_needed", " ".join(glue_needed))
    print(f"{os.path.basename(GLUE)} NEEDED: {glue_needed}")
    torch_libs = [n for n in glue_needed if TORCH_NEEDED.match(n)]
    assert "libc10.so" in torch_libs and any(n.startswith("libtorch") for n in torch_libs), glue_needed
    assert os.path.basename(CORE) in glue_needed, glue_needed
    dyn = read_dynamic(GLUE)
    assert dyn.soname == "libdeepnvme_torch.so"
    assert "$ORIGIN" in dyn.runpath, dyn.runpath
    # The glue calls the bridge in the core and holds no copy of it.
    assert any(s.startswith("_ZN8deepnvme3ffi") for s in dyn.undefined)
    assert not [s for s in dyn.defined if "8deepnvme3ffi" in s or "4rust10cxxbridge1" in s]
    assert "PyInit__native" not in dyn.defined


def test_glue_exports_only_what_the_bindings_call():
    defined = read_dynamic(GLUE).defined
    extra = sorted(s for s in defined if not GLUE_EXPORT.search(s))
    assert not extra, extra[:20]
    for needed_symbol in ("_Z24warn_consumer_ssd_writesv", "_ZTI12io_op_desc_t"):
        assert needed_symbol in defined, needed_symbol
    # The pinned front is the other library's: the glue only uses it.
    assert not [s for s in defined if "deepspeed_pin_tensor" in s]
    assert "libdeepnvme_pin.so" in needed(GLUE)


def test_pin_front_links_torch_and_the_core_and_exports_only_the_manager():
    pin_needed = needed(PIN)
    assert "libc10.so" in pin_needed and os.path.basename(CORE) in pin_needed, pin_needed
    assert "libdeepnvme_torch.so" not in pin_needed, pin_needed
    dyn = read_dynamic(PIN)
    assert dyn.soname == "libdeepnvme_pin.so"
    assert "$ORIGIN" in dyn.runpath, dyn.runpath
    extra = sorted(s for s in dyn.defined if not PIN_EXPORT.match(s))
    assert not extra, extra[:20]
    for symbol in (
        "deepspeed_pin_tensor_mgr_holder",
        "_ZN22deepspeed_pin_tensor_t6sharedEv",
        "_ZN22deepspeed_pin_tensor_t5allocElRKN3c1010ScalarTypeE",
        "_ZN22deepspeed_pin_tensor_t5allocElRKN3c1013TensorOptionsE",
        "_ZN22deepspeed_pin_tensor_t4freeERN2at6TensorE",
        "_ZN22deepspeed_pin_tensor_t4freeEPv",
        "_ZN22deepspeed_pin_tensor_t10is_managedERKN2at6TensorE",
    ):
        assert symbol in dyn.defined, symbol


@pytest.mark.parametrize("op", deepnvme.OPS)
def test_ops_link_the_glue(op):
    op_needed = needed(OPS[op])
    # Every op reaches the pinned front: pin_memory directly, the others
    # through the glue (the linker's --as-needed drops a direct entry that
    # an op's own code does not use).
    reach = op_needed if op == "pin_memory" else needed(GLUE)
    assert "libdeepnvme_pin.so" in reach, (op_needed, reach)
    if op == "pin_memory":
        # DeepSpeed's pin_memory_load.py may dlopen this one RTLD_GLOBAL: its
        # dependencies become global too, so it must not pull in the glue.
        assert "libdeepnvme_torch.so" not in op_needed, op_needed
    else:
        assert "libdeepnvme_torch.so" in op_needed, op_needed
    assert "$ORIGIN" in read_dynamic(OPS[op]).runpath


def ldd(path, env=None):
    if shutil.which("ldd") is None:
        pytest.skip("ldd is not installed")
    proc = subprocess.run(["ldd", path], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def resolved(ldd_output):
    """{name: resolved path} from ldd's output."""
    out = {}
    for line in ldd_output.splitlines():
        m = re.match(r"\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_ldd_resolves_the_core_without_torch():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = ldd(CORE, env)
    assert "not found" not in out, out
    assert not [n for n in resolved(out) if TORCH_NEEDED.match(n)], out


@pytest.mark.parametrize("op", deepnvme.OPS)
def test_ldd_resolves_the_ops(op):
    # torch's libraries are found because torch is imported first at run time
    # (DeepSpeed's builders and deepnvme.load_op do); ldd needs the folder.
    env = dict(os.environ, LD_LIBRARY_PATH=TORCH_LIB_DIR)
    out = ldd(OPS[op], env)
    assert "not found" not in out, out
    libs = resolved(out)
    assert os.path.realpath(libs["libdeepnvme_pin.so"]) == os.path.realpath(PIN), out
    if op != "pin_memory":
        assert os.path.realpath(libs["libdeepnvme_torch.so"]) == os.path.realpath(GLUE), out
    assert os.path.realpath(libs[os.path.basename(CORE)]) == os.path.realpath(CORE), out


# Makes `import torch` fail in the child, then checks that nothing of torch
# got mapped while the core was imported and used.
NO_TORCH = r"""
import sys
assert "torch" not in sys.modules, "torch was imported at startup"
sys.modules["torch"] = None   # any `import torch` now raises ImportError
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("the torch shim did not work")
"""

MAPPED = r"""
def mapped():
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if "/" in line}
"""


def test_core_imports_where_torch_cannot_be_imported():
    code = NO_TORCH + MAPPED + r"""
import deepnvme._native as native
import deepnvme
assert deepnvme.native() is native
print("engine", native.engine_name())
stats = native.pinned_stats()
assert len(stats) == 3, stats
print("gds", deepnvme.op_unavailable_reason("gds"))
assert deepnvme.op_unavailable_reason("async_io") is None
torchy = sorted(p for p in mapped() if "libtorch" in p or "libc10" in p)
assert not torchy, torchy
assert any(p.endswith("/_native" + __import__("sysconfig").get_config_var("EXT_SUFFIX")) for p in mapped())
print("TORCH-FREE-OK")
"""
    # Default choice: without torch, the ops are the pyo3 front end's.
    proc = run_python(code, env={"DEEPNVME_FRONTEND": ""})
    assert proc.returncode == 0 and "TORCH-FREE-OK" in proc.stdout, proc.stdout + proc.stderr


def test_loading_an_op_without_torch_fails_cleanly():
    code = NO_TORCH + r"""
import deepnvme
try:
    deepnvme.load_op("async_io")
except ImportError as e:
    print("IMPORT-ERROR", e)
"""
    # Forced: by default a process without torch gets the pyo3 front end.
    proc = run_python(code, env={"DEEPNVME_FRONTEND": "compiled"})
    assert proc.returncode == 0 and "IMPORT-ERROR" in proc.stdout, proc.stdout + proc.stderr


def test_core_loaded_before_torch_is_the_ops_core(tmp_path):
    """The core first (no torch), then torch and the ops (RTLD_LOCAL): one
    core, one pinned-memory manager, one mapping of _native."""
    code = MAPPED + r"""
import os, sys
sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL)
import deepnvme._native as native
assert "torch" not in sys.modules
base = native.pinned_stats()
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
pin = PinMemoryBuilder().load().pin_handle()
aio = AsyncIOBuilder().load().aio_handle(4096, 8, False, False, 1)
t = pin.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
assert native.pinned_stats()[0] == base[0] + 1, (native.pinned_stats(), base)
assert aio.is_pinned(t)
assert aio.free_cpu_locked_tensor(t) is True
assert native.pinned_stats() == base
suffix = __import__("sysconfig").get_config_var("EXT_SUFFIX")
cores = {os.stat(p).st_ino for p in mapped() if p.endswith("/_native" + suffix)}
assert len(cores) == 1, cores
print("ONE-CORE-OK")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and "ONE-CORE-OK" in proc.stdout, proc.stdout + proc.stderr
