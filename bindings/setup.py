"""Builds and installs the `deepnvme` Python package: DeepSpeed's DeepNVMe
ops (async_io, pin_memory, gds) backed by the Rust core.

    pip install --no-build-isolation ./bindings

(into an environment that already has torch and deepspeed; build isolation
would download a second torch just to compile against). Steps:

1. cargo builds the Rust core, its cxx bridge and the pyo3 front end as one
   static library (`cargo rustc --crate-type staticlib --features python,ffi`).
2. `deepnvme._native` is that library alone, linked by plain setuptools into
   ONE shared object: no torch in its NEEDED list, no torch header in its
   build. It is the only copy of the core in the process, so the
   pinned-memory manager and the engines are process-wide whatever order the
   extensions load in, and it imports without torch.
3. `deepnvme/libdeepnvme_pin.so` is the pinned manager's torch front
   (cpp/src/pin_tensor.cc, tensor_info.cc: deepspeed_pin_tensor_t and
   DeepSpeed's deepspeed_pin_tensor_mgr_holder), linked against _native;
   `deepnvme/libdeepnvme_torch.so` is the rest of the torch glue in cpp/src,
   linked against both (torch CppExtensions, not Python modules). The split
   keeps what DeepSpeed's RTLD_GLOBAL load of pin_memory makes global down
   to the pinned front (see cpp/src/pin_tensor.cc).
4. DeepSpeed's binding files are copied byte-for-byte from the installed
   deepspeed package (hashes checked and printed) and compiled unchanged
   against cpp/include into deepnvme.async_io, deepnvme.pin_memory and
   deepnvme.gds: pin_memory linked against libdeepnvme_pin.so alone, the
   others against the glue and libdeepnvme_pin.so (and through them, _native).
   cpp/include is installed as deepnvme/include for third-party C++
   (deepnvme.include_dir(), deepnvme.library_dir()).
5. A .pth file makes DeepSpeed's own op builders return these modules
   (see deepnvme/_deepspeed_hook.py); no DeepSpeed file is edited.
6. For deepnvme.op_builder (DeepSpeed-style builders that compile the ops
   against the running torch, JIT or ahead of time, and link this _native):
   cpp/src as deepnvme/csrc, the cxx bridge headers as
   deepnvme/include/cxxbridge, and their hash in deepnvme/_core.json.
"""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as plain_build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _build_module(name):
    """One of this checkout's build helpers (standalone modules), loaded by
    path: `import deepnvme` here would find the installed package instead,
    which the .pth hook has already imported when this is an upgrade."""
    spec = importlib.util.spec_from_file_location(f"_deepnvme_setup_{name}", HERE / "deepnvme" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stage_binding_sources = _build_module("_binding_sources").stage_binding_sources
_core_build = _build_module("_core_build")
BRIDGE_HEADER, CORE_INFO, NATIVE_FILE, NATIVE_LIBRARIES = (
    _core_build.BRIDGE_HEADER, _core_build.CORE_INFO, _core_build.NATIVE_FILE, _core_build.NATIVE_LIBRARIES)
bridge_sha256, cargo_build, core_link_args, write_version_script = (
    _core_build.bridge_sha256, _core_build.cargo_build, _core_build.core_link_args, _core_build.write_version_script)

# The torch glue: a plain shared library in the package folder (no PyInit).
GLUE_EXT = "deepnvme._torch_glue"
GLUE_FILE = "libdeepnvme_torch.so"
# The pinned manager's torch front: its own library (what DeepSpeed's
# RTLD_GLOBAL load of pin_memory may make global), with these sources.
PIN_EXT = "deepnvme._pin_glue"
PIN_FILE = "libdeepnvme_pin.so"
PIN_SOURCES = ("pin_tensor.cc", "tensor_info.cc")
OPS = ("async_io", "pin_memory", "gds")
CXX_FLAGS = ["-std=c++20", "-O2", "-g0", "-Wno-deprecated-declarations"]
HOOK_PTH = "deepnvme-deepspeed.pth"


def log(msg):
    print(msg, flush=True)


def glue_version_script(build_temp):
    """The glue exports the classes and functions DeepSpeed's binding files
    call; torch and the bridge helpers stay local."""
    return write_version_script(build_temp, "deepnvme_torch_glue.map", """    extern "C++" {
      *deepspeed_*;
      *io_op_desc_t*;
      *cpu_op_desc_t*;
      warn_consumer_ssd_writes*;
    };
""")


def pin_version_script(build_temp):
    """libdeepnvme_pin.so exports deepspeed_pin_tensor_t's members, DeepSpeed's
    holder symbol and the tensor description the rest of the glue reuses;
    nothing that could clash with a class DeepSpeed's stock ops define."""
    return write_version_script(build_temp, "deepnvme_pin.map", """    deepspeed_pin_tensor_mgr_holder;
    extern "C++" {
      deepspeed_pin_tensor_t::*;
      deepnvme::describe_tensor*;
    };
""")


def make_extensions():
    from torch.utils.cpp_extension import CppExtension

    cpp = ROOT / "cpp"
    # The Rust core alone: its objects come from the static library (added
    # by BuildDeepNVMe once cargo has built it). Linked with the C++ driver
    # for libstdc++ (the cxx bridge is C++); nothing of torch.
    native = Extension(
        name="deepnvme._native",
        sources=[],
        language="c++",
        libraries=NATIVE_LIBRARIES,
    )
    pin = CppExtension(
        name=PIN_EXT,
        sources=[str(cpp / "src" / f) for f in PIN_SOURCES],
        include_dirs=[str(cpp / "include"), str(cpp / "src")],
        extra_compile_args={"cxx": CXX_FLAGS},
        libraries=[f":{NATIVE_FILE}"],
    )
    glue = CppExtension(
        name=GLUE_EXT,
        sources=sorted(str(p) for p in (cpp / "src").glob("*.cc") if p.name not in PIN_SOURCES),
        include_dirs=[str(cpp / "include"), str(cpp / "src")],
        extra_compile_args={"cxx": CXX_FLAGS},
        libraries=[f":{NATIVE_FILE}", f":{PIN_FILE}"],
    )
    ops = [
        CppExtension(
            name=f"deepnvme.{op}",
            sources=[],  # filled in by BuildDeepNVMe with the staged binding file
            include_dirs=[str(cpp / "include")],
            extra_compile_args={"cxx": CXX_FLAGS},
            libraries=[f":{PIN_FILE}"] if op == "pin_memory" else [f":{GLUE_FILE}", f":{PIN_FILE}"],
            extra_link_args=["-Wl,-rpath,$ORIGIN"],
        )
        for op in OPS
    ]
    return [native, pin, glue] + ops


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    class BuildDeepNVMe(BuildExtension):
        """Builds the Rust core first, then _native (plain setuptools), then
        the torch glue, then the DeepSpeed ops."""

        def get_ext_filename(self, fullname):
            # The glue libraries are what the ops link against, not Python modules.
            for ext, file in ((GLUE_EXT, GLUE_FILE), (PIN_EXT, PIN_FILE)):
                if fullname in (ext, ext.split(".")[-1]):
                    return os.path.join(*fullname.split(".")[:-1], file)
            return super().get_ext_filename(fullname)

        def build_extensions(self):
            staticlib, cxx_include = cargo_build(ROOT, log=log)
            staged = stage_binding_sources(Path(self.build_temp) / "deepspeed-bindings", log=log)
            native_dir = str(Path(self.get_ext_fullpath("deepnvme._native")).parent)
            ship_bridge_headers(cxx_include, Path(native_dir))
            for ext in self.extensions:
                if ext.name == "deepnvme._native":
                    ext.extra_objects = [staticlib]
                    ext.extra_link_args = core_link_args(self.build_temp, staticlib)
                elif ext.name == PIN_EXT:
                    ext.include_dirs.append(cxx_include)
                    ext.library_dirs.append(native_dir)
                    # -Bsymbolic-functions: its own calls (shared() from the
                    # holder, alloc's overloads) bind to itself even if some
                    # other global object defines deepspeed_pin_tensor_t too.
                    ext.extra_link_args = [
                        f"-Wl,-soname,{PIN_FILE}",
                        "-Wl,-rpath,$ORIGIN",
                        "-Wl,-Bsymbolic-functions",
                        f"-Wl,--version-script={pin_version_script(self.build_temp)}",
                    ]
                elif ext.name == GLUE_EXT:
                    ext.include_dirs.append(cxx_include)
                    ext.library_dirs.append(native_dir)
                    ext.extra_link_args = [
                        f"-Wl,-soname,{GLUE_FILE}",
                        "-Wl,-rpath,$ORIGIN",
                        f"-Wl,--version-script={glue_version_script(self.build_temp)}",
                    ]
                else:
                    op = ext.name.split(".")[-1]
                    ext.sources = [str(staged[op])]
                    ext.library_dirs.append(native_dir)
                    ext.extra_link_args.append(f"-Wl,-rpath-link,{native_dir}")
            # _native first, with setuptools' own build_ext (torch's adds
            # torch flags); then the pinned front and the glue, which link
            # against it (in that order: the glue links the front); then the
            # three ops in parallel: each is one slow torch translation unit.
            # torch's ninja build writes one build.ninja per build directory,
            # so parallel extensions must not use it: the ops are compiled
            # directly (one file each), with the compiler's plain compile.
            everything = self.extensions
            plain_compile = self.compiler.compile
            try:
                self.extensions = [e for e in everything if e.name == "deepnvme._native"]
                plain_build_ext.build_extensions(self)
                for name in (PIN_EXT, GLUE_EXT):
                    self.extensions = [e for e in everything if e.name == name]
                    super().build_extensions()
                self.extensions = [e for e in everything if e.name not in ("deepnvme._native", PIN_EXT, GLUE_EXT)]
                self.compiler.compile = plain_compile
                self.use_ninja = False
                self.parallel = max(1, min(len(self.extensions), os.cpu_count() or 1))
                super().build_extensions()
            finally:
                self.extensions = everything

    return BuildDeepNVMe


def ship_bridge_headers(cxx_include, package_dir):
    """The cxx bridge's headers as deepnvme/include/cxxbridge, and their hash
    in deepnvme/_core.json: what deepnvme.op_builder compiles the shims
    against to link this _native (the bridge is this core's C++ ABI)."""
    dest = package_dir / "include" / "cxxbridge"
    if dest.exists():
        shutil.rmtree(dest)
    # cxx-build's include tree is made of symlinks; the package must hold files.
    for rel in (BRIDGE_HEADER, Path("rust") / "cxx.h"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(cxx_include) / rel, dest / rel)
    info = {"native": NATIVE_FILE, "bridge_sha256": bridge_sha256(dest)}
    (package_dir / CORE_INFO).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    log(f"deepnvme: shipped the bridge headers ({info['bridge_sha256'][:12]}) for deepnvme.op_builder")


class BuildPyWithHook(build_py):
    """Also installs the .pth that hooks DeepSpeed's op builders, at the root
    of site-packages (where Python reads .pth files), cpp/include as
    deepnvme/include (deepnvme.include_dir(), for third-party C++) and the
    torch shims cpp/src as deepnvme/csrc (deepnvme.op_builder's sources)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / HOOK_PTH
        target.write_text((HERE / HOOK_PTH).read_text())
        include = Path(self.build_lib) / "deepnvme" / "include"
        include.mkdir(parents=True, exist_ok=True)
        for header in sorted((ROOT / "cpp" / "include").glob("*.h")):
            (include / header.name).write_text(header.read_text())
        csrc = Path(self.build_lib) / "deepnvme" / "csrc"
        csrc.mkdir(parents=True, exist_ok=True)
        for shim in sorted((ROOT / "cpp" / "src").iterdir()):
            if shim.suffix in (".cc", ".h"):
                (csrc / shim.name).write_text(shim.read_text())
        write_build_info(Path(self.build_lib) / "deepnvme" / "_build_info.json")


def write_build_info(path):
    """Records the torch (version and pybind11 ABI) the compiled modules are
    built against; at load, deepnvme compares it with the running torch and
    gives DeepSpeed the pyo3 front end on a mismatch (deepnvme.choose_frontend)."""
    import importlib.util

    # This checkout's deepnvme/__init__.py, not an installed deepnvme (which
    # the .pth of an earlier install has already imported).
    spec = importlib.util.spec_from_file_location("_deepnvme_being_built", HERE / "deepnvme" / "__init__.py")
    source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(source)
    info = source.torch_abi()
    if info is None:
        raise RuntimeError("deepnvme: the compiled modules need torch at build time")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    log(f"deepnvme: built for {info}")


def project_metadata():
    """The package's metadata from the one definition, the root
    pyproject.toml's [project] table (the wheel's build reads it too). The
    console script is left out: this build ships no CLI binary (`cargo run
    -- doctor` from the checkout; `python -m deepnvme` says so)."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            log("deepnvme: no tomllib/tomli: building with the name and description only")
            return {"name": "deepnvme", "description": "DeepSpeed DeepNVMe ops backed by a Rust core",
                    "python_requires": ">=3.9"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        "name": project["name"],
        "description": project["description"],
        "long_description": (ROOT / project["readme"]).read_text(),
        "long_description_content_type": "text/markdown",
        "keywords": project.get("keywords", []),
        "classifiers": project.get("classifiers", []),
        "project_urls": project.get("urls", {}),
        "url": project.get("urls", {}).get("Homepage"),
        "license": project["license"],
        "python_requires": project["requires-python"],
    }


def main():
    setup(
        version=_core_build.cargo_package_version(ROOT / "Cargo.toml"),
        **project_metadata(),
        packages=["deepnvme"],
        ext_modules=make_extensions(),
        cmdclass={"build_ext": build_ext_class(), "build_py": BuildPyWithHook},
        zip_safe=False,
    )


if __name__ == "__main__":
    main()
