"""Bounce path against locked memory, side by side in one run.

    python benches/bounce_ratio.py [--size-mb 256] [--rounds 5] [--parallelism 1] [--dir DIR]

Writes and reads SIZE MiB through DeepSpeed's loader (deepnvme's aio_handle,
block 1 MiB, queue depth 32, overlap_events on) from a plain
CPU tensor (torch.empty: bounced) and from a locked tensor
(new_cpu_locked_tensor: direct), alternating which goes first in each round,
with the page cache dropped (as root) and a pause before every run. Prints
GB/s and CPU seconds per GB for each, and the median and spread of the
per-round ratios plain/locked. Run it as `python benches/bounce_ratio.py`
with the venv that `bindings/install.sh` made.
"""

import argparse
import os
import statistics
import time

import torch
from bench_common import cpu_seconds, drop_caches
from deepspeed.ops.op_builder import AsyncIOBuilder


def timed(fn):
    drop_caches()
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallelism", type=int, default=1, help="intra_op_parallelism")
    ap.add_argument("--dir", default=".")
    ap.add_argument("--verbose", action="store_true", help="print every run")
    args = ap.parse_args()
    n = args.size_mb << 20
    aio = AsyncIOBuilder().load()
    h = aio.aio_handle(1 << 20, 32, False, True, args.parallelism)
    locked = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    plain = torch.empty(n, dtype=torch.uint8)
    locked.random_(0, 255)
    plain.copy_(locked)
    path = os.path.join(os.path.abspath(args.dir), f"bounce-ratio-{os.getpid()}.bin")
    gb = n / 1e9
    results = {(kind, d): [] for kind in ("plain", "locked") for d in ("write", "read")}
    try:
        h.sync_pwrite(locked, path)  # the file exists at full size before any read
        # Untimed: the first bounced op of a process faults its staging buffer
        # in (the pool keeps it for every later op, as in a training run).
        h.sync_pwrite(plain, path)
        h.sync_pread(plain, path)
        for r in range(args.rounds):
            order = ("plain", "locked") if r % 2 == 0 else ("locked", "plain")
            for d in ("write", "read"):
                for kind in order:
                    buf = plain if kind == "plain" else locked
                    op = h.sync_pwrite if d == "write" else h.sync_pread
                    wall, cpu = timed(lambda: op(buf, path))
                    results[(kind, d)].append((gb / wall, cpu / gb))
                    if args.verbose:
                        print(f"round {r} {d:5} {kind:6}: {gb / wall:.3f} GB/s, {cpu / gb:.3f} CPU s/GB", flush=True)
        for d in ("write", "read"):
            ratios = [p[0] / l[0] for p, l in zip(results[("plain", d)], results[("locked", d)])]
            for kind in ("plain", "locked"):
                runs = results[(kind, d)]
                print(f"{d:5} {kind:6}: {statistics.median(r[0] for r in runs):.3f} GB/s, "
                      f"{statistics.median(r[1] for r in runs):.3f} CPU s/GB (median of {len(runs)})")
            print(f"{d:5} plain/locked: median {statistics.median(ratios):.3f}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f}")
    finally:
        h.free_cpu_locked_tensor(locked)
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
