#!/usr/bin/env bash
# The striping tier (docs/perf/striping.md): N ext4-on-zram devices, each
# throttled for this benchmark's cgroup (cgroup v1 blkio
# throttle.read_bps_device / write_bps_device) to the same bandwidth, so
# that each member is the limit the way a drive is. Then, side by side in
# alternating order through DeepSpeed's aio_handle: one member alone, stripe
# sets over 2 and 4 members, and fio with one job per member (summed: the
# limit); locked and plain tensors, 1 MiB blocks, queue depth 32,
# parallelism 1 and 2 (benches/stripe_bench.py). Everything it makes (zram
# devices, mounts, the cgroup) is removed by the trap, however it ends.
#
#   benches/stripe.sh [--members 4] [--mbps 200] [--mib-per-member 256] [--rounds 3] [--no-units]
#                     [--queue-depth 32] [--out docs/perf/striping.json]
#
# With the units comparison (default): stripe sets over all members with
# units of 256 KiB, 1 MiB and 4 MiB, whole-file ops and 4 MiB ops.
#
# Needs root, zram, mkfs.ext4, cgroup v1 blkio, fio (installed with apt-get
# when missing) and the venv of bindings/install.sh ($DEEPNVME_VENV).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export DEEPNVME_VENV=${DEEPNVME_VENV:-$HOME/.cache/deepnvme-venv}
MEMBERS=4
MBPS=200
MIB_PER_MEMBER=256
ROUNDS=3
UNITS=(--units)
QD=32
OUT=docs/perf/striping.json
while [[ $# -gt 0 ]]; do
    case "$1" in
        --members) MEMBERS=$2; shift 2 ;;
        --mbps) MBPS=$2; shift 2 ;;
        --mib-per-member) MIB_PER_MEMBER=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --no-units) UNITS=(); shift ;;
        --queue-depth) QD=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "stripe.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
COMMAND="benches/stripe.sh --members $MEMBERS --mbps $MBPS --mib-per-member $MIB_PER_MEMBER --rounds $ROUNDS --queue-depth $QD ${UNITS[*]:---no-units}"
say() { printf '\n== %s\n' "$*" >&2; }

[[ $(id -u) == 0 ]] || { echo "stripe.sh: needs root (zram, mkfs, mount, cgroups)" >&2; exit 1; }
[[ -w /sys/class/zram-control/hot_add ]] || { echo "stripe.sh: no zram in this kernel" >&2; exit 1; }
BLKIO=/sys/fs/cgroup/blkio
[[ -e $BLKIO/blkio.throttle.read_bps_device ]] || { echo "stripe.sh: no cgroup v1 blkio at $BLKIO" >&2; exit 1; }
command -v fio >/dev/null 2>&1 || { say "installing fio"; apt-get install -y fio || { apt-get update && apt-get install -y fio; }; }
"$ROOT/bindings/install.sh" >&2
(cd "$ROOT" && cargo build --release --quiet --bin deepnvme)

WORK="$ROOT/target/perf-stripe"
CG="$BLKIO/deepnvme-stripe-bench-$$"
DEVS=()
teardown() {
    for i in "${!DEVS[@]}"; do
        mountpoint -q "$WORK/d$i" 2>/dev/null && umount "$WORK/d$i"
        echo 1 > "/sys/block/${DEVS[$i]}/reset" 2>/dev/null || true
        echo "${DEVS[$i]#zram}" > /sys/class/zram-control/hot_remove 2>/dev/null || true
    done
    [[ -d $CG ]] && rmdir "$CG" 2>/dev/null || true
    rm -rf "$WORK"
}
trap teardown EXIT
trap 'exit 130' INT TERM
rm -rf "$WORK"; mkdir -p "$WORK"
mkdir "$CG"
BPS=$((MBPS * 1000 * 1000))
for i in $(seq 0 $((MEMBERS - 1))); do
    dev=zram$(cat /sys/class/zram-control/hot_add)
    DEVS+=("$dev")
    echo 4G > "/sys/block/$dev/disksize"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "/dev/$dev"
    mkdir -p "$WORK/d$i"
    mount -o noatime "/dev/$dev" "$WORK/d$i"
    majmin=$(cat "/sys/block/$dev/dev")
    echo "$majmin $BPS" > "$CG/blkio.throttle.read_bps_device"
    echo "$majmin $BPS" > "$CG/blkio.throttle.write_bps_device"
done
say "members: ${DEVS[*]} (ext4), each throttled to $MBPS MB/s for cgroup $CG (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"

# The measuring process, and fio under it, run inside the throttled cgroup.
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$CG" \
    "$DEEPNVME_VENV/bin/python" "$ROOT/benches/stripe_bench.py" \
    --members $(for i in $(seq 0 $((MEMBERS - 1))); do printf '%s ' "$WORK/d$i"; done) \
    --work "$WORK" --mib-per-member "$MIB_PER_MEMBER" --rounds "$ROUNDS" --bps "$BPS" --queue-depth "$QD" "${UNITS[@]}" \
    --cli "$ROOT/target/release/deepnvme" \
    --out "$ROOT/$OUT" --markdown "$ROOT/target/striping-table.md" --command "$COMMAND"
say "wrote $OUT and target/striping-table.md"
