#!/usr/bin/env python3
"""DeepSpeed's own benchmark tool, ds_io, on deepnvme and on DeepSpeed's
stock op, side by side with `deepnvme bench` on the same file system.

  stock     ds_io with DEEPNVME_DEEPSPEED_HOOK=0: DeepSpeed's async_io (libaio),
            JIT-built from the installed deepspeed (needs libaio-dev; cached in
            the venv's deepnvme-torch-extensions, shared with the tests);
  deepnvme  the same ds_io command with the hook on: deepnvme's async_io;
  cli       `deepnvme bench` with the same size, block size, queue depth and
            parallelism (locked memory only: it has no unpinned mode), reading
            ds_io's read file and writing a file removed first, as ds_io does.

Each round runs every implementation once per (memory, direction), in the
listed order on odd rounds and reversed on even rounds, with sync, a page
cache drop (as root) and a pause before every run. ds_io reports GiB/s
(its "GB" is 2^30 bytes); everything here is 10^9 bytes per second. ds_io's
number is its E2E speed over --loops timed passes after one warm-up pass,
inside a process started per run (startup and the JIT load are not timed).

    python benches/ds_io_compare.py --size 256M --rounds 4 --write-docs
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

from bench_common import drop_caches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def ds_io(a, impl, memory, op, folder):
    env = dict(os.environ, DEEPNVME_LOG="quiet", PATH=os.path.dirname(a.python) + os.pathsep + os.environ["PATH"],
               TORCH_EXTENSIONS_DIR=os.path.join(os.path.dirname(os.path.dirname(a.python)), "deepnvme-torch-extensions"))
    env["DEEPNVME_DEEPSPEED_HOOK"] = "0" if impl == "stock" else "1"
    env.pop("DEEPNVME_OPS", None)
    cmd = [os.path.join(os.path.dirname(a.python), "ds_io"), "--folder", folder, "--io_size", str(a.size),
           "--block_size", str(a.block_size), "--queue_depth", str(a.queue_depth), "--io_parallel", str(a.parallelism),
           "--loops", str(a.loops), "--warmup_loops", "1"]
    if op == "read":
        cmd.append("--read")
    if memory == "plain":
        cmd.append("--use_accelerator_pin_memory")  # the CPU accelerator's pin_memory leaves the tensor unpinned
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(rf"^E2E {op.capitalize()} Speed = ([0-9.e+-]+) GB/sec$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        raise SystemExit(f"ds_io_compare: {impl} {' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return float(m.group(1)) * GIB / 1e9


def cli(a, op, folder):
    # The files ds_io uses: its read file (made once by dd), and for writes a
    # file removed first, as ds_io removes its own (a write then allocates).
    path = os.path.join(folder, f"_aio_read_{a.size}.pt.0_0" if op == "read" else "_deepnvme_bench_write.dat")
    if op == "write" and os.path.exists(path):
        os.remove(path)
    cmd = [a.cli, "bench", "--file", path, "--keep", "--size", str(a.size), "--buffer-size", str(a.size),
           "--block-size", str(a.block_size), "--queue-depth", str(a.queue_depth), "--parallelism", str(a.parallelism),
           "--overlap-events=true", "--no-single-submit", "-n", str(a.loops),
           "--read-only" if op == "read" else "--write-only", "--quiet", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, DEEPNVME_LOG="quiet"))
    if r.returncode != 0:
        raise SystemExit(f"ds_io_compare: {' '.join(cmd)} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)[op]["gb_per_s_mean"]


def ratio(a, b):
    rs = [x / y for x, y in zip(a, b)]
    return statistics.median(rs), min(rs), max(rs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256M", help="bytes per ds_io op and file [256M]")
    ap.add_argument("--rounds", type=int, default=4, help="rounds; even keeps the orders balanced [4]")
    ap.add_argument("--loops", type=int, default=2, help="timed passes per run [2]")
    ap.add_argument("--block-size", default="1M")
    ap.add_argument("--queue-depth", type=int, default=32)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--dir", default=os.path.join(ROOT, "target", "perf-ds-io"))
    ap.add_argument("--python", default=sys.executable, help="the venv's python (its bin holds ds_io)")
    ap.add_argument("--cli", default=os.path.join(ROOT, "target", "release", "deepnvme"))
    ap.add_argument("--pause", type=float, default=0.5)
    ap.add_argument("--write-docs", action="store_true", help="write docs/perf/ds_io.md and ds_io.json")
    a = ap.parse_args()
    a.size = parse_size(a.size)
    a.block_size = parse_size(a.block_size)
    os.makedirs(a.dir, exist_ok=True)
    if not os.access(a.cli, os.X_OK):
        raise SystemExit(f"ds_io_compare: {a.cli} is missing; cargo build --release -p deepnvme-cli")

    cells = [("locked", "write"), ("locked", "read"), ("plain", "write"), ("plain", "read")]
    impls = {"locked": ["stock", "deepnvme", "cli"], "plain": ["stock", "deepnvme"]}
    results = {f"{m}-{op}": {i: [] for i in impls[m]} for m, op in cells}
    load = [os.getloadavg()[0]]
    started = datetime.datetime.now().astimezone()
    print("ds_io_compare: warming up (the stock op's first load JIT-builds it) ...", flush=True)
    for impl in ("stock", "deepnvme"):
        ds_io(a, impl, "locked", "read", a.dir)
    for rnd in range(1, a.rounds + 1):
        for memory, op in cells:
            order = impls[memory] if rnd % 2 else impls[memory][::-1]
            for impl in order:
                drop_caches(a.pause)
                v = cli(a, op, a.dir) if impl == "cli" else ds_io(a, impl, memory, op, a.dir)
                results[f"{memory}-{op}"][impl].append(v)
                print(f"round {rnd} {memory}-{op} {impl}: {v:.2f} GB/s", flush=True)
        load.append(os.getloadavg()[0])

    lines = []
    for cell, runs in results.items():
        med = {i: statistics.median(v) for i, v in runs.items()}
        row = {"cell": cell, "median_gb_per_s": med, "deepnvme_over_stock": ratio(runs["deepnvme"], runs["stock"])}
        if "cli" in runs:
            row["deepnvme_over_cli"] = ratio(runs["deepnvme"], runs["cli"])
        lines.append(row)
        print(json.dumps(row), flush=True)
    if not a.write_docs:
        return
    doc = os.path.join(ROOT, "docs", "perf")
    with open(os.path.join(doc, "ds_io.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(a).items() if k not in ("write_docs",)}, "runs": results,
                   "load_average": load, "started": started.isoformat()}, f, indent=1)
    fmt = lambda r: f"**{r[0]:.2f}** [{r[1]:.2f}–{r[2]:.2f}]"  # noqa: E731
    out = ["# ds_io: DeepSpeed's benchmark tool on deepnvme, on the stock op, and `deepnvme bench`", "",
           f"{started:%Y-%m-%d}, {os.cpu_count()} cores, {platform.platform()}. Command: "
           f"`python benches/ds_io_compare.py --size {a.size >> 20}M --rounds {a.rounds} --write-docs`.", "",
           f"ds_io `--io_size {a.size >> 20}M --block_size {a.block_size >> 10}K --queue_depth {a.queue_depth} "
           f"--io_parallel {a.parallelism} --loops {a.loops} --warmup_loops 1` (`--read` for reads; "
           "`--use_accelerator_pin_memory` for plain, unpinned tensors), a fresh process per run; "
           f"`deepnvme bench` with the same size, block size, queue depth and parallelism, `-n {a.loops}`, "
           "reading ds_io's read file and writing a file removed first (as ds_io removes its own). "
           f"{a.rounds} rounds, the order reversed every other round, sync + page-cache drop + pause before each run. "
           "GB/s = 10^9 bytes/s (ds_io's GiB/s converted). Ratios: median [min–max] of the per-round ratios.", "",
           "| cell | stock GB/s | deepnvme GB/s | cli GB/s | deepnvme/stock | deepnvme/cli |",
           "|---|---:|---:|---:|---|---|"]
    for row in lines:
        med = row["median_gb_per_s"]
        cli_cell = f"{med['cli']:.2f}" if "cli" in med else "—"
        over_cli = fmt(row["deepnvme_over_cli"]) if "deepnvme_over_cli" in row else "—"
        out.append(f"| {row['cell']} | {med['stock']:.2f} | {med['deepnvme']:.2f} | {cli_cell} | "
                   f"{fmt(row['deepnvme_over_stock'])} | {over_cli} |")
    out += ["", f"Load average (1 min) at the start and after each round: {', '.join(f'{x:.1f}' for x in load)} — "
            "on a shared 2-core VM single runs swing widely, so read the medians and ratios, not one round. "
            "Every run is in `docs/perf/ds_io.json`.", ""]
    with open(os.path.join(doc, "ds_io.md"), "w") as f:
        f.write("\n".join(out))
    print(f"ds_io_compare: wrote {os.path.join(doc, 'ds_io.md')}")


if __name__ == "__main__":
    main()
