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
files. Nothing here imports torch.
"""

import functools
import os
import shutil

# shutil's own, taken before the hook replaces copytree.
_shutil_copy2 = shutil.copy2
_shutil_copytree = shutil.copytree
_STRIPE_ATTRIBUTES = "user.deepnvme.stripe"  # the mark and the member owner tag (src/stripe/mark.rs)


def copy2(src, dst, *, follow_symlinks=True):
    """``shutil.copy2``, except that a stripe set's file (``src``, or a
    placeholder at ``dst``) is copied by its logical bytes: outside a set
    the copy is a plain file, inside one a striped file with member files
    of its own; the stripe mark is never copied. Mode, times and other
    extended attributes are kept as copy2 keeps them. Returns ``dst``."""
    if os.path.isdir(dst):
        dst = os.path.join(dst, os.path.basename(src))
    if follow_symlinks or not os.path.islink(src):
        from deepnvme import native

        if native().copy_striped(src, dst) is not None:
            _copy_other_xattrs(src, dst)
            return dst
    return _shutil_copy2(src, dst, follow_symlinks=follow_symlinks)


def _copy_other_xattrs(src, dst):
    """Extended attributes of src but deepnvme's own, as copy2 copies them
    (an attribute the destination refuses is skipped, as there)."""
    try:
        names = os.listxattr(src)
    except OSError:
        return
    for name in names:
        if name.startswith(_STRIPE_ATTRIBUTES):
            continue
        try:
            os.setxattr(dst, name, os.getxattr(src, name))
        except OSError:
            pass


@functools.wraps(_shutil_copytree)
def copytree(src, dst, symlinks=False, ignore=None, copy_function=_shutil_copy2, ignore_dangling_symlinks=False,
             dirs_exist_ok=False):
    """``shutil.copytree`` whose default copy function is ``deepnvme.copy2``
    (a copy function given is used as it is)."""
    if copy_function is _shutil_copy2:
        copy_function = copy2
    return _shutil_copytree(src, dst, symlinks=symlinks, ignore=ignore, copy_function=copy_function,
                            ignore_dangling_symlinks=ignore_dangling_symlinks, dirs_exist_ok=dirs_exist_ok)


def install_for_deepspeed():
    """Makes ``shutil.copytree`` this module's, so that the copies DeepSpeed's
    engine makes of its swap files hold their bytes (called by the hook when
    ``deepspeed.runtime.engine`` is imported; once)."""
    if shutil.copytree is not copytree:
        shutil.copytree = copytree
