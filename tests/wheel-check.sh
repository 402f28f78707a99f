#!/usr/bin/env bash
# The wheel a DeepSpeed user gets from `pip install deepnvme`, end to end;
# every step can fail the run:
#   1. bindings/wheel/build.sh builds it (the root pyproject.toml: maturin
#      --zig for manylinux2014, the CLI built by cargo-zigbuild inside),
#      once per run, with Rust only;
#   2. `auditwheel show` must report manylinux_2_17_x86_64 (glibc 2.17,
#      every ELF file in it: _native and the CLI); _native and the CLI are
#      stripped and _native is under 4 MB; LICENSE, the stubs and py.typed
#      are in it; _native has no libtorch/libc10 (or CUDA library) in NEEDED;
#   3. the sdist builds, carries LICENSE and no perf PNG or Python test;
#   4. a fresh virtual environment (cached per torch/deepspeed version, like
#      bindings/install.sh's) gets torch, deepspeed, pytest and numpy, then
#      the wheel file, with CC=false CXX=false so that nothing can compile;
#      everything after runs with no compiler and no cargo on PATH
#      (cc/gcc/g++/c++ answer "not available", ~/.cargo/bin is not on it);
#   5. there: `pip show` lists the metadata; `deepnvme doctor --json` and
#      `python -m deepnvme info` run (the console script and the module, the
#      shipped binary) and exit as the cargo-built CLI does; mypy's stubtest
#      checks the stubs against the installed module;
#   6. a venv with no torch at all (numpy only) gets the same wheel, and
#      numpy arrays, bytearray, memoryview and mmap round-trip through it;
#   7. the Python suite runs there with DEEPNVME_FRONTEND unset: with no
#      compiled modules DeepSpeed's builders must choose the pyo3 front end
#      by themselves.
# Usage: tests/wheel-check.sh [pytest args...]
# The build venv is $DEEPNVME_VENV (maturin, ziglang, cargo-zigbuild and
# auditwheel are pip-installed into it when missing); the test venv is
# "$DEEPNVME_VENV-wheel-torch<version>".
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
TORCH_VERSION=${DEEPNVME_TORCH_VERSION:-2.15.0}
DEEPSPEED_VERSION=${DEEPNVME_DEEPSPEED_VERSION:-0.19.8}
PYTHON=${PYTHON:-python3}
WHEEL_VENV="$VENV-wheel-torch$TORCH_VERSION-ds$DEEPSPEED_VERSION"
OUT="$ROOT/target/wheels"
cd "$ROOT"

say() { printf '\n== %s\n' "$*"; }

[ -x "$VENV/bin/python" ] || { echo "no build venv at $VENV: run bindings/install.sh first" >&2; exit 1; }
if ! "$VENV/bin/python" -c 'import maturin, ziglang, auditwheel' 2>/dev/null || [ ! -x "$VENV/bin/cargo-zigbuild" ]; then
    say "installing maturin, ziglang, cargo-zigbuild and auditwheel into $VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check "maturin>=1.5,<2" "ziglang>=0.13" \
        "cargo-zigbuild>=0.19" "auditwheel>=6"
fi

say "building the wheel (pyproject.toml: maturin --zig, manylinux2014, the CLI inside)"
rm -f "$OUT"/deepnvme-*.whl
PYTHON="$VENV/bin/python" bindings/wheel/build.sh "$OUT"
WHEEL=$(ls "$OUT"/deepnvme-*.whl)
echo "wheel: $WHEEL"

say "auditwheel show: the wheel must be manylinux_2_17_x86_64 (glibc 2.17)"
"$VENV/bin/auditwheel" show "$WHEEL" | tee "$OUT/auditwheel.txt"
tr -s ' \n' ' ' < "$OUT/auditwheel.txt" | grep -q 'consistent with the following platform tag: "manylinux_2_17_x86_64"' \
    || { echo "FAIL: auditwheel does not report manylinux_2_17_x86_64" >&2; exit 1; }
case "$(basename "$WHEEL")" in
    *-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl) ;;
    *) echo "FAIL: the wheel's tags are not cp39-abi3 manylinux2014/2_17 x86_64: $WHEEL" >&2; exit 1 ;;
