"""A throwaway copy of the installed deepspeed whose op builders are
redirected to deepnvme.op_builder by the lines docs/deepspeed-compatibility.md
proposes for DeepSpeed ("OpBuilder"), appended to DeepSpeed's builder files.

The copy lives where the caller says (outside the repository); put its
folder first on PYTHONPATH, with DEEPNVME_DEEPSPEED_HOOK=0 so that what runs
is the redirected builders, not deepnvme's import hook.

    python tests/python/_deepspeed_copy.py DEST     # makes DEST/deepspeed
"""

import importlib.util
import os
import shutil
import sys

# The block proposed for the end of each builder file; {cls} is the file's
# builder class. Exactly this text is in docs/deepspeed-compatibility.md.
PROPOSAL = '''
# DeepNVMe on deepnvme's Rust core (no libaio) where deepnvme is installed; DS_DEEPNVME=0 keeps this builder.
try:
    from deepnvme.op_builder import builder_class as _deepnvme_builder_class
except ImportError:
    _deepnvme_builder_class = None
if _deepnvme_builder_class is not None and __import__("os").environ.get("DS_DEEPNVME", "1") != "0":
    from . import builder as _ds_builder
    {cls} = _deepnvme_builder_class({cls}.NAME, _ds_builder.OpBuilder)
'''

# DeepSpeed's files that define the DeepNVMe builders (cpu/async_io.py is the
# CPU accelerator's; cpu/pin_memory.py re-exports pin_memory.py's).
REDIRECTED = {
    "ops/op_builder/async_io.py": "AsyncIOBuilder",
    "ops/op_builder/cpu/async_io.py": "AsyncIOBuilder",
    "ops/op_builder/pin_memory.py": "PinMemoryBuilder",
    "ops/op_builder/gds.py": "GDSBuilder",
}


def installed_deepspeed():
    """The installed deepspeed package folder (found without importing it)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("deepspeed is not installed in this environment")
    return list(spec.submodule_search_locations)[0]


def make_copy(dest_site):
    """Copies the installed deepspeed into dest_site/deepspeed and appends
    the proposal to each builder file; returns the copy's folder."""
    src = installed_deepspeed()
    dest = os.path.join(dest_site, "deepspeed")
    if os.path.realpath(src) == os.path.realpath(dest):
        raise SystemExit(f"{dest} is the installed deepspeed itself")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, cls in REDIRECTED.items():
        path = os.path.join(dest, rel)
        with open(path) as f:
            text = f.read()
        if f"class {cls}(" not in text:
            raise SystemExit(f"{path} no longer defines {cls}; the proposal needs revisiting")
        with open(path, "a") as f:
            f.write(PROPOSAL.format(cls=cls))
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} DEST")
    print(make_copy(sys.argv[1]))
