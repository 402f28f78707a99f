#!/usr/bin/env bash
# The sdist builds the same wheel: `pip wheel` of target/wheels' sdist in a
# fresh venv (pip's build isolation: maturin, ziglang and cargo-zigbuild
# from the package index; Rust from PATH), compared file by file with the
# wheel tests/wheel-check.sh built from the checkout. Not part of
# run-all.sh (a cold build of everything, several minutes here); run it
# after tests/wheel-check.sh when the packaging changes.
# Usage: tests/sdist-check.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/target/wheels"
PYTHON=${PYTHON:-python3}
SDIST=$(ls "$OUT"/deepnvme-*.tar.gz)
WHEEL=$(ls "$OUT"/deepnvme-*.whl)
WORK=$(mktemp -d "$ROOT/target/sdist-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "== a fresh venv builds $SDIST"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check -U pip
# A target folder of its own, inside the unpacked sdist's build: nothing
# reused from the checkout's target/.
env -u CARGO_TARGET_DIR "$WORK/venv/bin/python" -m pip wheel --disable-pip-version-check --no-deps \
    -w "$WORK/out" "$SDIST"
BUILT=$(ls "$WORK/out"/deepnvme-*.whl)

echo "== comparing $(basename "$BUILT") with $(basename "$WHEEL")"
mkdir -p "$OUT/from-sdist" && cp "$BUILT" "$OUT/from-sdist/"  # kept for a look when they differ
"$WORK/venv/bin/python" - "$WHEEL" "$BUILT" <<'PY'
import hashlib, json, re, sys, zipfile
def normalized(name, data):
    """maturin's SBOM is made per build: a random serial number, a time
    stamp and the source folder in references. The rest must match."""
    if not name.endswith(".cyclonedx.json"):
        return data
    sbom = json.loads(data)
    sbom.pop("serialNumber", None)
    sbom.get("metadata", {}).pop("timestamp", None)
    text = json.dumps(sbom, sort_keys=True)
    return re.sub(r"path\+file://[^#\"]*", "path+file://<source>", text).encode()
def contents(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: (hashlib.sha256(normalized(i.filename, z.read(i))).hexdigest(), i.external_attr >> 16)
                for i in z.infolist() if not i.filename.endswith("/RECORD")}
a, b = contents(sys.argv[1]), contents(sys.argv[2])
import os
assert os.path.basename(sys.argv[1]) == os.path.basename(sys.argv[2]), "the wheels' names (tags) differ"
assert sorted(a) == sorted(b), f"file lists differ: {sorted(set(a) ^ set(b))}"
differ = sorted(n for n in a if a[n] != b[n])
for n in sorted(a):
    print(("DIFFERS " if n in differ else "same    ") + n)
assert not differ, f"{len(differ)} file(s) differ: {differ}"
print("the sdist's wheel is the checkout's wheel, file for file (the SBOM's serial number, time and source folder aside)")
PY