esac

say "checking the wheel: abi3, the .pth, stripped, LICENSE and stubs, no torch or CUDA library in NEEDED"
"$VENV/bin/python" - "$WHEEL" <<'PY'
import io, re, sys, tempfile, zipfile, os
sys.path.insert(0, "tests/python")
from _elf import read_dynamic
wheel = sys.argv[1]
assert "-abi3-" in os.path.basename(wheel), wheel
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    assert "deepnvme-deepspeed.pth" in names, names
    assert "deepnvme/frontend.py" in names and "deepnvme/_objects.py" in names, names
    sos = [n for n in names if n.endswith(".so")]
    assert len(sos) == 1 and re.match(r"deepnvme/_native\.abi3\.so$", sos[0]), sos
    for stub in ("__init__.pyi", "frontend.pyi", "_native.pyi", "py.typed"):
        assert f"deepnvme/{stub}" in names, (stub, names)
    assert any(re.match(r"deepnvme-[^/]*\.dist-info/licenses/LICENSE$", n) for n in names), names
    cli = "deepnvme/_bin/deepnvme"
    assert cli in names, names
    assert (z.getinfo(cli).external_attr >> 16) & 0o111, "the CLI is not executable in the wheel"
    # Stripped: no symbol table, no debug sections (pyelftools comes with auditwheel).
    from elftools.elf.elffile import ELFFile
    for member in (sos[0], cli):
        sections = [sec.name for sec in ELFFile(io.BytesIO(z.read(member))).iter_sections()]
        kept = [n for n in sections if n == ".symtab" or n.startswith(".debug")]
        assert not kept, f"{member} is not stripped: {kept}"
    size = z.getinfo(sos[0]).file_size
    assert size < 4 * 1000 * 1000, f"_native is {size} bytes, over 4 MB"
    print(f"_native: {size} bytes; CLI: {z.getinfo(cli).file_size} bytes; both stripped")
    with tempfile.TemporaryDirectory() as d:
        path = z.extract(sos[0], d)
        needed = read_dynamic(path).needed
bad = [n for n in needed if re.match(r"lib(torch|c10|cuda|cudart|cufile|aio)", n)]
assert not bad, needed
print("files:", ", ".join(n for n in names if not n.endswith("RECORD")))
print("NEEDED:", needed)
PY

