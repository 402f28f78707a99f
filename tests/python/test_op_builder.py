"""deepnvme.op_builder: DeepSpeed-style builders that compile DeepSpeed's
binding files and deepnvme's torch shims against the running torch, JIT
(DeepSpeed's own jit_load, torch's extensions folder) or ahead of time (the
CppExtension DeepSpeed's setup.py builds), linked against the core the
package ships -- so one process still has one core.

Every build runs in a fresh interpreter: an op built here registers the same
pybind11 classes as the package's compiled op of that name, and one process
cannot hold both. Builds are cached under the venv (torch's extensions
folder deepnvme-opbuilder-extensions, the ahead-of-time build folder
deepnvme-opbuilder-aot), so only the first run compiles.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import sysconfig

import pytest

import deepnvme
from _deepspeed_copy import PROPOSAL, make_copy
from _util import run_python
from conftest import compiled_modules_installed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NATIVE_FILE = "_native" + sysconfig.get_config_var("EXT_SUFFIX")
EXTENSIONS = os.path.join(sys.prefix, "deepnvme-opbuilder-extensions")
AOT_BUILD = os.path.join(sys.prefix, "deepnvme-opbuilder-aot")


def build_env(**extra):
    # DeepSpeed's jit_load needs ninja, which lives in the venv.
    env = {"TORCH_EXTENSIONS_DIR": EXTENSIONS,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.update(extra)
    return env


def check(proc, marker):
    """The child's JSON line, once it finished with `marker`."""
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith('{"')][-1])


# What a child prints about the ops it loaded, for the checks below: the
# core each maps, the ELF facts, and no libaio anywhere.
FACTS = r"""
import json, os, sys
sys.path.insert(0, TESTS)
from _elf import read_dynamic

def facts(module):
    dyn = read_dynamic(module.__file__)
    return {"file": module.__file__, "needed": dyn.needed, "runpath": dyn.runpath,
            "core_symbols": sorted(s for s in dyn.defined if "8deepnvme3ffi" in s or "17h" in s)[:5],
            "exports": sorted(dyn.defined)}

def mapped(name):
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if name in line.split()[-1]})
""".replace("TESTS", repr(os.path.dirname(os.path.abspath(__file__))))

ROUND_TRIP = r"""
def round_trip(aio, locked, path):
    h = aio.aio_handle(1 << 16, 8, False, True, 2)
    data = torch.randint(0, 255, (locked.numel(),), dtype=torch.uint8)
    locked.copy_(data)
    assert h.sync_pwrite(locked, path) == 1
    locked.zero_()
    assert h.async_pread(locked, path) == 0 and h.wait() == 1
    assert torch.equal(locked, data), "read back other bytes"
    plain = torch.empty_like(data)
    assert h.sync_pread(plain, path) == 1 and torch.equal(plain, data)
    del h
"""


def test_builders_are_deepspeeds_op_builders_with_its_op_names():
    # Made on DeepSpeed's OpBuilder, with DeepSpeed's names, and never
    # redirected by deepnvme's own hook (they build the op themselves).
    from deepspeed.ops.op_builder.builder import OpBuilder

    from deepnvme.op_builder import AsyncIOBuilder, GDSBuilder, PinMemoryBuilder

    expected = {AsyncIOBuilder: ("async_io", "DS_BUILD_AIO", "deepspeed.ops.aio.async_io_op"),
                PinMemoryBuilder: ("pin_memory", "DS_BUILD_PIN_MEMORY", "deepspeed.ops.pin_memory.pin_memory_op"),
                GDSBuilder: ("gds", "DS_BUILD_GDS", "deepspeed.ops.gds.gds_op")}
    for cls, (name, build_var, absolute) in expected.items():
        assert issubclass(cls, OpBuilder), cls.__mro__
        b = cls()
        assert (b.name, cls.NAME, cls.BUILD_VAR, b.absolute_name()) == (name, name, build_var, absolute)
        assert not getattr(cls, "_deepnvme_backed", False), f"deepnvme's hook patched {cls}"
        assert cls.load.__module__ == "deepnvme.op_builder"


def test_compatible_without_libaio_where_the_package_has_its_compiled_core():
    from deepnvme.op_builder import AsyncIOBuilder, PinMemoryBuilder

    if compiled_modules_installed():
        for cls in (AsyncIOBuilder, PinMemoryBuilder):
            assert cls().is_compatible(verbose=True), cls
        # Nothing of libaio in what the build passes the compiler and linker.
        b = AsyncIOBuilder()
        assert not [a for a in b.cxx_args() + b.extra_ldflags() if "-laio" in a or "libaio" in a]
    else:
        # The abi3 wheel's core has no C++ bridge; another core would be a
        # second pinned manager, so the builders refuse and say why.
        b = AsyncIOBuilder()
        assert not b.is_compatible(verbose=True)
        assert "abi3 wheel" in b.error_log and "two pinned-memory managers" in b.error_log, b.error_log


