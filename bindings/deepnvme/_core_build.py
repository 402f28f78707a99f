"""Building the Rust core as the one shared object every op links: cargo's
static library, then ``_native`` linked from it alone, exporting
``PyInit__native`` and the C++ side of the cxx bridge and nothing of Rust's.

Used by bindings/setup.py (the install) and by deepnvme.op_builder (a source
checkout that has no built core yet). Imports nothing heavy (no torch).
"""

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

NATIVE_FILE = "_native" + sysconfig.get_config_var("EXT_SUFFIX")
# The libraries _native needs besides libstdc++ (the bridge is C++).
NATIVE_LIBRARIES = ["pthread", "dl", "rt", "m", "util"]
# The generated bridge header, under the cxx include folder.
BRIDGE_HEADER = Path("deepnvme") / "src" / "ffi.rs.h"
# Written next to _native by an install whose core carries the bridge (the
# wheel's pyo3-only core has none): the bridge header's hash, so a JIT build
# can tell that the headers it compiles against are this core's.
CORE_INFO = "_core.json"

# A machine without Rust (e.g. a GPU box that cannot reach crates.io) can use
# a core built elsewhere for the same architecture: a folder holding
# libdeepnvme.a and cxxbridge/include (see tests/gpu/stage-core.sh).
PREBUILT_CORE_ENV = "DEEPNVME_PREBUILT_CORE"


def _log(msg):
    print(msg, flush=True)


def cargo_build(root, log=_log):
    """Builds the Rust static library of the checkout at `root`; returns
    (path to .a, cxx include dir)."""
    prebuilt = os.environ.get(PREBUILT_CORE_ENV)
    if prebuilt:
        staticlib = Path(prebuilt) / "libdeepnvme.a"
        include = Path(prebuilt) / "cxxbridge" / "include"
        if not staticlib.is_file() or not (include / BRIDGE_HEADER).is_file():
            raise RuntimeError(f"deepnvme: {PREBUILT_CORE_ENV}={prebuilt} lacks libdeepnvme.a or cxxbridge/include")
        log(f"deepnvme: using the prebuilt Rust core in {prebuilt}")
        return str(staticlib), str(include)
    env = dict(os.environ)
    env.setdefault("PYO3_PYTHON", sys.executable)
    cmd = [
        "cargo", "rustc", "--release", "--lib",
        "--manifest-path", str(Path(root) / "Cargo.toml"),
        "--features", "python,ffi",
        "--crate-type", "staticlib",
        "--message-format", "json-render-diagnostics",
    ]
    log("deepnvme: " + " ".join(cmd))
    proc = subprocess.run(cmd, env=env, cwd=root, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"deepnvme: cargo failed with exit code {proc.returncode}")
    staticlib = None
    out_dir = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        pkg = msg.get("package_id", "")
        if "deepnvme" not in pkg:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "deepnvme":
            for f in msg.get("filenames", []):
                if f.endswith(".a"):
                    staticlib = f
        elif msg.get("reason") == "build-script-executed":
            out_dir = msg.get("out_dir")
    if staticlib is None or out_dir is None:
        raise RuntimeError("deepnvme: cargo did not report the static library or the cxx bridge headers")
    include = Path(out_dir) / "cxxbridge" / "include"
    log(f"deepnvme: Rust core {staticlib}; cxx headers {include}")
    return staticlib, str(include)


def archive_symbols(path):
    """The global symbols an ar archive defines, read from its symbol index
    (GNU "/" or "/SYM64/" member): no binutils needed."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise RuntimeError(f"deepnvme: {path} is not an ar archive")
        header = f.read(60)
        name = header[:16].decode().strip()
        size = int(header[48:58].decode().strip())
        if name not in ("/", "/SYM64/"):
            raise RuntimeError(f"deepnvme: {path} has no symbol index (run ranlib)")
        data = f.read(size)
    width = 8 if name == "/SYM64/" else 4
    count = struct.unpack(">Q" if width == 8 else ">I", data[:width])[0]
    names = data[width * (count + 1):].split(b"\0")[:count]
    return {n.decode() for n in names}


# The C++ symbols of the cxx bridge (deepnvme::ffi::*, the functions Rust
# implements) and of cxx's runtime (rust::cxxbridge1::*: Box, Slice, Error, ...),
# including their vtables and typeinfo; not Rust's own legacy-mangled
# symbols (which end in a 17h<hash>E).
CORE_CXX_SYMBOL = re.compile(r"^_Z(?:T[VIS])?NK?(?:4rust10cxxbridge1|8deepnvme3ffi)")
RUST_HASH = re.compile(r"17h[0-9a-f]{16}E")


def core_exports(staticlib):
    """What _native exports: PyInit__native for Python, and the bridge's C++
    side for the torch glue. Everything else (Rust, the extern "C" shims
    between the two halves of the bridge) stays local."""
    symbols = sorted(
        s for s in archive_symbols(staticlib) if CORE_CXX_SYMBOL.match(s) and not RUST_HASH.search(s)
    )
    if not any(s.startswith("_ZN8deepnvme3ffi") for s in symbols):
        raise RuntimeError(f"deepnvme: {staticlib} holds no cxx bridge (deepnvme::ffi); was it built with --features python,ffi?")
    return ["PyInit__native"] + symbols


def write_version_script(build_temp, name, globals_text):
    path = Path(build_temp) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{\n  global:\n" + globals_text + "  local: *;\n};\n")
    return str(path)


def core_link_args(build_temp, staticlib):
    """_native: exactly the listed symbols exported (each also forced in from
    the archive, which has no other root), bound to themselves."""
    exports = core_exports(staticlib)
    script = write_version_script(build_temp, "deepnvme_native.map", "".join(f"    {s};\n" for s in exports))
    return [
        f"-Wl,-soname,{NATIVE_FILE}",
        *(f"-Wl,--undefined={s}" for s in exports),
        f"-Wl,--version-script={script}",
        "-Wl,-Bsymbolic",
        "-Wl,-z,now",
    ]


def link_native(staticlib, out_dir, build_temp, log=_log):
    """Links _native from the static library alone into `out_dir` with the C++
    driver, as setup.py's plain setuptools link does; returns its path."""
    out = Path(out_dir) / NATIVE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "c++")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [cxx, "-shared", "-fPIC", "-o", str(tmp), *core_link_args(build_temp, staticlib), str(staticlib),
           *(f"-l{lib}" for lib in NATIVE_LIBRARIES)]
    log("deepnvme: " + " ".join(cmd[:6]) + " ...")
    subprocess.run(cmd, check=True)
    os.replace(tmp, out)  # never a half-written core where a loader might look
    return str(out)


def bridge_sha256(include_dir):
    """sha256 of the generated bridge header in a cxx include folder."""
    return hashlib.sha256((Path(include_dir) / BRIDGE_HEADER).read_bytes()).hexdigest()


def cargo_package_version(cargo_toml):
    """[package] version of a Cargo.toml (the workspace's, which every crate inherits)."""
    section = None
    with open(cargo_toml, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
            elif section in ("package", "workspace.package") and line.replace(" ", "").startswith("version="):
                return line.split("=", 1)[1].strip().strip('"')
    raise ValueError(f"{cargo_toml} has no [package] version")
