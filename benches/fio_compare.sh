#!/usr/bin/env bash
# fio_compare.sh: compares `deepnvme bench` with fio's io_uring engine on the
# same file, with the same block size, queue depth and O_DIRECT, for N rounds
# of (write pair, read pair). The order alternates, because a disk may favour
# whichever run goes second: odd rounds run fio first in each pair, even
# rounds deepnvme first. Before every run: sync, drop the page cache (as
# root) and a short pause. It prints each throughput, then per direction the
# median GB/s of each tool and the median [min-max] of the per-round ratios
# deepnvme/fio (one ratio per adjacent pair).
#
# fio:      --direct=1 --ioengine=io_uring --bs=BS --iodepth=QD --numjobs=1
# deepnvme: --block-size BS --queue-depth QD --parallelism 1, plus the
#           fastest --single-submit/--overlap-events combination, picked per
#           direction by a short `deepnvme tune` on the same file first
#           (or given with --ds-write-flags/--ds-read-flags).
#
# GB/s here are 10^9 bytes per second for both tools (fio's bw_bytes / 1e9).
# The script installs nothing. It needs fio (apt-get install -y fio) and
# python3 (to read fio's and deepnvme's JSON); it builds the release binary
# with cargo unless --bin is given.

set -euo pipefail

usage() {
    cat <<'EOF'
Usage: benches/fio_compare.sh [OPTIONS]

  --size SIZE          file size and bytes per pass, fio syntax [1G]
  --rounds N           rounds of (write pair, read pair); odd rounds fio
                       first, even rounds deepnvme first [4]
  --bs SIZE            block size for both tools [1M]
  --iodepth N          queue depth for both tools [32]
  --buffer-size SIZE   deepnvme bytes per op [deepnvme's default: 256M,
                       or SIZE when smaller]
  --dir DIR            where the test file goes [current directory]
  --file PATH          use this file instead (kept afterwards)
  --keep               keep the test file
  --pause S            seconds to pause before every timed run [1]
  --ds-write-flags "F" deepnvme knob flags for writes, e.g.
                       "--single-submit --overlap-events" (skips the pick)
  --ds-read-flags "F"  the same for reads
  --bin PATH           deepnvme binary to use (default: build with cargo)
  -h, --help           this text

Exit status: 0 when both median ratios are at least 0.9, 3 when one is below,
1 on errors, 2 on bad options.
EOF
}

die() { echo "fio_compare: error: $*" >&2; exit 1; }
bad() { echo "fio_compare: error: $*" >&2; echo "Try 'benches/fio_compare.sh --help'." >&2; exit 2; }

SIZE=1G
ROUNDS=4
PAUSE=1
BS=1M
IODEPTH=32
BUFFER_SIZE=""
DIR=.
FILE=""
KEEP=0
DS_WRITE_FLAGS=""
DS_READ_FLAGS=""
PICK_WRITE=1
PICK_READ=1
BIN=""

need_value() { [[ $# -ge 2 ]] || bad "option $1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --size) need_value "$@"; SIZE=$2; shift 2 ;;
        --rounds) need_value "$@"; ROUNDS=$2; shift 2 ;;
        --bs) need_value "$@"; BS=$2; shift 2 ;;
        --iodepth) need_value "$@"; IODEPTH=$2; shift 2 ;;
        --buffer-size) need_value "$@"; BUFFER_SIZE=$2; shift 2 ;;
        --dir) need_value "$@"; DIR=$2; shift 2 ;;
        --file) need_value "$@"; FILE=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --pause) need_value "$@"; PAUSE=$2; shift 2 ;;
        --ds-write-flags) need_value "$@"; DS_WRITE_FLAGS=$2; PICK_WRITE=0; shift 2 ;;
        --ds-read-flags) need_value "$@"; DS_READ_FLAGS=$2; PICK_READ=0; shift 2 ;;
        --bin) need_value "$@"; BIN=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) bad "unknown option $1" ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || bad "--rounds must be a positive whole number, got '$ROUNDS'"
[[ $IODEPTH =~ ^[1-9][0-9]*$ ]] || bad "--iodepth must be a positive whole number, got '$IODEPTH'"

if ! command -v fio >/dev/null 2>&1; then
    cat >&2 <<'EOF'
fio_compare: fio is not installed. Install it, then run this again:
    apt-get update && apt-get install -y fio     # Debian, Ubuntu
    dnf install -y fio                           # Fedora, RHEL
This script installs nothing itself.
EOF
    exit 1
fi
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read the JSON results (apt-get install -y python3)"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z $BIN ]]; then
    echo "building the release binary (cargo build --release) ..." >&2
    (cd "$ROOT" && cargo build --release --quiet --bin deepnvme) || die "cargo build --release failed"
    BIN=$ROOT/target/release/deepnvme
