#!/usr/bin/env python3
"""Why two harnesses disagree: one implementation, several ways of timing
it, side by side in alternating order (docs/perf/harnesses.md).

A variant is NAME=MODE:SIZE:OP_BYTES:WARMUP:PASSES:STAT, where MODE is
`serve` (a long-lived ds_worker.py --serve process, kept for the whole
probe, as benches/run.py keeps one), `fresh` (a process per run, as
benches/fresh_ratio.py starts one) or `bare` (benches/bare); STAT is `all`
(bytes over the timed loop's time, as run.py reports) or `median` (the
median op, as fresh_ratio.py reports).

    python benches/harness_probe.py --dir MOUNT --impl stock --op write \\
        --variant grid=serve:512M:128M:1:1:all --variant fresh=fresh:1G:1G:0:5:median

Each variant's file is laid out once (fio, one repeated byte 0x5a); every
run starts after syncfs, a page-cache drop (as root) and a pause.
--companion starts an idle long-lived worker of the other implementation
beside the probe's, as run.py's grid has one.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from run import Settle, Worker, parse_size  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--impl", default="stock", choices=("stock", "deepnvme"))
    ap.add_argument("--op", default="write", choices=("read", "write"))
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--block-size", default="1M")
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--buffer", default="locked", choices=("locked", "plain"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pause", type=float, default=0.3)
    ap.add_argument("--companion", action="store_true", help="keep an idle worker of the other implementation alive")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--bare-bin", default=os.path.join(ROOT, "target", "release", "bare"))
    a = ap.parse_args()

    variants = []
    for v in a.variant:
        name, spec = v.split("=", 1)
        mode, size, op_bytes, warmup, passes, stat = spec.split(":")
        variants.append(dict(name=name, mode=mode, size=parse_size(size), op_bytes=parse_size(op_bytes),
                             warmup=int(warmup), passes=int(passes), stat=stat))
    files = {}
    for v in variants:
        if v["size"] not in files:
            p = os.path.join(os.path.abspath(a.dir), f"probe-{v['size']}.dat")
            subprocess.run(["fio", "--name=layout", f"--filename={p}", "--direct=1", "--ioengine=io_uring",
                            "--rw=write", f"--size={v['size']}", "--bs=1M", "--iodepth=32", "--buffer_pattern=0x5a",
                            "--scramble_buffers=0"], check=True, capture_output=True)
            files[v["size"]] = p
    os.environ["PATH"] = os.path.dirname(a.python) + os.pathsep + os.environ["PATH"]
    worker = Worker(a.impl, a.python) if any(v["mode"] == "serve" for v in variants) else None
    companion = Worker("deepnvme" if a.impl == "stock" else "stock", a.python) if a.companion else None
    settle = Settle(a.pause, [a.dir])
    gb = {v["name"]: [] for v in variants}
    cpu = {v["name"]: [] for v in variants}
    runs = {v["name"]: [] for v in variants}

    def cfg(v):
        return {"op": a.op, "file": files[v["size"]], "size": v["size"], "op_bytes": v["op_bytes"],
                "block_size": parse_size(a.block_size), "queue_depth": a.queue_depth, "parallelism": a.parallelism,
                "overlap_events": 1, "single_submit": 0, "buffer": a.buffer, "warmup": v["warmup"],
                "passes": v["passes"]}

    def one(v, rnd):
        c = cfg(v)
        if v["mode"] == "serve":
            d = worker.run(c)
        elif v["mode"] == "fresh":
            cmd = [a.python, os.path.join(HERE, "ds_worker.py"), "--impl", a.impl]
            for k, x in c.items():
                cmd += [f"--{k.replace('_', '-')}", str(x)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, DEEPNVME_LOG="quiet"))
            if r.returncode != 0:
                raise SystemExit(f"harness_probe: {' '.join(cmd)}:\n{r.stderr[-2000:]}")
            d = json.loads(r.stdout.strip().splitlines()[-1])
        else:
            cmd = [a.bare_bin, "--file", c["file"], "--op", a.op, "--size", str(c["size"]), "--op-bytes",
                   str(c["op_bytes"]), "--block-size", str(c["block_size"]), "--queue-depth", str(a.queue_depth),
                   "--parallelism", str(a.parallelism), "--passes", str(v["passes"]),
                   "--engines", "uring,psync" if rnd % 2 == 0 else "psync,uring"] + ([] if v["warmup"] else ["--no-warmup"])
            r = subprocess.run(cmd, capture_output=True, text=True, check=True)
            full = json.loads(r.stdout)
            d = max(full["engines"].values(), key=lambda e: e["gb_per_s"])
        return (d["gb_per_s_median_op"] if v["stat"] == "median" else d["gb_per_s"]), d["cpu_s_per_gb"], \
            d.get("physical_runs")

    for rnd in range(a.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for v in order:
            settle()
            g, c, r = one(v, rnd)
            gb[v["name"]].append(g)
            cpu[v["name"]].append(c)
            runs[v["name"]].append(r)
        print(f"round {rnd + 1} load {os.getloadavg()[0]:.2f}: "
              + "  ".join(f"{v['name']} {gb[v['name']][-1]:.2f} ({cpu[v['name']][-1]:.3f} s/GB"
                        + (f", {runs[v['name']][-1]} physical runs" if runs[v["name"]][-1] is not None else "") + ")"
                        for v in variants),
              flush=True)
    base = variants[0]["name"]
    print(f"\n{a.impl} {a.op} {a.buffer} bs {a.block_size} qd {a.queue_depth} par {a.parallelism}, {a.rounds} rounds"
          f"{', companion worker alive' if a.companion else ''}; load now {os.getloadavg()[0]:.2f}")
    for v in variants:
        n = v["name"]
        rs = [x / y for x, y in zip(gb[n], gb[base])]
        print(f"  {n:>12}: median {statistics.median(gb[n]):.2f} GB/s [{min(gb[n]):.2f}-{max(gb[n]):.2f}], "
              f"CPU {statistics.median(cpu[n]):.3f} s/GB, /{base} {statistics.median(rs):.2f} [{min(rs):.2f}-{max(rs):.2f}]")
    for w in (worker, companion):
        if w:
            w.close()
    for p in files.values():
        os.unlink(p)


if __name__ == "__main__":
    main()
