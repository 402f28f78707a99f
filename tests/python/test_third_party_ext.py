"""Third-party C++ on deepnvme's pinned manager.

A tiny torch C++ extension, written here and built with
torch.utils.cpp_extension.load, includes deepnvme's ``deepspeed_pin_tensor.h``
(deepnvme.include_dir()), calls ``deepspeed_pin_tensor_t::shared()``'s
alloc / is_managed / free and DeepSpeed's holder symbol, and links
deepnvme's pinned front (deepnvme.library_dir(), deepnvme.libraries(), with
an rpath). It shares the process's one manager with deepnvme's ops: memory
it locks is pinned for deepnvme's handles and the Rust core counts it, and
the other way round.
"""

import os
import sys

import pytest
import torch

import deepnvme
from conftest import provided_ops

# C++ that links deepnvme's pinned front (libdeepnvme_pin.so), whatever the front end.
pytestmark = pytest.mark.needs_compiled

SOURCE = r"""
#include <torch/extension.h>

#include "deepspeed_pin_tensor.h"

torch::Tensor probe_alloc(int64_t num_elem)
{
    return deepspeed_pin_tensor_t::shared()->alloc(num_elem, torch::kFloat32);
}

bool probe_is_managed(const torch::Tensor& t) { return deepspeed_pin_tensor_t::shared()->is_managed(t); }

bool probe_free(torch::Tensor t) { return deepspeed_pin_tensor_t::shared()->free(t); }

// The manager's address, through deepnvme's shared() and through DeepSpeed's seam.
int64_t probe_manager() { return reinterpret_cast<int64_t>(deepspeed_pin_tensor_t::shared().get()); }

int64_t probe_holder()
{
    auto* holder = static_cast<std::shared_ptr<deepspeed_pin_tensor_t>*>(deepspeed_pin_tensor_mgr_holder());
    return reinterpret_cast<int64_t>(holder->get());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("alloc", &probe_alloc);
    m.def("is_managed", &probe_is_managed);
    m.def("free", &probe_free);
    m.def("manager", &probe_manager);
    m.def("holder", &probe_holder);
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from torch.utils.cpp_extension import load

    for header in ("deepspeed_pin_tensor.h",):
        assert os.path.isfile(os.path.join(deepnvme.include_dir(), header)), deepnvme.include_dir()
    work = tmp_path_factory.mktemp("third_party_ext")
    src = work / "probe.cpp"
    src.write_text(SOURCE)
    lib = deepnvme.library_dir()
    # torch's JIT build runs ninja, which lives in this venv.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return load(
        name="deepnvme_third_party_probe",
        sources=[str(src)],
        extra_include_paths=[deepnvme.include_dir()],
        extra_ldflags=[f"-L{lib}", *(f"-l{name}" for name in deepnvme.libraries()), f"-Wl,-rpath,{lib}"],
        build_directory=str(work),
        verbose=False,
    )


def test_probe_links_deepnvmes_pinned_front(probe):
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert os.path.join(deepnvme.library_dir(), "libdeepnvme_pin.so") in maps
    assert probe.manager() != 0
    assert probe.holder() == probe.manager(), "DeepSpeed's holder and shared() disagree"


def test_memory_the_probe_locks_is_deepnvmes(probe, pin_mod, native):
    ph = pin_mod.pin_handle()
    handles = [ph]
    if "async_io" in provided_ops():
        from deepspeed.ops.op_builder import AsyncIOBuilder

        handles.append(AsyncIOBuilder().load().aio_handle(4096, 2, False, False, 1))
    base = native.pinned_stats()
    t = probe.alloc(4096)
    assert t.dtype == torch.float32 and t.shape == (4096,)
    assert native.pinned_stats()[0] == base[0] + 1
    assert probe.is_managed(t) and probe.is_managed(t[10:20])
    for h in handles:
        assert h.is_pinned(t) and h.is_pinned(t.narrow(0, 100, 1000)), h
    assert handles[-1].free_cpu_locked_tensor(t) is True
    assert native.pinned_stats() == base
    assert probe.free(t) is False


def test_memory_deepnvme_locks_is_the_probes(probe, pin_mod, native):
    ph = pin_mod.pin_handle()
    base = native.pinned_stats()
    t = ph.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.int64))
    assert probe.is_managed(t) and probe.is_managed(t[1:999])
    assert not probe.is_managed(torch.empty(1000, dtype=torch.int64))
    assert probe.free(t) is True
    assert native.pinned_stats() == base
    assert ph.free_cpu_locked_tensor(t) is False