@pytest.mark.needs_compiled
def test_jit_builds_load_and_share_the_one_core(tmp_path):
    # async_io and gds built by DeepSpeed's jit_load through these builders;
    # pin_memory is the package's (whatever DeepSpeed's hooked builder gives
    # for this run's front end), and the pyo3 front end is there too: memory
    # locked through any of them is pinned for all, counted by one core.
    code = FACTS + ROUND_TRIP + r"""
import torch, deepnvme
from deepnvme.op_builder import AsyncIOBuilder, GDSBuilder
from deepspeed.ops.op_builder import PinMemoryBuilder
import deepnvme.frontend as pyo3

aio = AsyncIOBuilder().load()
gds = GDSBuilder().load()
pin = PinMemoryBuilder().load()
assert aio.__file__.startswith(os.environ["TORCH_EXTENSIONS_DIR"]), aio.__file__
assert gds.__file__.startswith(os.environ["TORCH_EXTENSIONS_DIR"]), gds.__file__
assert AsyncIOBuilder().load() is aio, "not cached like a DeepSpeed op"
native = deepnvme.native()
handles = {"jit async_io": aio.aio_handle(4096, 2, False, False, 1),
           "jit gds": gds.gds_handle(4096, 2, False, False, 1),
           "package pin_memory (" + pin.__name__ + ")": pin.pin_handle(),
           "pyo3 front end": pyo3.pin_handle()}
example = torch.empty(0, dtype=torch.uint8)
for maker, mh in handles.items():
    before = native.pinned_stats()[0]
    t = mh.new_cpu_locked_tensor(1 << 16, example)
    assert native.pinned_stats()[0] == before + 1, maker
    for name, h in handles.items():
        assert h.is_pinned(t) and h.is_pinned(t.narrow(0, 4096, 4096)), (name, "misses memory of", maker)
    round_trip(aio, t, os.path.join(TMP, "jit.bin"))
    assert handles["jit async_io"].free_cpu_locked_tensor(t) is True, maker
    assert native.pinned_stats()[0] == before
print(json.dumps({"aio": facts(aio), "gds": facts(gds), "cores": mapped("_native"), "libaio": mapped("libaio"),
                  "pkg": deepnvme.library_dir()}))
print("JIT-OK")
""".replace("TMP", repr(str(tmp_path)))
    proc = run_python(code, timeout=1800, env=build_env(DEEPNVME_GDS_CPU_ONLY="1"))
    out = check(proc, "JIT-OK")
    assert out["cores"] == [os.path.join(out["pkg"], NATIVE_FILE)], out["cores"]
    assert out["libaio"] == []
    for op in ("aio", "gds"):
        f = out[op]
        assert NATIVE_FILE in f["needed"] and out["pkg"] in f["runpath"], f
        assert not any("libaio" in n or "deepnvme_torch" in n or "deepnvme_pin" in n for n in f["needed"]), f
        assert f["core_symbols"] == [], f"the op holds a copy of the core: {f['core_symbols']}"
        # Only the module's entry point: nothing of the op can interpose on another's classes.
        extra = [s for s in f["exports"] if not s.startswith("PyInit_") and s not in ("_init", "_fini")]
        assert extra == [], extra[:20]


def test_the_proposal_in_the_docs_is_the_one_tested():
    with open(os.path.join(ROOT, "docs", "deepspeed-compatibility.md")) as f:
        doc = f.read()
    assert PROPOSAL.format(cls="AsyncIOBuilder").strip() in doc


@pytest.fixture
def deepspeed_copy():
    """A throwaway redirected copy of the installed deepspeed, in a temporary
    folder outside the repository: (folder to put on PYTHONPATH, the copy)."""
    site = tempfile.mkdtemp(prefix="deepnvme-deepspeed-copy-")
    try:
        yield site, make_copy(site)
    finally:
        shutil.rmtree(site, ignore_errors=True)


