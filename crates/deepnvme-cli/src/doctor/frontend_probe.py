# Run by `deepnvme doctor` (crates/deepnvme-cli/src/doctor/frontend.rs) in
# the Python it checks, followed in the same interpreter by config_probe.py
# and a line that prints `out`: a marker then a JSON object. This part
# records versions, the deepnvme package, the DeepSpeed hook, which front
# end deepnvme.choose_frontend() picks and why, what DeepSpeed's
# AsyncIOBuilder then loads, and GPUDirect Storage as a process with torch
# loaded sees it. Each step's failure is recorded under "<key>_error";
# nothing raises.
import glob
import importlib.util
import json
import os
import site
import sys

MARKER = "DEEPNVME-DOCTOR-JSON:"
out = {"python": sys.version.split()[0], "executable": sys.executable, "prefix": sys.prefix}


def attempt(key, fn):
    try:
        out[key] = fn()
    except BaseException as error:  # a probe reports, it never dies
        out[key + "_error"] = f"{type(error).__name__}: {error}"


def version(dist):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


for dist in ("torch", "deepspeed", "numpy", "pybind11"):
    out[dist] = version(dist)
names = ("DEEPNVME_FRONTEND", "DEEPNVME_OPS", "DEEPNVME_DEEPSPEED_HOOK", "DEEPNVME_CUFILE_LIB")
out["env"] = {k: os.environ[k] for k in names if k in os.environ}

dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(d)]


def hook_files():
    found = []
    for d in dirs:
        for path in glob.glob(os.path.join(d, "*.pth")):
            with open(path) as f:
                if "deepnvme._deepspeed_hook" in f.read():
                    found.append(path)
    return found


attempt("hook_pth", hook_files)
hook = sys.modules.get("deepnvme._deepspeed_hook")
out["hook_installed"] = bool(hook is not None and getattr(hook, "_installed", False))
# The libcufile pip's CUDA packages put next to torch (nvidia/cu13/lib, nvidia/cufile/lib).
out["cufile_candidates"] = sorted(p for d in dirs for p in glob.glob(os.path.join(d, "nvidia", "*", "lib", "libcufile.so*"))
                                  if not os.path.basename(p).startswith("libcufile_rdma"))

if importlib.util.find_spec("deepnvme") is None:
    out["deepnvme"] = None
else:
    import deepnvme

    out["deepnvme"] = getattr(deepnvme, "__version__", "?")
    out["deepnvme_dir"] = os.path.dirname(os.path.abspath(deepnvme.__file__))
    out["compiled_installed"] = all(importlib.util.find_spec(f"deepnvme.{op}") is not None for op in deepnvme.OPS)
    attempt("build_info", deepnvme.build_info)
    attempt("provided_ops", lambda: list(deepnvme.provided_ops()))
    attempt("torch_abi", deepnvme.torch_abi)
    # The package's own test of the compiled modules against this torch
    # (what choose_frontend consults when DEEPNVME_FRONTEND is unset).
    attempt("mismatch", deepnvme._compiled_mismatch)
    attempt("choice", lambda: list(deepnvme.choose_frontend()))
    attempt("engine", lambda: deepnvme.native().engine_name())
    attempt("io_uring_unavailable", lambda: deepnvme.native().io_uring_unavailable_reason())
    if out.get("torch"):
        attempt("torch_import", lambda: __import__("torch").__version__)
    attempt("gds_unavailable", lambda: deepnvme.native().gds_unavailable_reason())
    if out.get("deepspeed"):
        def deepspeed_loads():
            from deepspeed.ops.op_builder import AsyncIOBuilder

            module = AsyncIOBuilder().load()
            return {"name": module.__name__, "file": getattr(module, "__file__", None)}

        attempt("deepspeed_loads", deepspeed_loads)

