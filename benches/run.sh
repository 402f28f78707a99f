#!/usr/bin/env bash
# benches/run.sh: the whole benchmark in one command. It sets up what it
# needs, then runs benches/run.py, which compares fio (io_uring; psync at
# queue depth 1 for small ops), DeepSpeed's stock async_io op (JIT-built with
# libaio from the installed deepspeed), deepnvme through DeepSpeed's loader,
# the `deepnvme` CLI and the bare baseline (benches/bare, the limit of each
# cell) on one file, in alternating order, plus the
# pinned-manager is_managed microbenchmark, and writes docs/perf/README.md,
# docs/perf/results.json and the charts docs/perf/*.png.
#
# Then, where it can be set up (root, zram), the fast-device tier: a fresh
# zram device with ext4 and a tmpfs, the same grid against the stock op and
# fio (io_uring and libaio) on them, written to docs/perf/fast_device.*
# (why zram stands in for a multi-drive NVMe array: docs/perf/fast_device.md).
# Everything it set up is torn down on exit.
#
# Setup (each step skipped when already done):
#   * apt-get install -y fio libaio-dev   (as root, only when missing)
#   * bindings/install.sh into $DEEPNVME_VENV (torch, deepspeed, deepnvme)
#   * pip install matplotlib into that venv
#   * cargo build --release (the CLI, benches/bare and examples/is_managed_bench)
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
                   [256M; fast tier 1G; --quick 64M]
  --dir DIR        where the test file goes [target/perf]
  --out DIR        where the report goes [docs/perf]
  --pause S        seconds of pause before every run [0.3]
  --small-seconds S  seconds per small-op run [3; --quick 1]
  --op-bytes SIZE  bytes per op and buffer [min(size, 128M); fast tier:
                   size, one 1 GiB tensor per op (docs/perf/harnesses.md)]
  --skip-setup     do not run apt-get, bindings/install.sh, pip or cargo
  --fast-device    run only the fast-device tier (zram + ext4, and tmpfs;
                   root needed), failing when it cannot be set up
  --no-fast-device run only the virtio disk's tier
                   (default: both; the fast tier when it can be set up)
  --zram-size SIZE the zram device's size [8G]
  -h, --help       this text

Environment: DEEPNVME_VENV (default /root/.cache/deepnvme-venv-perf).
Full run after setup (2026-12-03, this 2-core VM, 4 rounds): the disk
tier 8 min; the fast tier 62 min, most of it a Python start (~8 s) before
each of its ~300 stock and deepnvme runs, since each gets a fresh worker
(19 min with long-lived workers: `run.py --workers long-lived`).
--quick: 2-3 minutes. The first start JIT-builds the stock op (minutes;
far longer on a busy machine), later runs reuse it.
EOF
}

COMMAND="benches/run.sh${*:+ $*}"
SKIP_SETUP=0
TIERS=both
ZRAM_SIZE=8G
ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --skip-setup) SKIP_SETUP=1; shift ;;
        --fast-device) TIERS=fast; shift ;;
        --no-fast-device) TIERS=disk; shift ;;
        --zram-size) [[ $# -ge 2 ]] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
            ZRAM_SIZE=$2; shift 2 ;;
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

    say "cargo build --release (deepnvme CLI, benches/bare, is_managed_bench)"
    (cd "$ROOT" && cargo build --release --quiet --bin deepnvme --example is_managed_bench)
    (cd "$ROOT" && cargo build --release --quiet --manifest-path benches/bare/Cargo.toml --target-dir target)
fi

run_py() {
    "$DEEPNVME_VENV/bin/python" "$ROOT/benches/run.py" "${ARGS[@]}" --command "$COMMAND" \
        --python "$DEEPNVME_VENV/bin/python" \
        --cli "$ROOT/target/release/deepnvme" \
        --bare-bin "$ROOT/target/release/bare" \
        --is-managed-bin "$ROOT/target/release/examples/is_managed_bench" "$@"
}

if [[ $TIERS != fast ]]; then
    say "benchmark: the virtio disk (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
    run_py
fi
[[ $TIERS == disk ]] && exit 0

# ------------------------------------------------------------ fast-device tier
# A zram device of our own (hot_add, never an existing one), ext4 on it,
# and a tmpfs; all of it removed again by the trap, however the run ends.
ZRAM_DEV=""
FAST_MNT="$ROOT/target/perf-zram"
TMPFS_MNT="$ROOT/target/perf-tmpfs"
teardown() {
    mountpoint -q "$FAST_MNT" 2>/dev/null && umount "$FAST_MNT"
    mountpoint -q "$TMPFS_MNT" 2>/dev/null && umount "$TMPFS_MNT"
    if [[ -n $ZRAM_DEV ]]; then
        echo 1 > "/sys/block/$ZRAM_DEV/reset" 2>/dev/null || true
        echo "${ZRAM_DEV#zram}" > /sys/class/zram-control/hot_remove 2>/dev/null || true
        say "removed /dev/$ZRAM_DEV and the mounts"
    fi
}
cannot_fast() {
    if [[ $TIERS == fast ]]; then
        echo "run.sh: --fast-device: $*" >&2
        exit 1
    fi
    say "fast-device tier skipped: $*"
    exit 0
}
[[ $(id -u) == 0 ]] || cannot_fast "needs root (zram, mkfs, mount)"
command -v modprobe >/dev/null 2>&1 && { modprobe zram 2>/dev/null || true; }
[[ -w /sys/class/zram-control/hot_add ]] || cannot_fast "no zram in this kernel (/sys/class/zram-control)"
command -v mkfs.ext4 >/dev/null 2>&1 || cannot_fast "mkfs.ext4 is missing (apt-get install -y e2fsprogs)"
trap teardown EXIT
trap 'exit 130' INT TERM
ZRAM_DEV=zram$(cat /sys/class/zram-control/hot_add) || cannot_fast "zram hot_add failed"
# Pages filled with one repeated word are kept as that word: no compression
# and no memory per page, so the device runs at the speed of the kernel's
# block and file-system code (see docs/perf/fast_device.md).
echo "$ZRAM_SIZE" > "/sys/block/$ZRAM_DEV/disksize" || cannot_fast "setting /dev/$ZRAM_DEV's size to $ZRAM_SIZE failed"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "/dev/$ZRAM_DEV" \
    || cannot_fast "mkfs.ext4 /dev/$ZRAM_DEV failed"
mkdir -p "$FAST_MNT" "$TMPFS_MNT"
mount -o noatime "/dev/$ZRAM_DEV" "$FAST_MNT" || cannot_fast "mounting /dev/$ZRAM_DEV failed"
mount -t tmpfs -o size=3G,mode=0700 tmpfs "$TMPFS_MNT" || cannot_fast "mounting a tmpfs failed"
say "fast-device tier: /dev/$ZRAM_DEV ($ZRAM_SIZE, ext4) at $FAST_MNT, tmpfs at $TMPFS_MNT (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
run_py --fast-device --dir "$FAST_MNT" --tmpfs-dir "$TMPFS_MNT"
