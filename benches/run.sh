#!/usr/bin/env bash
# benches/run.sh: the whole benchmark in one command. It sets up what it
# needs, then runs benches/run.py, which compares fio (io_uring; psync at
# queue depth 1 for small ops), DeepSpeed's stock async_io op (JIT-built with
# libaio from the installed deepspeed), deepnvme through DeepSpeed's loader
# and the `deepnvme` CLI on one file, in alternating A/B order, plus the
# pinned-manager is_managed microbenchmark, and writes docs/perf/README.md,
# docs/perf/results.json and the charts docs/perf/*.png.
#
# Setup (each step skipped when already done):
#   * apt-get install -y fio libaio-dev   (as root, only when missing)
#   * bindings/install.sh into $DEEPNVME_VENV (torch, deepspeed, deepnvme)
#   * pip install matplotlib into that venv
#   * cargo build --release (the CLI and examples/is_managed_bench)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DEEPNVME_VENV=${DEEPNVME_VENV:-/root/.cache/deepnvme-venv-perf}
# DeepSpeed's JIT build of the stock op goes next to the venv, not into the
# torch_extensions cache other environments on this machine share.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$DEEPNVME_VENV/torch_extensions}

usage() {
    cat <<'EOF'
Usage: benches/run.sh [OPTIONS]

  --quick          a few cells at small sizes, 2 rounds: checks the harness
                   in a few minutes (its report says QUICK in bold)
  --rounds N       rounds per cell [4; --quick 2]; keep it even so each
                   implementation goes first as often as second
  --size SIZE      bytes per throughput run = the test file's size
                   [256M; --quick 64M]
  --dir DIR        where the test file goes [target/perf]
  --out DIR        where the report goes [docs/perf]
  --pause S        seconds of pause before every run [0.3]
  --small-seconds S  seconds per small-op run [3; --quick 1]
  --op-bytes SIZE  bytes per op and buffer [min(size, 128M)]
  --skip-setup     do not run apt-get, bindings/install.sh, pip or cargo
  -h, --help       this text

Environment: DEEPNVME_VENV (default /root/.cache/deepnvme-venv-perf).
Full run: 525 s after setup (2026-11-30, this 2-core VM); --quick: 2-3
minutes. The first start JIT-builds the stock op
(minutes; far longer on a busy machine), later runs reuse it.
EOF
}

COMMAND="benches/run.sh${*:+ $*}"
SKIP_SETUP=0
ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --skip-setup) SKIP_SETUP=1; shift ;;
        --quick) ARGS+=("$1"); shift ;;
        --rounds|--size|--dir|--out|--pause|--small-seconds|--op-bytes)
            [[ $# -ge 2 ]] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
            ARGS+=("$1" "$2"); shift 2 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf '\n== %s\n' "$*" >&2; }

if [[ $SKIP_SETUP == 0 ]]; then
    missing=()
    command -v fio >/dev/null 2>&1 || missing+=(fio)
    [[ -e /usr/include/libaio.h ]] || missing+=(libaio-dev)
    if [[ ${#missing[@]} -gt 0 ]]; then
        say "installing ${missing[*]}"
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            apt-get install -y "${missing[@]}" || { apt-get update && apt-get install -y "${missing[@]}"; }
        else
            echo "run.sh: need ${missing[*]} (apt-get install -y ${missing[*]})" >&2
            exit 1
        fi
    fi

    say "Python environment $DEEPNVME_VENV (bindings/install.sh)"
    "$ROOT/bindings/install.sh"
    if ! "$DEEPNVME_VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
        say "installing matplotlib into $DEEPNVME_VENV"
        "$DEEPNVME_VENV/bin/python" -m pip install --disable-pip-version-check matplotlib
    fi

    say "cargo build --release (deepnvme CLI, is_managed_bench)"
    (cd "$ROOT" && cargo build --release --quiet --bin deepnvme --example is_managed_bench)
fi

say "benchmark (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
exec "$DEEPNVME_VENV/bin/python" "$ROOT/benches/run.py" "${ARGS[@]}" --command "$COMMAND" \
    --python "$DEEPNVME_VENV/bin/python" \
    --cli "$ROOT/target/release/deepnvme" \
    --is-managed-bin "$ROOT/target/release/examples/is_managed_bench"
