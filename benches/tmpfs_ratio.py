#!/usr/bin/env python3
"""deepnvme against DeepSpeed's stock async_io op on a tmpfs file, side by side.

    python benches/tmpfs_ratio.py --dir /mnt/tmpfs [--rounds 12] [--size 512M] [--cell read:2 ...]

Locked tensors, 1 MiB blocks, queue depth 32, 128 MiB ops, write and read at
intra_op_parallelism 1 and 2: the cells where deepnvme's engine per file
(`src/engine/choice.rs`: psync for files on tmpfs) meets the stock op's
libaio, whose io_submit does a tmpfs file's copies inline. Each
implementation is a long-lived `benches/ds_worker.py` worker (run it with
the venv's python, as `benches/run.sh` does, and with TORCH_EXTENSIONS_DIR
where the stock op's JIT build is cached); the order goes through all six
permutations every six rounds, and every run follows a syncfs of the tmpfs, a drop of the page
cache and a pause. Prints the median [min-max] of the per-round ratios of
GB/s and of CPU seconds per GB.

A third participant, `bare`, is this script itself moving each op with one
pwrite (or preadv) per worker the handle has (intra_op_parallelism), each
from a thread of its own over its slice of the op, into memory on
transparent huge pages as deepnvme's locked tensors are: the kernel's own
rate for one file with that many threads. A write cannot pass one thread's
rate (tmpfs takes the file's inode lock for the whole copy); a read with
as many threads as cores is what the cores can copy.
"""

import argparse
import concurrent.futures
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import cpu_seconds  # noqa: E402
from run import MiB, Settle, Worker, fio_json, fmt_ratio, med, parse_size, ratio_stats  # noqa: E402


class Bare:
    """One pwrite/preadv per slice, a thread per slice, opening the file per
    op as DeepSpeed's sync calls do, into a huge-page mapping."""

    def __init__(self, op_bytes):
        self.buf = mmap.mmap(-1, op_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.buf.madvise(mmap.MADV_HUGEPAGE)
        self.buf.write(b"\x5a" * op_bytes)
        self.view = memoryview(self.buf)

    def run(self, cfg):
        op, path, size, n = cfg["op"], cfg["file"], cfg["size"], cfg["op_bytes"]
        par = max(1, cfg["parallelism"])
        flags = (os.O_WRONLY if op == "write" else os.O_RDONLY) | os.O_DIRECT
        step = -(-n // par) + 4095 & ~4095  # page-aligned slices, as deepnvme cuts them
        slices = [(s, min(step, n - s)) for s in range(0, n, step)]

        def one_slice(fd, off, s, length):
            part = self.view[s:s + length]
            done = os.pwrite(fd, part, off + s) if op == "write" else os.preadv(fd, [part], off + s)
            if done != length:
                raise RuntimeError(f"bare {op} at {off + s}: {done} of {length} bytes")

        def one(pool, off):
            fd = os.open(path, flags)
            try:
                # (os.pwrite and os.preadv release the GIL: the slices run at once.)
                for f in [pool.submit(one_slice, fd, off, s, length) for s, length in slices]:
                    f.result()
            finally:
                os.close(fd)

        with concurrent.futures.ThreadPoolExecutor(max_workers=par) as pool:
            one(pool, 0)  # untimed, as ds_worker's first op
            c0, t0 = cpu_seconds(), time.perf_counter()
            for off in range(0, size, n):
                one(pool, off)
            secs, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        return {"gb_per_s": size / secs / 1e9, "cpu_s_per_gb": cpu / (size / 1e9)}

    def close(self):
        self.view.release()
        self.buf.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="a directory on tmpfs")
    p.add_argument("--rounds", type=int, default=12, help="a multiple of 6 keeps the orders balanced")
    p.add_argument("--size", default="512M")
    p.add_argument("--cell", action="append", default=[], metavar="OP:PAR",
                   help="only this cell (write:1, read:2, ...); repeatable; default: all four")
    a = p.parse_args()
    size = parse_size(a.size)
    path = os.path.join(os.path.abspath(a.dir), "tmpfs-ratio.dat")
    fio_json(["--name=layout", f"--filename={path}", "--direct=0", "--ioengine=psync", "--rw=write",
              f"--size={size}", "--bs=1M"])
    workers = {"stock": Worker("stock", sys.executable), "deepnvme": Worker("deepnvme", sys.executable),
               "bare": Bare(128 * MiB)}
    settle = Settle(0.3, [a.dir])
    try:
        cells = [(op, par) for op in ("write", "read") for par in (1, 2)]
        if a.cell:
            wanted = [(c.split(":")[0], int(c.split(":")[1])) for c in a.cell]
            cells = [c for c in cells if c in wanted]
        for op, par in cells:
            gb = {k: [] for k in workers}
            cpu = {k: [] for k in workers}
            for r in range(a.rounds):
                # The three in rotation, each first and last in turn.
                order = list(workers)[r % 3:] + list(workers)[:r % 3]
                for k in order if r % 2 == 0 else order[::-1]:
                    settle()
                    out = workers[k].run({"op": op, "file": path, "size": size, "op_bytes": 128 * MiB,
                                          "block_size": MiB, "queue_depth": 32, "parallelism": par,
                                          "overlap_events": 1, "single_submit": 0, "buffer": "locked"})
                    gb[k].append(out["gb_per_s"])
                    cpu[k].append(out["cpu_s_per_gb"])
            print(f"tmpfs {op} p{par} locked: stock {med(gb['stock']):.2f}, deepnvme {med(gb['deepnvme']):.2f} GB/s; "
                  f"deepnvme/stock {fmt_ratio(ratio_stats(gb['deepnvme'], gb['stock']))}, "
                  f"CPU per GB {fmt_ratio(ratio_stats(cpu['deepnvme'], cpu['stock']))}; "
                  f"bare {med(gb['bare']):.2f} GB/s, deepnvme/bare {fmt_ratio(ratio_stats(gb['deepnvme'], gb['bare']))}, "
                  f"stock/bare {fmt_ratio(ratio_stats(gb['stock'], gb['bare']))}", flush=True)
    finally:
        for w in workers.values():
            w.close()
        os.unlink(path)


if __name__ == "__main__":
    main()
