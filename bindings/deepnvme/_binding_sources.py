"""Locates DeepSpeed's own pybind binding files in the installed `deepspeed`
package, checks them against the hashes this build was written for, and
copies them byte-for-byte into a build directory.

The copy matters: a quoted ``#include "x.h"`` searches the including file's
own directory first, so compiling the file where it lies would pick up
DeepSpeed's C++ headers instead of ours (cpp/include).

No DeepSpeed code is kept in this repository; it is read from the installed
package at build time. Imports nothing heavy (no torch, no deepspeed).
"""

import hashlib
import importlib.util
import os
from pathlib import Path

# name -> (path under deepspeed/ops/csrc, sha256 in deepspeed 0.19.8)
BINDING_FILES = {
    "async_io": ("aio/py_lib/py_ds_aio.cpp", "24b5802ea9c215f8f5f0e9d69a606b29e52bb434bb1a46c839bdebc29bd81e31"),
    "gds": ("gds/py_lib/py_ds_gds.cpp", "db05f2b642fb76a210bb00f29b905771ddbdb28603b551ede2143dede5f05b69"),
    "pin_memory": ("pin_memory/py_ds_pin_memory.cpp", "9dcc085542774d07339cf791f16b45e59c9566d6f561e429dcb520088c4edff1"),
}

# Set to 1 to build against binding files whose hashes differ (another
# DeepSpeed version). The build then warns instead of stopping.
ACCEPT_ENV = "DEEPNVME_ACCEPT_BINDING_HASHES"


def deepspeed_csrc():
    """deepspeed/ops/csrc of the installed deepspeed package."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("deepnvme: the `deepspeed` package is not installed in this environment; "
                           "install it first (pip install deepspeed==0.19.8)")
    root = Path(list(spec.submodule_search_locations)[0]) / "ops" / "csrc"
    if not root.is_dir():
        raise RuntimeError(f"deepnvme: {root} does not exist; this deepspeed install ships no C++ sources")
    return root


def sha256_of(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def checked_binding(op, log=print):
    """(file name, bytes) of op's binding file in the installed deepspeed,
    after checking its hash (DEEPNVME_ACCEPT_BINDING_HASHES=1: warn instead)."""
    rel, expected = BINDING_FILES[op]
    src = deepspeed_csrc() / rel
    if not src.is_file():
        raise RuntimeError(f"deepnvme: {src} is missing from the installed deepspeed")
    data = src.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        msg = (f"deepnvme: {src} has sha256 {actual}, but this build was written against {expected} "
               f"(deepspeed 0.19.8)")
        if os.environ.get(ACCEPT_ENV, "") != "1":
            raise RuntimeError(msg + f"; set {ACCEPT_ENV}=1 to try it anyway")
        log(msg + f"; building anyway because {ACCEPT_ENV}=1")
    else:
        log(f"deepnvme: binding file {rel} sha256 {actual} matches deepspeed 0.19.8; compiled unchanged")
    return Path(rel).name, data


def stage_binding_sources(dest_dir, log=print):
    """Copies each binding file into dest_dir/<op>/ after checking its hash.
    Returns {op: copied path}."""
    staged = {}
    for op in BINDING_FILES:
        name, data = checked_binding(op, log=log)
        out_dir = Path(dest_dir) / op
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / name
        out.write_bytes(data)
        if sha256_of(out) != hashlib.sha256(data).hexdigest():
            raise RuntimeError(f"deepnvme: copy of {name} to {out} is not byte-for-byte identical")
        staged[op] = out
    return staged
