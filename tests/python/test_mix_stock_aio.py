"""The second mix: deepnvme's pin_memory under DeepSpeed's own C++ async_io.

With ``DEEPNVME_OPS=pin_memory`` DeepSpeed's builders JIT-build its stock
async_io (libaio, its own deepspeed_pin_tensor_client.cpp) and load
deepnvme's pin_memory through DeepSpeed's own route (pin_memory_load.py's
RTLD_GLOBAL dlopen). The stock op then finds the Rust pinned manager through
``deepspeed_pin_tensor_mgr_holder`` and calls deepnvme's
``deepspeed_pin_tensor_t`` members: memory locked through either side is
recognised and freed by the other, and is counted by the Rust core.

Every case runs in a fresh interpreter with the mix set explicitly, so this
file runs (and checks this mix) whatever mix the suite itself runs in. The
stock op needs libaio-dev: it is installed where possible (apt-get, as root),
otherwise the cases skip saying why. The JIT build is cached in the venv
(the first run takes minutes; later runs and fresh clones reuse it).
"""

import ctypes.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from _util import ANSI, run_python

# C++ that links deepnvme's pinned front (libdeepnvme_pin.so), whatever the front end.
pytestmark = pytest.mark.needs_compiled

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# In the venv, not the checkout: the stock op's JIT build takes minutes, and
# a fresh clone (CI) reuses the build that the venv's torch and deepspeed made.
EXT_DIR = os.path.join(sys.prefix, "deepnvme-torch-extensions")
BUILD_TIMEOUT = 1800


def have_libaio_dev():
    return ctypes.util.find_library("aio") is not None and os.path.exists("/usr/include/libaio.h")


