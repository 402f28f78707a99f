"""Fixtures for the deepnvme Python suite.

Every test reaches the ops the way DeepSpeed users do, through DeepSpeed's
own loader (``AsyncIOBuilder().load()`` etc.), which deepnvme's .pth hook
makes return the Rust-backed modules: the compiled ones or the pyo3 front
end (``deepnvme.frontend``), as ``DEEPNVME_FRONTEND`` (or, unset, the match
between the compiled modules and this torch) decides. tests/run-all.sh runs
the suite once per front end; tests marked ``compiled_only`` (about the
compiled extensions themselves) skip under the pyo3 front end. Files live under pytest's tmp_path,
which must be on a file system with O_DIRECT (ext4 here; see
test_loader.py::test_tmp_path_supports_o_direct).

The suite runs in any mix of providers (``DEEPNVME_OPS``, see
deepnvme.provided_ops): a test of deepnvme's async_io (the ``aio`` fixture)
skips, naming the mix, where async_io is DeepSpeed's own C++; the pinned
manager's tests run in every mix. Tests that start their own interpreter
choose their mix explicitly (_util.run_python clears DEEPNVME_OPS).
"""

import os
import sys

import pytest
import torch

# The tests import _util from this folder, under any --import-mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def provided_ops():
    """The ops deepnvme provides in this run (DEEPNVME_OPS)."""
    import deepnvme

    return deepnvme.provided_ops()


def frontend():
    """'compiled' or 'pyo3': what DeepSpeed's builders return in this run."""
    import deepnvme

    return deepnvme.choose_frontend()[0]


def module_name(op):
    """The module name AsyncIOBuilder etc. return for `op` in this run."""
    return "deepnvme.frontend" if frontend() == "pyo3" else f"deepnvme.{op}"


def compiled_modules_installed():
    """Whether this install has the compiled modules (a wheel-only install has not)."""
    import importlib.util

    return all(importlib.util.find_spec(f"deepnvme.{op}") is not None for op in ("async_io", "pin_memory", "gds"))


def pytest_configure(config):
    config.addinivalue_line("markers", "compiled_only: about the compiled extensions; skipped under the pyo3 front end")
    config.addinivalue_line("markers", "needs_compiled: uses the compiled modules whatever the front end (C++ "
                            "linking deepnvme's pinned front); skipped in a wheel-only install")


def pytest_collection_modifyitems(config, items):
    pyo3 = frontend() == "pyo3"
    installed = compiled_modules_installed()
    skip_compiled = pytest.mark.skip(reason="about the compiled extensions (load order, ELF, pybind11); this run "
                                     "uses the pyo3 front end")
    skip_missing = pytest.mark.skip(reason="needs deepnvme's compiled modules, which this (wheel-only) install "
                                    "does not have")
    for item in items:
        if pyo3 and item.get_closest_marker("compiled_only"):
            item.add_marker(skip_compiled)
        elif not installed and item.get_closest_marker("needs_compiled"):
            item.add_marker(skip_missing)


def pytest_report_header(config):
    lines = []
    try:
        import deepnvme

        lines.append(f"deepnvme provides: {', '.join(provided_ops()) or 'none'} "
                     f"(DEEPNVME_OPS={os.environ.get('DEEPNVME_OPS', 'all')})")

        nat = deepnvme.native()
        lines.append(f"deepnvme engine: {nat.engine_name()}; memlock rlimit: {nat.memlock_rlimit()}")
        lines.append("deepnvme front end: %s (%s)" % deepnvme.choose_frontend())
    except Exception as error:  # the tests themselves report it properly
        lines.append(f"deepnvme core failed to load: {error!r}")
    lines.append(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    return lines


@pytest.fixture(scope="session")
def aio():
    """The async_io module, through DeepSpeed's loader (deepnvme's: tests
    using it skip in a mix where async_io is DeepSpeed's own C++)."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if "async_io" not in provided_ops():
        pytest.skip(f"async_io is DeepSpeed's own C++ in this mix (DEEPNVME_OPS={os.environ.get('DEEPNVME_OPS')}); "
                    "this checks deepnvme's")

    return AsyncIOBuilder().load()


@pytest.fixture(scope="session")
def pin_mod():
    """The pin_memory module, through DeepSpeed's loader."""
    from deepspeed.ops.op_builder import PinMemoryBuilder

    return PinMemoryBuilder().load()


@pytest.fixture(scope="session")
def native():
    import deepnvme

    return deepnvme.native()


@pytest.fixture
def new_handle(aio, locked):
    """Factory: aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism).

    Depends on `locked` so that at teardown the handles are dropped (which
    finishes any op a failed test left in flight) before locked memory is freed.
    """
    made = []

    def make(block_size=1 << 20, queue_depth=128, single_submit=False, overlap_events=False, intra_op_parallelism=1):
        h = aio.aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)
        made.append(h)
        return h

    yield make
    for h in made:  # a failed test may have left ops in flight (and its frame alive)
        try:
            h.wait()
        except RuntimeError:
            pass
    made.clear()


@pytest.fixture
def handle(new_handle):
    """A handle with small blocks and two workers, so ops really split and queue."""
    return new_handle(block_size=8192, queue_depth=4, single_submit=False, overlap_events=True, intra_op_parallelism=2)


@pytest.fixture(scope="session")
def alloc_handle(request):
    """What `locked` allocates through: an aio_handle where async_io is
    deepnvme's, else a pin_handle (same manager, same two methods)."""
    if "async_io" in provided_ops():
        return request.getfixturevalue("aio").aio_handle(4096, 2, False, False, 1)
    return request.getfixturevalue("pin_mod").pin_handle()


@pytest.fixture
def locked(alloc_handle):
    """Factory: a locked tensor from new_cpu_locked_tensor(num_elem, dtype); freed at teardown."""
    owner = alloc_handle
    allocated = []

    def alloc(num_elem, dtype=torch.uint8, via=None):
        h = via if via is not None else owner
        t = h.new_cpu_locked_tensor(num_elem, torch.empty(0, dtype=dtype))
        allocated.append(t)
        return t

    yield alloc
    for t in allocated:
        owner.free_cpu_locked_tensor(t)


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path
