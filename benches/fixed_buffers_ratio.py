"""io_uring fixed buffers on against off, side by side in one run.

    python3 benches/fixed_buffers_ratio.py [--size 1G] [--rounds 6] [--dir DIR]
        [--queue-depth 32] [--block-size 1M] [--parallelism 1] [--cli PATH]

Runs `deepnvme bench` (locked buffers, O_DIRECT, overlap_events on) on one
file with DEEPNVME_FIXED_BUFFERS=1 and =0, alternating which goes first in
each round, with a sync, a page-cache drop (as root) and a pause before every
run. Prints GB/s and CPU seconds per GB (user + system, whole process) for
each, and the median and spread of the per-round ratios on/off. Needs only
the CLI (`cargo build --release`) and Python's standard library.
"""

import argparse
import json
import os
import statistics
import subprocess

from bench_common import drop_caches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cli, fixed, args, path):
    drop_caches()
    cmd = [cli, "bench", "--json", "-q", "--keep", "-f", path, "-s", args.size, "--buffer-size", args.buffer_size,
           "-b", args.block_size, "--queue-depth", str(args.queue_depth), "--overlap-events",
           "-p", str(args.parallelism)]
    env = dict(os.environ, DEEPNVME_FIXED_BUFFERS="1" if fixed else "0")
    out = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    return {d: (out[d]["gb_per_s_best"], out[d]["cpu_s_per_gb"]) for d in ("write", "read")}


def spread(xs):
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1G", help="bytes per pass (the file's size)")
    ap.add_argument("--buffer-size", default="256M", help="bytes per op")
    ap.add_argument("--block-size", default="1M")
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6, help="keep it even: each side goes first as often")
    ap.add_argument("--dir", default=os.path.join(ROOT, "target", "perf"))
    ap.add_argument("--cli", default=os.path.join(ROOT, "target", "release", "deepnvme"))
    ap.add_argument("--verbose", action="store_true", help="print every run")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "fixed-buffers-ratio.bin")
    runs = {True: [], False: []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for fixed in order:
            runs[fixed].append(run(args.cli, fixed, args, path))
            if args.verbose:
                print(f"round {r} fixed={int(fixed)}: {runs[fixed][-1]}", flush=True)
    os.unlink(path)
    print(f"deepnvme bench, locked buffers, {args.size} per pass, ops of {args.buffer_size}, block {args.block_size}, "
          f"qd {args.queue_depth}, parallelism {args.parallelism}, {args.rounds} alternating rounds")
    print(f"{'direction':<10}{'fixed GB/s':>18}{'plain GB/s':>18}{'ratio on/off':>20}"
          f"{'fixed CPU s/GB':>20}{'plain CPU s/GB':>20}{'CPU ratio':>20}")
    for d in ("write", "read"):
        on = [x[d] for x in runs[True]]
        off = [x[d] for x in runs[False]]
        gbs = [a[0] / b[0] for a, b in zip(on, off)]
        cpu = [a[1] / b[1] for a, b in zip(on, off) if b[1] > 0]
        print(f"{d:<10}{spread([x[0] for x in on]):>18}{spread([x[0] for x in off]):>18}{spread(gbs):>20}"
              f"{spread([x[1] for x in on]):>20}{spread([x[1] for x in off]):>20}{spread(cpu) if cpu else '-':>20}")


if __name__ == "__main__":
    main()