def ensure_libaio_dev():
    """None when libaio-dev is there (installing it if we can), else why not."""
    if have_libaio_dev():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "libaio-dev is not installed and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "install", "-y", "libaio-dev"], ["apt-get", "update"],
                ["apt-get", "install", "-y", "libaio-dev"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if cmd[1] == "install" and proc.returncode == 0 and have_libaio_dev():
            return None
    return f"apt-get could not install libaio-dev: {proc.stderr.strip()[-500:]}"


def mix_env(ops="pin_memory"):
    venv_bin = os.path.dirname(sys.executable)
    return {
        "DEEPNVME_OPS": ops,
        "TORCH_EXTENSIONS_DIR": EXT_DIR,
        # DeepSpeed's JIT build needs ninja, which lives in the venv.
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }


@pytest.fixture(scope="module")
def stock_aio_built():
    """DeepSpeed's own async_io, JIT-built (or found built) for this mix."""
    why = ensure_libaio_dev()
    if why is not None:
        pytest.skip(f"DeepSpeed's stock async_io needs libaio-dev: {why}")
    code = r"""
    from deepspeed.ops.op_builder import AsyncIOBuilder
    b = AsyncIOBuilder()
    assert b.is_compatible(verbose=True), "DeepSpeed's async_io is not compatible here"
    m = b.load(verbose=False)
    print("BUILT", m.__name__, m.__file__)
    """
    proc = run_python(code, timeout=BUILD_TIMEOUT, env=mix_env())
    assert proc.returncode == 0 and "BUILT" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


STOCK_ON_RUST_MANAGER = r"""
import ctypes, os, sys
import torch
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder

assert deepnvme.provided_ops() == ("pin_memory",), deepnvme.provided_ops()
aio = AsyncIOBuilder().load()           # DeepSpeed's JIT module; loads pin_memory first
pin = PinMemoryBuilder().load()
native = deepnvme.native()
assert pin.__name__ == "deepnvme.pin_memory", pin
assert not aio.__name__.startswith("deepnvme"), aio
assert aio.__file__.startswith(os.environ["TORCH_EXTENSIONS_DIR"]), aio.__file__
# DeepSpeed's own route ran: its cache holds deepnvme's module, loaded RTLD_GLOBAL.
assert sys._deepspeed_pin_memory_op_module is pin

maps = open("/proc/self/maps").read()
assert "libaio" in maps, "the stock async_io does not use libaio?"
# Only the pinned front of deepnvme is loaded: the rest of the glue (whose
# classes share names with the stock op's) never is, let alone globally.
assert "libdeepnvme_pin.so" in maps and "libdeepnvme_torch.so" not in maps

# The holder is global (dlsym(RTLD_DEFAULT)), and it is deepnvme's.
glob = ctypes.CDLL(None)
front = ctypes.CDLL(os.path.join(deepnvme.library_dir(), "libdeepnvme_pin.so"), mode=os.RTLD_NOLOAD)
addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
assert addr(glob.deepspeed_pin_tensor_mgr_holder) == addr(front.deepspeed_pin_tensor_mgr_holder)
for member in ("_ZN22deepspeed_pin_tensor_t5allocElRKN3c1010ScalarTypeE",
               "_ZN22deepspeed_pin_tensor_t4freeERN2at6TensorE",
               "_ZN22deepspeed_pin_tensor_t10is_managedERKN2at6TensorE"):
    assert addr(getattr(glob, member)) == addr(getattr(front, member)), member
# Neither the rest of deepnvme's glue nor the stock op's own classes are global.
assert not hasattr(glob, "_Z24warn_consumer_ssd_writesv")

h = aio.aio_handle(1 << 20, 8, False, False, 1)
ph = pin.pin_handle()
u8 = torch.empty(0, dtype=torch.uint8)
base = native.pinned_stats()

# Locked by the stock async_io -> a Rust region, recognised and freed by deepnvme.
t = h.new_cpu_locked_tensor(3 * 4096, u8)
assert native.pinned_stats()[0] == base[0] + 1, (native.pinned_stats(), base)
assert ph.is_pinned(t) and ph.is_pinned(t.narrow(0, 100, 1000)) and h.is_pinned(t.narrow(0, 100, 1000))
assert not h.is_pinned(torch.empty(4096, dtype=torch.uint8))
assert ph.free_cpu_locked_tensor(t) is True
assert native.pinned_stats() == base
assert h.free_cpu_locked_tensor(t) is False

# Locked by deepnvme -> recognised and freed by the stock async_io.
t = ph.new_cpu_locked_tensor(2048, torch.empty(0, dtype=torch.float32))
assert h.is_pinned(t) and h.is_pinned(t[5:77])
assert h.free_cpu_locked_tensor(t) is True
assert native.pinned_stats() == base

# The stock op moves bytes through memory the Rust manager locked...
path = os.path.join(sys.argv[1], "stock.bin")
n = 1 << 20
src = h.new_cpu_locked_tensor(n, u8)
src.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
assert h.sync_pwrite(src, path) == 1
dst = ph.new_cpu_locked_tensor(n, u8)
assert h.sync_pread(dst, path) == 1
assert torch.equal(src, dst)
assert h.free_cpu_locked_tensor(src) and ph.free_cpu_locked_tensor(dst)
# ...and bounces an unpinned tensor through a buffer it borrows from it.
# (dst was freed above and is still read here: a locked tensor owns its
# memory, so a free only unlocks it and the mapping goes with the tensor.
# The C++ manager unmapped it at once, and this line crashed with SIGSEGV.)
plain = torch.empty(n, dtype=torch.uint8)
assert h.sync_pread(plain, path) == 1
assert torch.equal(plain, dst)
assert native.pinned_stats() == base, (native.pinned_stats(), base)
# Twice in clean-clone CI (never in ~200 runs alone) this script ended with
# "terminate called without an active exception", rc -6. The likely cause:
# DeepSpeed's C++ worker thread signals an op complete and only then drops
# its reference to the op, and with it to the caller's tensor. When that is
# the last reference (the script has ended, finalization released the
# Python side), torch takes the GIL on that thread to free the tensor's
# Python object; during interpreter finalization CPython ends such a thread
# with pthread_exit, whose unwinding through a noexcept destructor is
# std::terminate (pytorch/pytorch#38228). Deleting the handle
# joins its threads while the interpreter still runs. (deepnvme's workers
# never hold a caller's tensor: a completion is finished and dropped on the
# caller's thread.)
del plain, src, dst, t, h
print("STOCK-ON-RUST-MANAGER-OK")
"""


def test_stock_async_io_runs_on_the_rust_manager(stock_aio_built, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", STOCK_ON_RUST_MANAGER, str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k not in ("DEEPNVME_OPS", "DEEPNVME_ENGINE")}, **mix_env()},
    )
    assert proc.returncode == 0 and "STOCK-ON-RUST-MANAGER-OK" in proc.stdout, proc.stdout + proc.stderr


def test_ds_report_names_the_providers(stock_aio_built):
    env = {**os.environ, **mix_env()}
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ds_report")],
                          capture_output=True, text=True, timeout=300, env=env)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out
    rows = {op: re.search(rf"^{op} \.+ \[(\w+)\] \.+ \[(\w+)\]", out, re.M) for op in ("async_io", "pin_memory")}
    assert rows["pin_memory"] and rows["pin_memory"].groups() == ("YES", "OKAY"), out
    assert rows["async_io"] and rows["async_io"].groups() == ("NO", "OKAY"), out
    assert ("deepnvme (DEEPNVME_OPS=pin_memory): Rust core provides pin_memory; "
            "DeepSpeed's C++ (JIT) provides async_io, gds") in out, out


