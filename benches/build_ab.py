#!/usr/bin/env python3
"""Two builds of deepnvme side by side in one run, in alternating order.

    python benches/build_ab.py --a OLD_VENV/bin/python --b NEW_VENV/bin/python \\
        [--rounds 6] [--size 512M] [--op-bytes 256M] [--dir DIR] [--out docs/perf/build_ab.md]

Each side is a long-lived `benches/ds_worker.py --impl deepnvme --serve`
process of its own interpreter (its own venv, its own installed build), so
the builds never share a process. Every round runs each cell once on each
side, the order flipping from round to round (this disk favours the second
run of a pair), with the page cache dropped and a pause before every run
(`run.Settle`). Cells: sync_pread / sync_pwrite of plain (bounced) and
locked tensors, 1 MiB blocks, queue depth 32, parallelism 1 and 2. Prints,
and with --out writes as markdown, the median and range of the per-round
ratios b/a of GB/s and of CPU s/GB.
"""

import argparse
import datetime
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import MiB, Settle, Worker, fmt_ratio, log, parse_size, ratio_stats  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="python of build A (the baseline)")
    p.add_argument("--b", required=True, help="python of build B")
    p.add_argument("--a-name", default="A")
    p.add_argument("--b-name", default="B")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--size", default="512M")
    p.add_argument("--op-bytes", default="256M")
    p.add_argument("--pause", type=float, default=0.5)
    p.add_argument("--dir", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    size, op_bytes = parse_size(a.size), parse_size(a.op_bytes)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dir_ = os.path.abspath(a.dir or os.path.join(root, "target", "perf"))
    os.makedirs(dir_, exist_ok=True)
    path = os.path.join(dir_, "build-ab.dat")
    with open(path, "wb") as f:  # laid out untimed, with bytes that are not all equal
        block = os.urandom(MiB)
        for _ in range(size // MiB):
            f.write(block)
    workers = {"a": Worker("deepnvme", a.a), "b": Worker("deepnvme", a.b)}
    for k, w in workers.items():
        log(f"build_ab: {k}: {w.hello}")
    settle = Settle(a.pause)
    cells = [dict(op=op, buffer=buf, par=par) for buf in ("plain", "locked") for op in ("write", "read") for par in (1, 2)]
    rows = []
    for c in cells:
        gb = {"a": [], "b": []}
        cpu = {"a": [], "b": []}
        for r in range(a.rounds):
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                settle()
                cfg = {"op": c["op"], "file": path, "size": size, "op_bytes": op_bytes, "block_size": MiB,
                       "queue_depth": 32, "parallelism": c["par"], "overlap_events": 1, "single_submit": 0,
                       "buffer": c["buffer"]}
                out = workers[side].run(cfg)
                gb[side].append(out["gb_per_s"])
                cpu[side].append(out["cpu_s_per_gb"])
        row = dict(c, gb=gb, cpu=cpu, gb_ratio=ratio_stats(gb["b"], gb["a"]), cpu_ratio=ratio_stats(cpu["b"], cpu["a"]))
        rows.append(row)
        log(f"build_ab: {c['op']} {c['buffer']} par {c['par']}: GB/s {a.b_name}/{a.a_name} {fmt_ratio(row['gb_ratio'])}, "
            f"CPU s/GB {fmt_ratio(row['cpu_ratio'])} (median GB/s {statistics.median(gb['a']):.2f} / "
            f"{statistics.median(gb['b']):.2f})")
    for w in workers.values():
        w.close()
    if a.out:
        lines = [f"# {a.b_name} against {a.a_name}, side by side", "",
                 f"{datetime.date.today()}: `python benches/build_ab.py --rounds {a.rounds} --size {a.size} "
                 f"--op-bytes {a.op_bytes}` (sync_pread/sync_pwrite of one {a.op_bytes} tensor per op, 1 MiB blocks, "
                 f"queue depth 32, overlap_events on; alternating order; page cache dropped before every run). "
                 f"Ratios are {a.b_name}/{a.a_name} per round: median [min–max].", "",
                 f"| op | buffer | par | {a.a_name} GB/s | {a.b_name} GB/s | GB/s ratio | CPU s/GB ratio |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['op']} | {r['buffer']} | {r['par']} | {statistics.median(r['gb']['a']):.2f} | "
                         f"{statistics.median(r['gb']['b']):.2f} | {fmt_ratio(r['gb_ratio'])} | {fmt_ratio(r['cpu_ratio'])} |")
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        log(f"build_ab: wrote {a.out}")


if __name__ == "__main__":
    main()