@pytest.mark.needs_compiled
def test_ahead_of_time_build_into_a_deepspeed_copy_loads_without_jit(tmp_path, deepspeed_copy):
    # As DeepSpeed's setup.py does with DS_BUILD_AIO=1 DS_BUILD_PIN_MEMORY=1:
    # the builder() (a torch CppExtension named deepspeed.ops.*_op) of each
    # op of ALL_OPS whose BUILD_VAR is set and that is compatible, built by
    # the accelerator's BuildExtension, here with ninja (DS_ENABLE_NINJA=1)
    # and a build folder kept in the venv. ALL_OPS is a throwaway deepspeed
    # copy's, its builders redirected to deepnvme's; the modules go into that
    # copy, where DeepSpeed's AsyncIOBuilder().load() imports them, compiling
    # nothing. (The CPU accelerator has no gds op; the JIT test builds gds.)
    site, copy = deepspeed_copy
    setup_py = tmp_path / "setup.py"
    setup_py.write_text(r"""
import os, sys
from setuptools import setup
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.op_builder.all_ops import ALL_OPS
from deepnvme.op_builder import AsyncIOBuilder, PinMemoryBuilder
builders = [b for b in ALL_OPS.values() if int(os.environ.get(b.BUILD_VAR, "0")) and b.is_compatible(verbose=True)]
# DeepSpeed's own list of builders is redirected to deepnvme's.
assert sorted(type(b).__name__ for b in builders) == ["AsyncIOBuilder", "PinMemoryBuilder"], builders
assert all(type(b) in (AsyncIOBuilder, PinMemoryBuilder) for b in builders), builders
setup(name="deepnvme-aot-check", ext_modules=[b.builder() for b in builders],
      cmdclass={"build_ext": get_accelerator().build_extension().with_options(use_ninja=True)})
""")
    lib = os.path.join(AOT_BUILD, "lib")
    env = build_env(PYTHONPATH=site, DEEPNVME_DEEPSPEED_HOOK="0", DS_BUILD_AIO="1", DS_BUILD_PIN_MEMORY="1",
                    MAX_JOBS=str(os.cpu_count() or 1))
    proc = subprocess.run([sys.executable, str(setup_py), "build_ext", "--build-lib", lib,
                           "--build-temp", os.path.join(AOT_BUILD, "temp")],
                          capture_output=True, text=True, timeout=3600, env=dict(os.environ, **env), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    for rel in ("ops/aio/async_io_op", "ops/pin_memory/pin_memory_op"):
        built = os.path.join(lib, "deepspeed", rel + sysconfig.get_config_var("EXT_SUFFIX"))
        assert os.path.isfile(built), built
        shutil.copy2(built, os.path.join(copy, os.path.dirname(rel)))

    empty = tmp_path / "no-jit"
    empty.mkdir()
    code = FACTS + ROUND_TRIP + r"""
import torch, deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
import deepnvme.frontend as pyo3
import deepspeed
assert deepspeed.__file__.startswith(COPY), deepspeed.__file__
assert AsyncIOBuilder.__module__ == "deepnvme.op_builder", AsyncIOBuilder
aio, pin = AsyncIOBuilder().load(), PinMemoryBuilder().load()
for m in (aio, pin):
    assert m.__file__.startswith(COPY), m.__file__
native = deepnvme.native()
t = pin.pin_handle().new_cpu_locked_tensor(1 << 16, torch.empty(0, dtype=torch.uint8))
h = aio.aio_handle(4096, 2, False, False, 1)
assert pyo3.pin_handle().is_pinned(t) and h.is_pinned(t) and native.pinned_stats()[0] >= 1
round_trip(aio, t, os.path.join(TMP, "aot.bin"))
assert pyo3.pin_handle().free_cpu_locked_tensor(t) is True
print(json.dumps({"cores": mapped("_native"), "built": os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])}))
print("AOT-OK")
""".replace("COPY", repr(copy)).replace("TMP", repr(str(tmp_path)))
    proc = run_python(code, timeout=600, env=build_env(PYTHONPATH=site, DEEPNVME_DEEPSPEED_HOOK="0",
                                                      TORCH_EXTENSIONS_DIR=str(empty)))
    out = check(proc, "AOT-OK")
    assert out["cores"] == [os.path.join(deepnvme.library_dir(), NATIVE_FILE)], out
    assert out["built"] == [], f"something was JIT-built: {out['built']}"


@pytest.mark.compiled_only
@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")
def test_a_source_checkout_gets_its_core_from_cargo_and_it_is_deepnvme_native(tmp_path):
    # deepnvme imported from this checkout's bindings/ (no core built
    # there): the builder builds the core with cargo, makes it the process's
    # deepnvme._native, and links the op against it -- one core, which the
    # pyo3 front end (the same _native) shares.
    code = FACTS + r"""
import torch, deepnvme
assert deepnvme.__file__.startswith(BINDINGS), deepnvme.__file__
from deepnvme.op_builder import PinMemoryBuilder, core_location
pin = PinMemoryBuilder().load()
import deepnvme._native as native, deepnvme.frontend as pyo3
core = core_location()
assert core.origin == "cargo" and native.__file__.startswith(os.environ["TORCH_EXTENSIONS_DIR"]), native.__file__
t = pin.pin_handle().new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.float32))
assert pyo3.pin_handle().is_pinned(t) and native.pinned_stats()[0] == 1
assert pyo3.pin_handle().free_cpu_locked_tensor(t) is True and native.pinned_stats()[0] == 0
print(json.dumps({"cores": mapped("_native"), "native": native.__file__, "pin": facts(pin)}))
print("CARGO-OK")
""".replace("BINDINGS", repr(os.path.join(ROOT, "bindings")))
    proc = run_python(code, timeout=3600, env=build_env(PYTHONPATH=os.path.join(ROOT, "bindings")))
    out = check(proc, "CARGO-OK")
    assert out["cores"] == [out["native"]], out["cores"]
    assert os.path.dirname(out["native"]) in out["pin"]["runpath"], out["pin"]
    # The pinned front is exported (DeepSpeed's own async_io resolves it globally).
    assert "deepspeed_pin_tensor_mgr_holder" in out["pin"]["exports"]