def test_async_io_alone_implies_pin_memory():
    code = r"""
    import deepnvme
    print("OPS", deepnvme.provided_ops())
    print("OPS2", deepnvme.provided_ops("gds"))
    try:
        deepnvme.provided_ops("pin_memory,libaio")
    except ValueError as e:
        print("BAD", e)
    """
    proc = run_python(code, env={"DEEPNVME_OPS": "async_io"})
    assert proc.returncode == 0, proc.stderr
    assert "OPS ('async_io', 'pin_memory')" in proc.stdout, proc.stdout
    assert "OPS2 ('pin_memory', 'gds')" in proc.stdout, proc.stdout
    assert "BAD" in proc.stdout and "libaio" in proc.stdout, proc.stdout


CHECKS_BEFORE_STOCK_LOAD = r"""
import os, sys
import torch
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder

# What DeepSpeed's tests and ds_report do before any load: ask deepnvme.
assert PinMemoryBuilder().is_compatible()
print("front end:", deepnvme.choose_frontend())
assert "deepnvme.async_io" not in sys.modules and "deepnvme.gds" not in sys.modules, \
    "deepnvme imported a compiled op it does not provide here"
aio = AsyncIOBuilder().load()  # DeepSpeed's own JIT module
assert not aio.__name__.startswith("deepnvme"), aio
h = aio.aio_handle(1 << 20, 8, False, False, 1)
t = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.uint8))
t.copy_(torch.randint(0, 256, (1 << 20,), dtype=torch.uint8))
path = os.path.join(sys.argv[1], "x.bin")
assert h.sync_pwrite(t, path) == 1
back = torch.zeros(1 << 20, dtype=torch.uint8)
assert h.sync_pread(back, path) == 1 and torch.equal(back, t)
del back, t, h  # joins the stock op's threads before exit: see STOCK_ON_RUST_MANAGER's end
print("CHECKS-THEN-STOCK-OK")
"""


def test_deepnvme_checks_before_the_stock_load_do_not_collide_with_it(stock_aio_built, tmp_path):
    """Asking deepnvme first (is_compatible, choose_frontend) must import only
    the ops it provides: importing deepnvme.async_io registered pybind11's
    "aio_handle" before DeepSpeed's own module did, which then failed to
    import ("generic_type: type aio_handle is already registered!") -- every
    case of DeepSpeed's own suite failed that way in this mix."""
    proc = subprocess.run(
        [sys.executable, "-c", CHECKS_BEFORE_STOCK_LOAD, str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if k not in ("DEEPNVME_OPS", "DEEPNVME_ENGINE",
                                                                  "DEEPNVME_FRONTEND")}, **mix_env()},
    )
    assert proc.returncode == 0 and "CHECKS-THEN-STOCK-OK" in proc.stdout, proc.stdout + proc.stderr[-4000:]
