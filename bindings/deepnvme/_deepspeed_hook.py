"""Makes DeepSpeed's own op builders return deepnvme's modules.

A .pth file calls install() at interpreter start. It adds an import hook
that waits for DeepSpeed to import ``deepspeed.ops.op_builder.builder`` and
then arranges that every op builder class named ``async_io``,
``pin_memory`` or ``gds`` -- for whichever accelerator (cuda, cpu, ...) --
gets a ``load()`` that returns deepnvme's module and an ``is_compatible()``
that says whether it can run here (no libaio needed). It also marks those
ops installed in ``deepspeed.git_version_info`` so ``ds_report`` shows them,
and when DeepSpeed's engine is imported makes ``shutil.copytree`` copy stripe
set files by their bytes (the engine copies NVMe swap files into checkpoints
with it; see _copy.py).

No DeepSpeed file is edited; ``DEEPNVME_DEEPSPEED_HOOK=0`` turns this off.
Nothing here imports torch or DeepSpeed by itself.

``DEEPNVME_OPS`` chooses the ops (``deepnvme.provided_ops()``; ``all`` by
default): only those are patched and marked installed, the others keep
DeepSpeed's behaviour (JIT-built C++). When some are DeepSpeed's, deepnvme's
pin_memory is loaded through DeepSpeed's own route (pin_memory_load.py, an
RTLD_GLOBAL dlopen) so that DeepSpeed's async_io/gds find the Rust manager
through ``deepspeed_pin_tensor_mgr_holder``; ``ds_report`` gets a line
naming the provider of each op.
"""

import importlib.abc
import os
import sys
import warnings

_BUILDER_MODULES = ("deepspeed.ops.op_builder.builder", "op_builder.builder")
_VERSION_INFO_MODULE = "deepspeed.git_version_info"
_ENV_REPORT_MODULE = "deepspeed.env_report"
_ENGINE_MODULE = "deepspeed.runtime.engine"
_installed = False
_selected = None


def _ops():
    import deepnvme
    return deepnvme


def _selected_ops():
    """The ops deepnvme provides here (DEEPNVME_OPS; see
    deepnvme.provided_ops). A bad value warns and keeps the default, all."""
    global _selected
    if _selected is None:
        ops = _ops()
        try:
            _selected = ops.provided_ops()
        except ValueError as error:
            warnings.warn(f"deepnvme: {error}; using all")
            _selected = ops.OPS
    return _selected


def _deepspeed_ops():
    """The DeepNVMe ops left to DeepSpeed's own C++ here."""
    return tuple(op for op in _ops().OPS if op not in _selected_ops())


def _pin_memory_load_for_stock_ops(cls):
    """With DeepSpeed's own async_io/gds in the process, deepnvme's
    pin_memory is loaded DeepSpeed's way: its load() (pin_memory_load.py)
    finds deepnvme's module in DeepSpeed's process-wide cache and dlopens it
    RTLD_GLOBAL, which makes libdeepnvme_pin.so -- deepspeed_pin_tensor_t's
    members and deepspeed_pin_tensor_mgr_holder -- global for the stock ops
    JIT-built afterwards. Returns the load() to install (None: keep deepnvme's)."""
    deepspeed_load = cls.__dict__.get("load")
    if not _deepspeed_ops() or deepspeed_load is None:
        return None

    def load(self, verbose=False):
        module = _ops().load_pin_memory_for_stock_ops()
        cache = "_deepspeed_pin_memory_op_module"  # pin_memory_load._SYS_CACHE_ATTR
        if getattr(sys, cache, None) is None:
            setattr(sys, cache, module)
        loaded = deepspeed_load(self, verbose=verbose)
        if loaded is not module:
            raise RuntimeError(f"deepnvme: DeepSpeed's pin_memory loader returned {loaded!r}, not {module.__name__}")
        return module

    load.__doc__ = "deepnvme: returns the Rust-backed pin_memory module, loaded RTLD_GLOBAL by DeepSpeed's loader."
    return load


def _patch_builder_class(cls):
    if cls.__module__ == "deepnvme.op_builder":
        return  # deepnvme's own builders build the op; nothing to redirect
    name = cls.__dict__.get("NAME")
    if name not in ("async_io", "pin_memory", "gds") or name not in _selected_ops():
        return
    stock_route = _pin_memory_load_for_stock_ops(cls) if name == "pin_memory" else None

    def load(self, verbose=False):
        return _ops().load_op(name)

    def jit_load(self, verbose=True):
        return _ops().load_op(name)

    def is_compatible(self, verbose=False):
        reason = _ops().op_unavailable_reason(name)
        if reason is not None and verbose:
            self.warning(f"{name} (deepnvme): {reason}")
        return reason is None

    load.__doc__ = f"deepnvme: returns the Rust-backed {name} module."
    cls.load = stock_route or load
    cls.jit_load = jit_load
    cls.is_compatible = is_compatible
    cls._deepnvme_backed = True


def _patch_builder_module(module):
    op_builder = getattr(module, "OpBuilder", None)
    if op_builder is None:
        return
    previous = op_builder.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(op_builder, cls).__init_subclass__(**kwargs)
        _patch_builder_class(cls)

    op_builder.__init_subclass__ = classmethod(__init_subclass__)
    # Builders defined before this hook ran (none, normally) get patched too.
    pending = list(op_builder.__subclasses__())
    while pending:
        cls = pending.pop()
        _patch_builder_class(cls)
        pending.extend(cls.__subclasses__())


def _patch_version_info(module):
    installed = getattr(module, "installed_ops", None)
    if isinstance(installed, dict):
        for name in _selected_ops():
            installed[name] = True


def _patch_env_report(module):
    """ds_report: after DeepSpeed's op table, one line naming who provides
    each DeepNVMe op (deepnvme's Rust core, or DeepSpeed's C++)."""
    op_report = getattr(module, "op_report", None)
    if op_report is None:
        return

    def report(*args, **kwargs):
        result = op_report(*args, **kwargs)
        print(provider_note())
        return result

    report.__wrapped__ = op_report
    module.op_report = report


def provider_note():
    """The ds_report line: which DeepNVMe op comes from whom."""
    ours = ", ".join(_selected_ops()) or "none"
    theirs = ", ".join(_deepspeed_ops()) or "none"
    setting = os.environ.get("DEEPNVME_OPS", "all")
    return f"deepnvme (DEEPNVME_OPS={setting}): Rust core provides {ours}; DeepSpeed's C++ (JIT) provides {theirs}"


def _patch_engine(module):
    """The engine's save_checkpoint/load_checkpoint copy the optimizer's swap
    files with shutil.copytree: make its copies of stripe set files hold
    their bytes (deepnvme._copy)."""
    from deepnvme import _copy

    _copy.install_for_deepspeed(module)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then a patch on the fresh module."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as error:  # never break `import deepspeed`
            warnings.warn(f"deepnvme: could not hook {module.__name__}: {error}")

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the watched modules with the other finders, then wraps their loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname in _BUILDER_MODULES:
            patch = _patch_builder_module
        elif fullname == _VERSION_INFO_MODULE:
            patch = _patch_version_info
        elif fullname == _ENV_REPORT_MODULE:
            patch = _patch_env_report
        elif fullname == _ENGINE_MODULE:
            patch = _patch_engine
        else:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install():
    """Adds the import hook (once). Called from deepnvme-deepspeed.pth."""
    global _installed
    if _installed or os.environ.get("DEEPNVME_DEEPSPEED_HOOK", "1") == "0":
        return
    _installed = True
    sys.meta_path.insert(0, _Finder())
