#!/usr/bin/env python3
"""Two builds of deepnvme side by side in one run, in alternating order.

    python benches/build_ab.py --a OLD_VENV/bin/python --b NEW_VENV/bin/python \\
        [--rounds 6] [--size 512M] [--op-bytes 256M] [--dir DIR] [--out docs/perf/build_ab.md] \\
        [--a-env K=V ...] [--b-env K=V ...] [--fresh-workers]

Both sides may be one build: `--a-env DEEPNVME_HUGE_PAGES=0` compares a
knob's settings. `--fresh-workers` starts a new pair of worker processes
every round: plain (bounced) cells' GB/s is set by the process as much
as by the build on this machine (docs/perf/structure_ab.md).

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
    p.add_argument("--a-env", action="append", default=[], metavar="K=V", help="environment of side a's worker")
    p.add_argument("--b-env", action="append", default=[], metavar="K=V", help="environment of side b's worker")
    p.add_argument("--fresh-workers", action="store_true", help="a new pair of worker processes every round")
    a = p.parse_args()
    envs = {side: dict(kv.split("=", 1) for kv in getattr(a, f"{side}_env")) for side in ("a", "b")}
    pythons = {"a": a.a, "b": a.b}
    size, op_bytes = parse_size(a.size), parse_size(a.op_bytes)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dir_ = os.path.abspath(a.dir or os.path.join(root, "target", "perf"))
    os.makedirs(dir_, exist_ok=True)
    path = os.path.join(dir_, "build-ab.dat")
    with open(path, "wb") as f:  # laid out untimed, with bytes that are not all equal
        block = os.urandom(MiB)
        for _ in range(size // MiB):
            f.write(block)
    def start_workers():
        started = {side: Worker("deepnvme", pythons[side], envs[side]) for side in ("a", "b")}
        for k, w in started.items():
            log(f"build_ab: {k}: {w.hello}")
        return started

    workers = start_workers()
    settle = Settle(a.pause)
    cells = [dict(op=op, buffer=buf, par=par) for buf in ("plain", "locked") for op in ("write", "read") for par in (1, 2)]
    gb = [{"a": [], "b": []} for _ in cells]
    cpu = [{"a": [], "b": []} for _ in cells]
    for r in range(a.rounds):
        if a.fresh_workers and r > 0:
            for w in workers.values():
                w.close()
            workers = start_workers()
        for i, c in enumerate(cells):
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                settle()
                cfg = {"op": c["op"], "file": path, "size": size, "op_bytes": op_bytes, "block_size": MiB,
                       "queue_depth": 32, "parallelism": c["par"], "overlap_events": 1, "single_submit": 0,
                       "buffer": c["buffer"]}
                out = workers[side].run(cfg)
                gb[i][side].append(out["gb_per_s"])
                cpu[i][side].append(out["cpu_s_per_gb"])
    rows = []
    for i, c in enumerate(cells):
        row = dict(c, gb=gb[i], cpu=cpu[i], gb_ratio=ratio_stats(gb[i]["b"], gb[i]["a"]),
                   cpu_ratio=ratio_stats(cpu[i]["b"], cpu[i]["a"]))
        rows.append(row)
        log(f"build_ab: {c['op']} {c['buffer']} par {c['par']}: GB/s {a.b_name}/{a.a_name} {fmt_ratio(row['gb_ratio'])}, "
            f"CPU s/GB {fmt_ratio(row['cpu_ratio'])} (median GB/s {statistics.median(gb[i]['a']):.2f} / "
            f"{statistics.median(gb[i]['b']):.2f})")
    for w in workers.values():
        w.close()
    if a.out:
        flags = "".join(f" --{side}-env {kv}" for side in ("a", "b") for kv in getattr(a, f"{side}_env"))
        flags += " --fresh-workers" if a.fresh_workers else ""
        lines = [f"# {a.b_name} against {a.a_name}, side by side", "",
                 f"{datetime.date.today()}: `python benches/build_ab.py --rounds {a.rounds} --size {a.size} "
                 f"--op-bytes {a.op_bytes}{flags}` (sync_pread/sync_pwrite of one {a.op_bytes} tensor per op, 1 MiB blocks, "
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
