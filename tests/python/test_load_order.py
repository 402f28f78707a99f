"""One pinned-memory manager per process, whatever order the extensions load in.

DeepSpeed 0.19.8 keeps its "process-wide" manager in the pin_memory
extension, exports it, and forces ``RTLD_GLOBAL`` loading of pin_memory
before async_io (which otherwise fails to load). deepnvme links one Rust core
into one shared object that all three extensions depend on. Each case below
runs in a fresh interpreter that loads pin_memory, async_io and gds in a
given order (through DeepSpeed's builders, with dlopen flags forced to
RTLD_LOCAL), locks memory through the first one, and checks that the others
recognise it, free it, and see it freed. The gds handle is created with
``DEEPNVME_GDS_CPU_ONLY=1`` so it works without a GPU; its CPU path (CPU
tensors through a gds_handle) is exercised too.
"""

import itertools

import pytest

from _util import run_python

pytestmark = pytest.mark.compiled_only

CODE = r"""
import os, sys
sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL)   # nothing may rely on RTLD_GLOBAL
import torch
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
from deepspeed.ops.op_builder.gds import GDSBuilder

ORDER = {order!r}
loaders = {{
    "pin_memory": lambda: PinMemoryBuilder().load().pin_handle(),
    "async_io": lambda: AsyncIOBuilder().load().aio_handle(4096, 8, False, False, 1),
    "gds": lambda: GDSBuilder().load().gds_handle(4096, 8, False, False, 2),
}}
handles = {{name: loaders[name]() for name in ORDER}}
assert getattr(sys, "_deepspeed_pin_memory_op_module", None) is None, "DeepSpeed's RTLD_GLOBAL loader ran"
import deepnvme
native = deepnvme.native()
example = torch.empty(0, dtype=torch.float32)

first, *others = ORDER
base_stats = native.pinned_stats()
t = handles[first].new_cpu_locked_tensor(4096, example)
assert native.pinned_stats()[0] == base_stats[0] + 1
for name in ORDER:
    assert handles[name].is_pinned(t), (name, "does not see memory locked through", first)
    assert handles[name].is_pinned(t.narrow(0, 100, 1000)), name
    assert not handles[name].is_pinned(torch.empty(4096)), name

# Free through the last-loaded extension; everyone sees it gone.
last = ORDER[-1]
freer = handles[last]
freed = freer.free_cpu_locked_tensor(t)
assert freed is True, (last, freed)
assert native.pinned_stats() == base_stats
fresh = handles[ORDER[1]].new_cpu_locked_tensor(1024, example)
assert handles[first].free_cpu_locked_tensor(fresh) is True

# CPU tensors through the gds_handle (no GPU here): the CPU path works.
g = handles["gds"]
data = torch.arange(100_000, dtype=torch.int32)
path = os.path.join({tmp!r}, "gds_cpu.bin")
assert g.sync_pwrite(data, path, 0) == 1
back = torch.empty_like(data)
assert g.sync_pread(back, path, 0) == 1 and torch.equal(back, data)
print("ORDER-OK", ORDER)
"""


@pytest.mark.parametrize("order", list(itertools.permutations(["pin_memory", "async_io", "gds"])),
                         ids=lambda o: "-".join(o))
def test_one_manager_whatever_the_load_order(order, tmp_path):
    proc = run_python(CODE.format(order=list(order), tmp=str(tmp_path)), env={"DEEPNVME_GDS_CPU_ONLY": "1"})
    assert proc.returncode == 0 and "ORDER-OK" in proc.stdout, proc.stdout + proc.stderr


def test_gds_handle_needs_the_opt_in_without_a_gpu():
    code = r"""
    import torch
    from deepspeed.ops.op_builder.gds import GDSBuilder
    try:
        GDSBuilder().load().gds_handle()
    except RuntimeError as e:
        print("RAISED", e)
    """
    proc = run_python(code)
    if "RAISED" not in proc.stdout:
        pytest.skip("GPUDirect Storage is available here; this checks the no-GPU answer")
    assert "DEEPNVME_GDS_CPU_ONLY" in proc.stdout and "GPUDirect Storage" in proc.stdout, proc.stdout
