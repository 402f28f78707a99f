#!/usr/bin/env bash
# benches/cli_ab.sh: builds of the `deepnvme` CLI side by side, to check
# that a change costs nothing (docs/perf/history.md has the results).
#
#   benches/cli_ab.sh [--rounds N] [--dir DIR] BIN_A BIN_B [BIN_C ...]
#
# Each round runs `deepnvme bench` of every build on two cells (64 KiB ops
# over 256 MiB; 256 MiB ops over 1 GiB at parallelism 2), in an order that
# rotates every round so that each build goes first and last equally often.
# Prints, per cell and direction, each build's GB/s and CPU s/GB over the
# first build's: median [min-max] of per-round ratios. DIR [/dev/shm]:
# tmpfs keeps the disk out of it, so what is left is the core's own cost.
set -euo pipefail

ROUNDS=6
DIR=/dev/shm
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
[[ $# -ge 2 ]] || { echo "cli_ab.sh: give two builds or more (see --help)" >&2; exit 2; }
BINS=("$@")
WORK=$(mktemp -d "$DIR/cli-ab.XXXXXX")
OUT=$(mktemp -d)
trap 'rm -rf "$WORK" "$OUT"' EXIT

n=${#BINS[@]}
for cell in "small:--size 256M --buffer-size 64K -b 64K" "large:--size 1G --buffer-size 256M -b 1M -p 2"; do
    name=${cell%%:*}
    read -r -a args <<< "${cell#*:}"
    for ((r = 0; r < ROUNDS; r++)); do
        for ((k = 0; k < n; k++)); do
            # Rotate by the round, and reverse every other round.
            i=$(( (k + r) % n )); (( r % 2 )) && i=$(( n - 1 - i ))
            DEEPNVME_LOG=quiet "${BINS[$i]}" bench --dir "$WORK" "${args[@]}" --json -q > "$OUT/$name-$r-$i.json"
        done
    done
done

python3 - "$OUT" "$ROUNDS" "${BINS[@]}" <<'PY'
import json, statistics as st, sys
out, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for name in ("small", "large"):
    for d in ("write", "read"):
        for i in range(1, len(bins)):
            gb, cpu = [], []
            for r in range(rounds):
                a = json.load(open(f"{out}/{name}-{r}-0.json"))[d]
                b = json.load(open(f"{out}/{name}-{r}-{i}.json"))[d]
                gb.append(b["gb_per_s_mean"] / a["gb_per_s_mean"])
                cpu.append(b["cpu_s_per_gb"] / a["cpu_s_per_gb"])
            print(f"{name} {d} {bins[i]} / {bins[0]}: GB/s {st.median(gb):.3f} [{min(gb):.3f}-{max(gb):.3f}], "
                  f"CPU s/GB {st.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}]")
PY