fi
[[ -x $BIN ]] || die "$BIN is not an executable"

WORK=$(mktemp -d)
REMOVE_FILE=0
if [[ -z $FILE ]]; then
    [[ -d $DIR ]] || die "$DIR is not a directory"
    FILE=$DIR/.fio-compare-$$.dat
    [[ $KEEP == 1 ]] || REMOVE_FILE=1
fi
cleanup() {
    rm -rf "$WORK"
    if [[ $REMOVE_FILE == 1 ]]; then rm -f "$FILE"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Sizes are turned into bytes here (k/M/G/T = powers of 1024, fio's meaning
# too), so that both tools get the very same numbers.
to_bytes() {
    python3 - "$1" <<'EOF'
import re, sys
m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)(i?b)?", sys.argv[1].strip().lower())
if not m:
    sys.exit(1)
v = float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")
if v != int(v) or v <= 0:
    sys.exit(1)
print(int(v))
EOF
}
BYTES=$(to_bytes "$SIZE") || bad "--size '$SIZE' is not a size like 512M or 1G"
BS_BYTES=$(to_bytes "$BS") || bad "--bs '$BS' is not a size like 128k or 1M"
if [[ -n $BUFFER_SIZE ]]; then
    BUFFER_BYTES=$(to_bytes "$BUFFER_SIZE") || bad "--buffer-size '$BUFFER_SIZE' is not a size like 256M"
fi

# get.py KIND FILE DIRECTION: "GB/s CPU-s/GB" from fio's or deepnvme's JSON,
# or (KIND=flags) the knob flags of the best point of a `deepnvme tune`.
cat >"$WORK/get.py" <<'EOF'
import json, sys
kind, path, d = sys.argv[1:4]
j = json.load(open(path))
if kind == "flags":
    k = j["best_" + d]["knobs"]
    on = [f for f, v in (("--single-submit", k["single_submit"]), ("--overlap-events", k["overlap_events"])) if v]
    print(" ".join(on))
    sys.exit()
if kind == "fio":
    job = j["jobs"][0]
    x = job[d]
    gbps = x["bw_bytes"] / 1e9
    # fio's usr/sys CPU are percentages of the job's run time.
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * (x["runtime"] / 1000) / (x["io_bytes"] / 1e9)
else:
    gbps, cpu = j[d]["gb_per_s_best"], j[d]["cpu_s_per_gb"]
print(f"{gbps:.4f} {cpu:.4f}")
EOF
get() { python3 "$WORK/get.py" "$@"; }

# --keep: this script removes the file itself (deepnvme would remove a file
# it created as soon as that one run ends).
DS_COMMON=(--file "$FILE" --keep --size "$BYTES" --block-size "$BS_BYTES" --queue-depth "$IODEPTH" --parallelism 1
           --quiet --json)
[[ -n $BUFFER_SIZE ]] && DS_COMMON+=(--buffer-size "$BUFFER_BYTES")
FIO_COMMON=(--name=fio_compare "--filename=$FILE" "--size=$BYTES" --direct=1 --ioengine=io_uring
            "--bs=$BS_BYTES" "--iodepth=$IODEPTH" --numjobs=1 --output-format=json)

echo "fio_compare: $(fio --version), deepnvme $("$BIN" --version | cut -d' ' -f2), file $FILE ($SIZE = $BYTES bytes)"
echo "fio:      --direct=1 --ioengine=io_uring --bs=$BS_BYTES --iodepth=$IODEPTH --numjobs=1"

# Lay the file out once (untimed), so every timed write overwrites blocks
# and every read finds data.
echo "writing the file once (untimed) ..." >&2
"$BIN" bench "${DS_COMMON[@]}" --write-only >/dev/null || die "deepnvme could not write $FILE"

# Pick the fastest single_submit/overlap_events combination per direction.
if [[ $PICK_WRITE == 1 || $PICK_READ == 1 ]]; then
    echo "picking deepnvme's fastest --single-submit/--overlap-events (deepnvme tune: 4 points, 2 loops) ..." >&2
    TUNE=(tune --file "$FILE" --keep --size "$BYTES" --block-size "$BS_BYTES" --queue-depth "$IODEPTH" --parallelism 1
          --loops 2 --quiet --json)
    [[ -n $BUFFER_SIZE ]] && TUNE+=(--buffer-size "$BUFFER_BYTES")
    "$BIN" "${TUNE[@]}" >"$WORK/tune.json" || die "deepnvme tune failed"
    if [[ $PICK_WRITE == 1 ]]; then DS_WRITE_FLAGS=$(get flags "$WORK/tune.json" write); fi
    if [[ $PICK_READ == 1 ]]; then DS_READ_FLAGS=$(get flags "$WORK/tune.json" read); fi
fi
read -r -a WRITE_FLAGS <<<"$DS_WRITE_FLAGS"
read -r -a READ_FLAGS <<<"$DS_READ_FLAGS"
echo "deepnvme: --block-size $BS_BYTES --queue-depth $IODEPTH --parallelism 1${BUFFER_SIZE:+ --buffer-size $BUFFER_BYTES}"
echo "          write knobs: ${DS_WRITE_FLAGS:-(neither flag)}; read knobs: ${DS_READ_FLAGS:-(neither flag)}"
echo

# Before every timed run: flush, drop the page cache (root only; O_DIRECT
# bypasses it anyway, this only keeps metadata and readahead state alike)
# and let the disk settle.
DROP=1
settle() {
    sync
    if [[ $DROP == 1 ]] && ! { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null; then
        echo "fio_compare: cannot drop caches (not root?): sync and pause only" >&2
        DROP=0
    fi
    sleep "$PAUSE"
}
fio_w() { settle; fio "${FIO_COMMON[@]}" --rw=write >"$WORK/fw.json" || die "fio write failed"; }
ds_w() { settle; "$BIN" bench "${DS_COMMON[@]}" --write-only "${WRITE_FLAGS[@]}" >"$WORK/dw.json" || die "deepnvme write failed"; }
fio_r() { settle; fio "${FIO_COMMON[@]}" --rw=read >"$WORK/fr.json" || die "fio read failed"; }
ds_r() { settle; "$BIN" bench "${DS_COMMON[@]}" --read-only "${READ_FLAGS[@]}" >"$WORK/dr.json" || die "deepnvme read failed"; }

printf '%-6s %-14s %14s %14s %14s %14s   (GB/s)\n' round "first" "fio write" "deepnvme write" "fio read" "deepnvme read"
FW=(); DW=(); FR=(); DR=(); FWC=(); DWC=(); FRC=(); DRC=()
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2 == 1)); then
        first=fio; fio_w; ds_w; fio_r; ds_r
    else
        first=deepnvme; ds_w; fio_w; ds_r; fio_r
    fi

    read -r g c < <(get fio "$WORK/fw.json" write); FW+=("$g"); FWC+=("$c")
    read -r g c < <(get deepnvme "$WORK/dw.json" write); DW+=("$g"); DWC+=("$c")
    read -r g c < <(get fio "$WORK/fr.json" read); FR+=("$g"); FRC+=("$c")
    read -r g c < <(get deepnvme "$WORK/dr.json" read); DR+=("$g"); DRC+=("$c")
    printf '%-6s %-14s %14.3f %14.3f %14.3f %14.3f\n' "$r" "$first" "${FW[-1]}" "${DW[-1]}" "${FR[-1]}" "${DR[-1]}"
