"""Copies that hold a stripe set's bytes: ``deepnvme.copy2`` and
``deepnvme.copytree``.

A file deepnvme writes in a stripe set is a placeholder whose bytes are in
member files on the drives (docs/striping.md). ``shutil.copy2`` of one
copies none of them: outside the set the copy reads as zeros, and inside
it, with the mark copied, the copy is a second name for the original's
member files (its bytes change as training rewrites the original).
DeepSpeed's ``save_checkpoint`` and ``load_checkpoint`` copy the optimizer's
NVMe swap files into the checkpoint and back with ``shutil.copytree``
(ZeRO-Infinity optimizer offload); so once DeepSpeed's engine module is
imported, the hook (_deepspeed_hook) makes ``shutil.copytree`` this
module's ``copytree``, which differs from shutil's only for stripe set
files, and wraps ``DeepSpeedEngine.load_checkpoint`` so that the swap files
it copies back from a checkpoint out of the set are striped again (any
other plain file copied into a set stays plain, readable by anything).
Nothing here imports torch.
"""

import contextlib
import contextvars
import functools
import os
import shutil

# shutil's own, taken before the hook replaces copytree.
_shutil_copy2 = shutil.copy2
_shutil_copytree = shutil.copytree
_STRIPE_MARK = "user.deepnvme.stripe"  # the placeholder's mark; member files' tags add ".owner" (src/stripe/mark.rs)
# True while DeepSpeed's load_checkpoint copies the checkpoint's swap files
# over the engine's: a plain file copied into a stripe set is striped then
# (the swap files must stay on the drives), and only then.
_loading_swap_files = contextvars.ContextVar("deepnvme_loading_swap_files", default=False)


def copy2(src, dst, *, follow_symlinks=True):
    """``shutil.copy2``, except that a stripe set's file is copied by its
    logical bytes: when ``src`` is a placeholder or ``dst`` is one (and,
    while DeepSpeed loads a checkpoint's swap files, when ``dst`` lies in a
    set). Outside a set the copy is a plain file, inside one a striped file
    with member files of its own; the stripe mark is never copied. Mode,
    times and other extended attributes are kept as copy2 keeps them;
    errors are ``OSError`` naming the file (``SameFileError`` for a file
    onto itself). Returns ``dst``."""
    target = os.path.join(dst, os.path.basename(src)) if os.path.isdir(dst) else dst
    into_a_set = _loading_swap_files.get()
    if (follow_symlinks or not os.path.islink(src)) and (into_a_set or _marked(src) or _marked(target)):
        native = _native_or_none(src, target)
        if native is not None:
            if os.path.exists(target) and os.path.samefile(src, target):
                raise shutil.SameFileError(f"{src!r} and {target!r} are the same file")
            if native.copy_striped(os.fsdecode(src), os.fsdecode(target), into_a_set) is not None:
                _copy_other_xattrs(src, target)
                return target
    return _shutil_copy2(src, dst, follow_symlinks=follow_symlinks)


def _marked(path):
    """Whether the file at path carries a stripe mark (one getxattr)."""
    try:
        os.getxattr(path, _STRIPE_MARK)
        return True
    except OSError:
        return False


def _native_or_none(src, dst):
    """The core's module; None where it does not load and neither file is
    marked (then nothing striped is involved)."""
    try:
        from deepnvme import native

        return native()
    except ImportError as error:
        for path in (src, dst):
            if _marked(path):
                raise OSError(f"{os.fsdecode(path)} is a stripe set's file, and deepnvme's core, which copies its "
                              f"bytes, does not load: {error}") from error
        return None


def _copy_other_xattrs(src, dst):
    """Extended attributes of src but deepnvme's own, as copy2 copies them
    (an attribute the destination refuses is skipped, as there)."""
    try:
        names = os.listxattr(src)
    except OSError:
        return
    for name in names:
        if name.startswith(_STRIPE_MARK):
            continue
        try:
            os.setxattr(dst, name, os.getxattr(src, name))
        except OSError:
            pass


def copytree(src, dst, symlinks=False, ignore=None, copy_function=_shutil_copy2, ignore_dangling_symlinks=False,
             dirs_exist_ok=False):
    """``shutil.copytree``, with ``deepnvme.copy2`` in place of
    ``shutil.copy2`` (the default copy function, or given); another copy
    function is used as it is."""
    if copy_function is _shutil_copy2:
        copy_function = copy2
    return _shutil_copytree(src, dst, symlinks=symlinks, ignore=ignore, copy_function=copy_function,
                            ignore_dangling_symlinks=ignore_dangling_symlinks, dirs_exist_ok=dirs_exist_ok)


def install_for_deepspeed(engine_module):
    """Makes ``shutil.copytree`` this module's, so that the copies DeepSpeed's
    engine makes of its swap files hold their bytes, and marks the engine's
    ``load_checkpoint`` as the time plain files copied into a set are
    striped (called by the hook when ``deepspeed.runtime.engine`` is
    imported)."""
    if shutil.copytree is not copytree:
        shutil.copytree = copytree
    engine = getattr(engine_module, "DeepSpeedEngine", None)
    load = getattr(engine, "load_checkpoint", None)
    if load is None or getattr(load, "_deepnvme_loads_swap_files", False):
        return

    @functools.wraps(load)
    def load_checkpoint(*args, **kwargs):
        with _loading():
            return load(*args, **kwargs)

    load_checkpoint._deepnvme_loads_swap_files = True
    engine.load_checkpoint = load_checkpoint


@contextlib.contextmanager
def _loading():
    token = _loading_swap_files.set(True)
    try:
        yield
    finally:
        _loading_swap_files.reset(token)
