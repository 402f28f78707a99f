"""The PEP 517 build backend of the deepnvme wheel (pyproject.toml): maturin,
plus the `deepnvme` CLI binary.

Why a step of its own: maturin builds one Rust artifact per wheel (here the
pyo3 module `deepnvme._native`), and the wheel must also carry the CLI
(`crates/deepnvme-cli`), so that `pip install deepnvme` gives a DeepSpeed
user `deepnvme doctor` with no Rust toolchain. The CLI ships as the one
binary the checkout builds, behind a console script (`deepnvme.__main__`),
so its output and exit codes are the cargo-built binary's by construction.

Both are linked by zig against glibc 2.17 (manylinux2014, what older
training clusters can install): maturin with `--zig`, the CLI with
cargo-zigbuild (the same zig, from the `ziglang` package). Both stripped.
`MATURIN_PEP517_ARGS` still overrides maturin's arguments.
"""

import gzip
import io
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import maturin
from maturin import (  # noqa: F401  (the hooks this backend passes through as they are)
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

ROOT = Path(__file__).resolve().parents[2]
CLI_PACKAGE = "deepnvme-cli"
CLI_NAME = "deepnvme"
#: Where the package expects the binary (deepnvme/__main__.py).
CLI_DEST = ROOT / "bindings" / "deepnvme" / "_bin" / CLI_NAME
#: manylinux2014's glibc: the oldest the wheel's symbols may need.
GLIBC = "2.17"
MATURIN_ARGS = "--zig --compatibility manylinux2014 --strip"


def _log(msg):
    print(f"deepnvme build: {msg}", file=sys.stderr, flush=True)


def _target():
    return f"{platform.machine()}-unknown-linux-gnu"


def _tool(name):
    """A console script of the build environment (pip puts build isolation's
    scripts on PATH; look beside this interpreter too)."""
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    if found is None:
        raise RuntimeError(f"{name} is not installed in the build environment (pip install {name})")
    return found


def _zig_env():
    """PATH with the `zig` of the `ziglang` package first, for cargo-zigbuild."""
    import ziglang

    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(ziglang.__file__), env.get("PATH", "")])
    return env


def build_cli():
    """Builds the CLI for glibc 2.17, stripped, into CLI_DEST; returns it."""
    target = _target()
    env = _zig_env()
    # Stripped like the module (maturin --strip); no debug info to strip.
    env["CARGO_PROFILE_RELEASE_STRIP"] = "symbols"
    env["CARGO_PROFILE_RELEASE_DEBUG"] = "0"
    cmd = [_tool("cargo-zigbuild"), "build", "--release", "--locked", "-p", CLI_PACKAGE, "--bin", CLI_NAME,
           "--target", f"{target}.{GLIBC}"]
    _log(" ".join(cmd))
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target_dir.is_absolute():
        target_dir = ROOT / target_dir
    built = target_dir / target / "release" / CLI_NAME
    CLI_DEST.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, CLI_DEST)
    os.chmod(CLI_DEST, 0o755)
    _log(f"CLI: {CLI_DEST} ({CLI_DEST.stat().st_size} bytes)")
    return CLI_DEST


def _maturin_defaults():
    os.environ.setdefault("MATURIN_PEP517_ARGS", MATURIN_ARGS)


def build_sdist(sdist_directory, config_settings=None):
    """maturin's sdist, with the workspace manifest as it is in the checkout:
    maturin keeps only the workspace members the module's crate depends on,
    which drops the CLI (crates/deepnvme-cli, which depends on the core, not
    the other way round), and a wheel built from the sdist must build it."""
    name = maturin.build_sdist(sdist_directory, config_settings)
    path = Path(sdist_directory) / name
    manifest = (ROOT / "Cargo.toml").read_bytes()
    out = io.BytesIO()
    with tarfile.open(path, "r:gz") as src, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        top = src.getmembers()[0].name.split("/")[0]
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name == f"{top}/Cargo.toml":
                data = manifest
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    # mtime 0: the same sources give the same file, as maturin's does.
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(out.getvalue())
    _log(f"sdist: {path} (the workspace manifest keeps {CLI_PACKAGE})")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_cli()
    _maturin_defaults()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build_cli()
    _maturin_defaults()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    return maturin.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return maturin.prepare_metadata_for_build_editable(metadata_directory, config_settings)
