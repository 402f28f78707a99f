#!/usr/bin/env python3
"""The second harness: every run a fresh process, one tensor, every op timed.

Where `benches/run.py` keeps one worker process per implementation and
moves a file in ops at increasing offsets, this moves one tensor of
--op-bytes (1 GiB by default) to offset 0 of a file of that size --passes
times, each run in a process of its own (`ds_worker.py` without --serve,
`bare` for the limit), and reports the median op's GB/s. Both harnesses
should give the same ratios; docs/perf/harnesses.md says where and why
they did not.

    python benches/fresh_ratio.py --dir MOUNT --rounds 4 \\
        [--cells write:1M:32:1,read:1M:32:1,write:1M:32:2,read:1M:32:2]

Order alternates per round (odd rounds as listed, even rounds reversed),
with syncfs of --dir, a page-cache drop (as root) and a pause before every
run. The file is laid out once with fio, filled with one repeated byte
(0x5a, what every participant's buffer holds: zram stores such pages
without compressing them).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from run import Settle, parse_size, ratio_stats, fmt_ratio, show_size  # noqa: E402


def parse_cells(text):
    cells = []
    for part in text.split(","):
        op, bs, qd, par = part.split(":")
        cells.append(dict(op=op, bs=parse_size(bs), qd=int(qd), par=int(par)))
    return cells


def label(c):
    return f"{c['op'][0].upper()} {show_size(c['bs']).replace(' ', '').replace('iB', '')} q{c['qd']} p{c['par']}"


def run_worker(a, impl, c, path):
    cmd = [a.python, os.path.join(HERE, "ds_worker.py"), "--impl", impl, "--op", c["op"], "--file", path,
           "--size", str(a.op_bytes), "--op-bytes", str(a.op_bytes), "--block-size", str(c["bs"]),
           "--queue-depth", str(c["qd"]), "--parallelism", str(c["par"]), "--buffer", "locked",
           "--passes", str(a.passes), "--warmup", "0"]
    env = dict(os.environ, DEEPNVME_LOG="quiet", PATH=os.path.dirname(a.python) + os.pathsep + os.environ["PATH"])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"fresh_ratio: {' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return {"gb_per_s": d["gb_per_s_median_op"], "cpu_s_per_gb": d["cpu_s_per_gb"], "all": d["gb_per_s"],
            "physical_runs": d.get("physical_runs")}


def run_bare(a, c, path, rnd):
    cmd = [a.bare_bin, "--file", path, "--op", c["op"], "--size", str(a.op_bytes), "--op-bytes", str(a.op_bytes),
           "--block-size", str(c["bs"]), "--queue-depth", str(c["qd"]), "--parallelism", str(c["par"]),
           "--passes", str(a.passes), "--no-warmup", "--engines", "uring,psync" if rnd % 2 == 0 else "psync,uring"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"fresh_ratio: {' '.join(cmd)} failed: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    best = max(d["engines"], key=lambda k: d["engines"][k]["gb_per_s_median_op"])
    e = d["engines"][best]
    return {"gb_per_s": e["gb_per_s_median_op"], "cpu_s_per_gb": e["cpu_s_per_gb"], "all": e["gb_per_s"], "best": best}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="where the test file goes (e.g. ext4 on zram)")
    ap.add_argument("--op-bytes", default="1G", help="the tensor and the file [1G]")
    ap.add_argument("--passes", type=int, default=5, help="timed ops per run [5]")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cells", default="write:1M:32:1,read:1M:32:1,write:1M:32:2,read:1M:32:2")
    ap.add_argument("--impls", default="stock,deepnvme,bare")
    ap.add_argument("--pause", type=float, default=0.3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--bare-bin", default=os.path.join(ROOT, "target", "release", "bare"))
    ap.add_argument("--json", default=None, help="write every run here")
    a = ap.parse_args()
    a.op_bytes = parse_size(a.op_bytes)
    cells, impls = parse_cells(a.cells), a.impls.split(",")
    path = os.path.join(os.path.abspath(a.dir), "fresh-ratio.dat")
    subprocess.run(["fio", "--name=layout", f"--filename={path}", "--direct=1", "--ioengine=io_uring", "--rw=write",
                    f"--size={a.op_bytes}", "--bs=1M", "--iodepth=32", "--buffer_pattern=0x5a", "--scramble_buffers=0"],
                   check=True, capture_output=True)
    settle = Settle(a.pause, [a.dir])
    load = [os.getloadavg()[0]]
    results = []
    t_start = time.time()
    for c in cells:
        gb = {i: [] for i in impls}
        cpu = {i: [] for i in impls}
        phys = {i: [] for i in impls if i != "bare"}
        for rnd in range(a.rounds):
            order = impls if rnd % 2 == 0 else impls[::-1]
            for impl in order:
                settle()
                out = run_bare(a, c, path, rnd) if impl == "bare" else run_worker(a, impl, c, path)
                gb[impl].append(out["gb_per_s"])
                cpu[impl].append(out["cpu_s_per_gb"])
                if impl in phys:
                    phys[impl].append(out["physical_runs"])
            print(f"{label(c)} round {rnd + 1} ({' '.join(order)}), load {os.getloadavg()[0]:.2f}: "
                  + "  ".join(f"{i} {gb[i][-1]:.2f}" for i in impls), flush=True)
        load.append(os.getloadavg()[0])
        results.append({**c, "label": label(c), "gb_per_s": gb, "cpu_s_per_gb": cpu, "physical_runs": phys})
    print(f"\nfresh_ratio: {show_size(a.op_bytes)} tensor, {a.passes} ops per run (median op), {a.rounds} rounds, "
          f"{time.time() - t_start:.0f} s, load average {', '.join(f'{x:.2f}' for x in load)}")
    pairs = [(x, y) for x, y in (("deepnvme", "stock"), ("deepnvme", "bare"), ("stock", "bare")) if x in impls and y in impls]
    print("| cell | " + " | ".join(f"{i} GB/s" for i in impls) + " | " + " | ".join(f"{x}/{y}" for x, y in pairs)
          + " | CPU s/GB " + " / ".join(impls) + " |")
    print("|---|" + "---:|" * (len(impls) + len(pairs) + 1))
    for r in results:
        g, cp = r["gb_per_s"], r["cpu_s_per_gb"]
        print(f"| {r['label']} | " + " | ".join(f"{statistics.median(g[i]):.2f}" for i in impls) + " | "
              + " | ".join(fmt_ratio(ratio_stats(g[x], g[y])) for x, y in pairs) + " | "
              + " / ".join(f"{statistics.median(cp[i]):.3f}" for i in impls) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items()}, "load": load, "cells": results}, f, indent=1)
    os.unlink(path)


if __name__ == "__main__":
    main()