say "the sdist: LICENSE and what building needs; no perf PNG, no Python test suite"
rm -f "$OUT"/deepnvme-*.tar.gz
# Through the PEP 517 backend, as `python -m build --sdist` would call it.
(cd "$ROOT" && PATH="$VENV/bin:$PATH" "$VENV/bin/python" -c 'import sys; sys.path.insert(0, "bindings/backend")
import deepnvme_backend; print(deepnvme_backend.build_sdist(sys.argv[1]))' "$OUT")
"$VENV/bin/python" - "$OUT"/deepnvme-*.tar.gz <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
with tarfile.open(sys.argv[1]) as t:
    top = t.getnames()[0].split("/")[0]
    manifest = t.extractfile(f"{top}/Cargo.toml").read().decode()
# The workspace keeps the CLI (maturin alone would drop it): the wheel built from the sdist builds it.
assert '"crates/deepnvme-cli"' in manifest, manifest
for needed in ("LICENSE", "pyproject.toml", "Cargo.toml", "Cargo.lock", "src/lib.rs", "bindings/deepnvme/__init__.py",
               "bindings/deepnvme/_native.pyi", "bindings/backend/deepnvme_backend.py", "bindings/deepnvme-deepspeed.pth",
               "crates/deepnvme-cli/Cargo.toml", "crates/deepnvme-cli/src/main.rs"):
    assert needed in names, (needed, names)
bad = [n for n in names if n.endswith(".png") or n.startswith("tests/python/") or n.startswith("bindings/deepnvme/_bin/")]
assert not bad, bad
print(f"sdist: {len(names)} files, LICENSE in, no PNG or Python test")
PY

if [ ! -x "$WHEEL_VENV/bin/python" ] || ! "$WHEEL_VENV/bin/python" -c 'import torch, deepspeed, pytest, numpy, mypy' 2>/dev/null; then
    say "creating $WHEEL_VENV (torch $TORCH_VERSION, deepspeed $DEEPSPEED_VERSION; no compiler)"
    "$PYTHON" -m venv "$WHEEL_VENV"
    CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check -U pip
    CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
        "torch==$TORCH_VERSION" numpy pytest mypy
    CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
        "deepspeed==$DEEPSPEED_VERSION"
fi

say "installing the wheel with no compiler (CC=false CXX=false)"
CC=false CXX=false "$WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall "$WHEEL"

# From here on no compiler and no cargo: cc/gcc/g++/c++ fail loudly, and
# ~/.cargo/bin (rustup's cargo and rustc) is off PATH.
NOCC="$ROOT/target/wheel-check-nocc"
mkdir -p "$NOCC"
for tool in cc gcc g++ c++ clang clang++; do
    printf '#!/bin/sh\necho "%s: not available in the wheel check (no compiler)" >&2\nexit 127\n' "$tool" > "$NOCC/$tool"
    chmod +x "$NOCC/$tool"
done
BARE_PATH="$NOCC:$WHEEL_VENV/bin:$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo/bin' -e "$VENV/bin" | paste -sd:)"
bare() { env -u DEEPNVME_FRONTEND -u VIRTUAL_ENV PATH="$BARE_PATH" CC=false CXX=false "$@"; }
bare sh -c '! command -v cargo && ! command -v rustc' >/dev/null \
    || { echo "FAIL: cargo or rustc is still on the wheel check's PATH" >&2; exit 1; }

say "pip show: home page, URLs, classifiers, license"
bare "$WHEEL_VENV/bin/python" -m pip show -v deepnvme | tee "$OUT/pip-show.txt"
for field in "Home-page: http" "License-Expression: Apache-2.0" "Classifiers:" "Project-URLs:" "Entry-points:"; do
    grep -q "^$field" "$OUT/pip-show.txt" || { echo "FAIL: pip show lacks '$field'" >&2; exit 1; }
done

say "the CLI from the wheel: deepnvme doctor --json, python -m deepnvme info (no compiler, no cargo)"
CLI_DIR=$(mktemp -d "$ROOT/target/wheel-cli.XXXXXX")
set +e
(cd "$CLI_DIR" && bare "$WHEEL_VENV/bin/deepnvme" doctor --json --no-bench) > "$CLI_DIR/doctor.json"
doctor_rc=$?
set -e
bare "$WHEEL_VENV/bin/python" - "$CLI_DIR/doctor.json" "$doctor_rc" "$WHEEL_VENV/bin/python" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
rc, python = int(sys.argv[2]), sys.argv[3]
fails = report["counts"].get("fail", 0) if isinstance(report.get("counts"), dict) else None
print("doctor status:", report.get("status"), "counts:", report.get("counts"), "exit:", rc)
# The exit status follows the findings as the cargo-built CLI's does: 0 without a FAIL, 1 with one.
assert rc in (0, 1) and (fails is None or rc == (1 if fails else 0)), (rc, report.get("counts"))
# The console script's interpreter is the one probed (not python3 on PATH).
probed = json.dumps(report)
assert os.path.realpath(python) in probed or python in probed, f"the doctor did not probe {python}"
PY
(cd "$CLI_DIR" && bare "$WHEEL_VENV/bin/python" -m deepnvme info)
(cd "$CLI_DIR" && bare "$WHEEL_VENV/bin/python" -m deepnvme info --json) | bare "$WHEEL_VENV/bin/python" -c \
    'import json, sys; d = json.load(sys.stdin); assert d["command"] == "info", d'
set +e
bare "$WHEEL_VENV/bin/deepnvme" no-such-command 2>/dev/null; usage_rc=$?
set -e
[ "$usage_rc" = 2 ] || { echo "FAIL: a usage error exited $usage_rc, not 2 (the CLI's)" >&2; exit 1; }
rm -rf "$CLI_DIR"

say "stubtest: the stubs against the installed module"
STUBS=$(mktemp -d "$ROOT/target/stubs.XXXXXX")
mkdir "$STUBS/deepnvme"
cp "$("$WHEEL_VENV/bin/python" -c 'import deepnvme, os; print(os.path.dirname(deepnvme.__file__))')"/*.pyi "$STUBS/deepnvme/"
(cd "$STUBS" && bare MYPYPATH="$STUBS" "$WHEEL_VENV/bin/python" -m mypy.stubtest \
    --allowlist "$ROOT/tests/stubtest-allowlist.txt" deepnvme)
rm -rf "$STUBS"

say "DeepSpeed's loader picks the pyo3 front end by itself"
env -u DEEPNVME_FRONTEND "$WHEEL_VENV/bin/python" - <<'PY'
from deepspeed.ops.op_builder import AsyncIOBuilder, PinMemoryBuilder
aio = AsyncIOBuilder().load()
assert aio.__name__ == "deepnvme.frontend", aio
assert PinMemoryBuilder().load() is aio and AsyncIOBuilder().is_compatible()
print("AsyncIOBuilder().load() ->", aio.__name__)
PY

NOTORCH_VENV="$VENV-wheel-notorch"
say "the wheel with no torch installed at all ($NOTORCH_VENV: numpy only, no compiler)"
if [ ! -x "$NOTORCH_VENV/bin/python" ] || ! "$NOTORCH_VENV/bin/python" -c 'import numpy' 2>/dev/null; then
    "$PYTHON" -m venv "$NOTORCH_VENV"
    CC=false CXX=false "$NOTORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check numpy
fi
CC=false CXX=false "$NOTORCH_VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --no-deps --force-reinstall "$WHEEL"
NOTORCH_DIR=$(mktemp -d "$ROOT/target/notorch.XXXXXX")
env -u DEEPNVME_FRONTEND "$NOTORCH_VENV/bin/python" - "$NOTORCH_DIR" <<'PY'
import importlib.util, mmap, os, sys
import numpy as np
assert importlib.util.find_spec("torch") is None, "torch is installed in the no-torch venv"
import deepnvme
assert deepnvme.load_op("async_io").__name__ == "deepnvme.frontend"
import deepnvme.frontend as fe
d = sys.argv[1]
# The top level serves the same API (deepnvme.frontend's) for Python users without DeepSpeed.
assert deepnvme.aio_handle is fe.aio_handle and deepnvme.pin_handle is fe.pin_handle
h = deepnvme.aio_handle(block_size=8192, queue_depth=4, single_submit=False, overlap_events=True,
                        intra_op_parallelism=2)
locked = h.new_cpu_locked_tensor(1 << 20, np.zeros(0, dtype=np.float32))
assert isinstance(locked, np.ndarray) and locked.dtype == np.float32 and h.is_pinned(locked)
locked[:] = np.arange(locked.size, dtype=np.float32)
assert h.sync_pwrite(locked, os.path.join(d, "a.bin")) == 1
back = np.zeros_like(locked)
assert h.async_pread(back, os.path.join(d, "a.bin")) == 0 and h.wait() == 1
assert np.array_equal(back, locked)
raw = bytearray(4096 * 3 + 100)
raw[:] = os.urandom(len(raw))
assert h.sync_pwrite(memoryview(raw), os.path.join(d, "b.bin")) == 1
out = bytearray(len(raw))
assert h.sync_pread(out, os.path.join(d, "b.bin")) == 1 and out == raw
with mmap.mmap(-1, len(raw)) as m:
    assert h.sync_pread(m, os.path.join(d, "b.bin")) == 1 and m[:] == raw
try:
    h.sync_pread(bytes(len(raw)), os.path.join(d, "b.bin"))
    raise SystemExit("a read into read-only bytes was accepted")
except TypeError as e:
    assert "read-only" in str(e), e
assert h.free_cpu_locked_tensor(locked) is True
print("no torch installed: numpy, bytearray, memoryview and mmap round trips passed")
PY
rm -rf "$NOTORCH_DIR"

say "pytest tests/python on the wheel (pyo3 front end)"
bare "$WHEEL_VENV/bin/python" -m pytest tests/python -q \
    -p no:cacheprovider --basetemp="$ROOT/target/pytest-tmp-wheel" "$@"
say "wheel check passed"
