#!/usr/bin/env bash
# Runs every test: the Rust core's tests, then (after bindings/install.sh has
# set up or reused the environment) the Python suite through DeepSpeed's own
# loader. With DEEPSPEED_TESTS_DIR pointing at the `tests/` folder of a
# DeepSpeed checkout (outside this repo), DeepSpeed's own nvme and pin_memory
# tests run against this build too.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
# DeepSpeed JIT-builds its CPU comm op in its tests, and needs ninja from the venv.
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

say() { printf '\n== %s\n' "$*"; }

say "cargo test (Rust core and the deepnvme CLI)"
cargo test --all-targets
# --all-targets leaves out the API docs' examples (and their compile_fail cases).
cargo test --doc
# The benchmarks' bare baseline, a package of its own (benches/bare).
cargo test --manifest-path benches/bare/Cargo.toml --target-dir target

# The workspace lints (Cargo.toml: every unsafe block says why it is sound)
# and clippy's defaults, over every feature (the cxx bridge, the pyo3 module).
say "cargo clippy (workspace lints, all features) and rustdoc"
cargo clippy --workspace --all-targets --all-features -- -D warnings
# Broken or private intra-doc links in the API docs fail too.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --quiet

# Where io_uring is blocked (Docker's default seccomp answers EPERM), the psync
# engine must carry everything. As root, simulate that for a second pass of
# the core tests with kernel.io_uring_disabled=2, restored on any exit.
URING_SYSCTL=/proc/sys/kernel/io_uring_disabled
if [ "$(id -u)" = 0 ] && [ -w "$URING_SYSCTL" ] && [ "$(cat "$URING_SYSCTL")" = 0 ]; then
    say "cargo test again with io_uring blocked (kernel.io_uring_disabled=2)"
    trap 'echo 0 > "$URING_SYSCTL"' EXIT
    echo 2 > "$URING_SYSCTL"
    cargo test --test core_handle
    # Of the grouped binary, the modules that were core_errors, core_unaligned and core_knobs.
    cargo test --test core -- errors:: unaligned:: knobs::
    echo 0 > "$URING_SYSCTL"
    trap - EXIT
fi

say "setting up the Python environment"
"$ROOT/bindings/install.sh"

# The suite once per front end: DeepSpeed's builders return the compiled
# modules, then (DEEPNVME_FRONTEND=pyo3) the pyo3 front end deepnvme.frontend.
# Test files go under target/ so they sit on the checkout's disk file system
# (O_DIRECT is the point), whatever /tmp is.
for frontend in compiled pyo3; do
    say "pytest tests/python with the $frontend front end (through DeepSpeed's loader)"
    DEEPNVME_FRONTEND=$frontend "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider \
        --basetemp="$ROOT/target/pytest-tmp-$frontend"
done

# The prebuilt abi3 wheel in a fresh, compiler-less venv, where DeepSpeed
# must pick the pyo3 front end by itself (slow on a cold cache: it installs
# torch into a venv of its own). DEEPNVME_WHEEL_CHECK=0 skips it.
if [ "${DEEPNVME_WHEEL_CHECK:-1}" = 1 ]; then
    say "the prebuilt wheel (tests/wheel-check.sh)"
    "$ROOT/tests/wheel-check.sh"
fi

if [ -n "${DEEPSPEED_TESTS_DIR:-}" ]; then
    say "DeepSpeed's own tests from $DEEPSPEED_TESTS_DIR"
    "$ROOT/tests/deepspeed-suite.sh" "$DEEPSPEED_TESTS_DIR"
    say "DeepSpeed's own tests with its builders redirected to deepnvme.op_builder"
    "$ROOT/tests/deepspeed-suite.sh" "$DEEPSPEED_TESTS_DIR" builders
fi

say "all tests passed"