done
((ROUNDS % 2 == 0)) || echo "fio_compare: note: an odd --rounds lets fio go first once more than deepnvme" >&2

python3 - "${FW[*]}" "${DW[*]}" "${FR[*]}" "${DR[*]}" "${FWC[*]}" "${DWC[*]}" "${FRC[*]}" "${DRC[*]}" <<'EOF'
import statistics, sys
fw, dw, fr, dr, fwc, dwc, frc, drc = ([float(x) for x in a.split()] for a in sys.argv[1:9])
med = statistics.median
# One ratio per round: the two adjacent runs of the same pair.
pw = [d / f for d, f in zip(dw, fw)]
pr = [d / f for d, f in zip(dr, fr)]
rw, rr = med(pw), med(pr)
print()
print(f"median over {len(fw)} rounds (GB/s, 1 GB = 10^9 bytes; CPU s/GB in brackets);")
print("deepnvme/fio: median [min-max] of the per-round ratios")
cell = lambda g, c: f"{g:.3f} [{c:.3f}]"
spread = lambda p: f"{med(p):.3f} [{min(p):.3f}-{max(p):.3f}]"
print(f"{'':6} {'fio':>16} {'deepnvme':>16} {'deepnvme/fio':>22}")
print(f"{'write':6} {cell(med(fw), med(fwc)):>16} {cell(med(dw), med(dwc)):>16} {spread(pw):>22}")
print(f"{'read':6} {cell(med(fr), med(frc)):>16} {cell(med(dr), med(drc)):>16} {spread(pr):>22}")
ok = rw >= 0.9 and rr >= 0.9
print("target (median ratio >= 0.9 for reads and writes):", "met" if ok else "NOT met")
sys.exit(0 if ok else 3)
EOF
