"""Bounce path against locked memory, side by side in one run, op by op.

    python benches/bounce_ratio.py [--size-mb 1024] [--op-mb 128] [--rounds 8]
                                   [--parallelism 1] [--dir DIR] [--constant] [--verbose]

Writes and reads a SIZE MiB file through DeepSpeed's loader (deepnvme's
aio_handle, block 1 MiB, queue depth 32, overlap_events on) in blocking ops
of OP MiB, from a plain CPU tensor (torch.empty: bounced) and from a locked
tensor (new_cpu_locked_tensor: direct). The two alternate op by op on the
same file range, which goes first flipping from op to op and round to round
(this disk favours the second run of a pair, and its speed drifts over
seconds: pairs of whole passes were noisier than the effects measured).
The page cache is dropped (as root) and a pause taken before each round;
the file is read and written with O_DIRECT, so the runs are warm in the
sense of docs/perf: the device's own caches are whatever the previous op
left. `--constant` fills the tensors with one byte value instead of random
bytes, as the fast-device tier does on zram (which then stores the pages
without compressing them). Prints GB/s and CPU seconds per GB for each, and plain/locked: over
all ops, and the median and range of the per-round ratios. Run it as
`python benches/bounce_ratio.py` with the venv that `bindings/install.sh`
made.
"""

import argparse
import os
import statistics
import time

import torch
from bench_common import cpu_seconds, drop_caches
from deepspeed.ops.op_builder import AsyncIOBuilder


def timed(fn):
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="the file")
    ap.add_argument("--op-mb", type=int, default=128, help="one blocking op")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--parallelism", type=int, default=1, help="intra_op_parallelism")
    ap.add_argument("--dir", default=".")
    ap.add_argument("--constant", action="store_true", help="one byte value, not random bytes (zram)")
    ap.add_argument("--verbose", action="store_true", help="print every round")
    args = ap.parse_args()
    n, size = args.op_mb << 20, args.size_mb << 20
    if size < n or size % n:
        ap.error("--size-mb must be a multiple of --op-mb")
    aio = AsyncIOBuilder().load()
    h = aio.aio_handle(1 << 20, 32, False, True, args.parallelism)
    locked = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    plain = torch.empty(n, dtype=torch.uint8)
    if args.constant:
        locked.fill_(0x5A)
    else:
        locked.random_(0, 255)
    plain.copy_(locked)
    path = os.path.join(os.path.abspath(args.dir), f"bounce-ratio-{os.getpid()}.bin")
    buffers = {"plain": plain, "locked": locked}
    # [direction][kind] -> per round (seconds, CPU seconds) summed over its ops
    rounds = {d: {k: [] for k in buffers} for d in ("write", "read")}
    try:
        for off in range(0, size, n):  # the file exists at full size before any read
            h.sync_pwrite(locked, path, off)
        # Untimed: the first bounced op of a process faults its windows in
        # (the pool keeps them for every later op, as in a training run).
        h.sync_pwrite(plain, path, 0)
        h.sync_pread(plain, path, 0)
        for r in range(args.rounds):
            for d in ("write", "read"):
                drop_caches()
                op = h.sync_pwrite if d == "write" else h.sync_pread
                spent = {k: [0.0, 0.0] for k in buffers}
                for i, off in enumerate(range(0, size, n)):
                    order = ("plain", "locked") if (r + i) % 2 == 0 else ("locked", "plain")
                    for kind in order:
                        wall, cpu = timed(lambda: op(buffers[kind], path, off))
                        spent[kind][0] += wall
                        spent[kind][1] += cpu
                for kind in buffers:
                    rounds[d][kind].append(tuple(spent[kind]))
                if args.verbose:
                    gbs = {k: size / 1e9 / spent[k][0] for k in buffers}
                    print(f"round {r} {d:5}: plain {gbs['plain']:.3f}, locked {gbs['locked']:.3f} GB/s, "
                          f"plain/locked {gbs['plain'] / gbs['locked']:.3f}", flush=True)
        gb = size / 1e9
        for d in ("write", "read"):
            for kind in buffers:
                runs = rounds[d][kind]
                print(f"{d:5} {kind:6}: {statistics.median(gb / s for s, _ in runs):.3f} GB/s, "
                      f"{statistics.median(c / gb for _, c in runs):.3f} CPU s/GB (median of {len(runs)} rounds)")
            ratios = [l_[0] / p[0] for p, l_ in zip(rounds[d]["plain"], rounds[d]["locked"])]
            total = sum(s for s, _ in rounds[d]["locked"]) / sum(s for s, _ in rounds[d]["plain"])
            print(f"{d:5} plain/locked: all ops {total:.3f}; per round median {statistics.median(ratios):.3f}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f} (parallelism {args.parallelism})")
    finally:
        h.free_cpu_locked_tensor(locked)
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
