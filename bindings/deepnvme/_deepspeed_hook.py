"""Makes DeepSpeed's own op builders return deepnvme's modules.

A .pth file calls install() at interpreter start. It adds an import hook
that waits for DeepSpeed to import ``deepspeed.ops.op_builder.builder`` and
then arranges that every op builder class named ``async_io``,
``pin_memory`` or ``gds`` -- for whichever accelerator (cuda, cpu, ...) --
gets a ``load()`` that returns deepnvme's module and an ``is_compatible()``
that says whether it can run here (no libaio needed). It also marks those
ops installed in ``deepspeed.git_version_info`` so ``ds_report`` shows them.

No DeepSpeed file is edited; ``DEEPNVME_DEEPSPEED_HOOK=0`` turns this off.
Nothing here imports torch or DeepSpeed by itself.
"""

import importlib.abc
import os
import sys
import warnings

_BUILDER_MODULES = ("deepspeed.ops.op_builder.builder", "op_builder.builder")
_VERSION_INFO_MODULE = "deepspeed.git_version_info"
_installed = False


def _ops():
    import deepnvme
    return deepnvme


def _patch_builder_class(cls):
    name = cls.__dict__.get("NAME")
    if name not in ("async_io", "pin_memory", "gds"):
        return

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
    cls.load = load
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
        for name in ("async_io", "pin_memory", "gds"):
            installed[name] = True


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
