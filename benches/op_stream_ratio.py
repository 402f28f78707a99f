"""Back-to-back small ops with worker rings streaming them against draining
between them (DEEPNVME_OP_STREAM=1 vs 0), side by side, optionally with
DeepSpeed's stock op as a third.

    python benches/op_stream_ratio.py [--ops 512] [--op-kb 256] [--block-kb 128]
        [--parallelism 2] [--rounds 4] [--dir DIR] [--with-stock] [--write-docs]

The pattern is DeepSpeed's swapper: many async_pwrite (then async_pread)
calls of one swap buffer's size, at consecutive offsets of one file, then one
wait(). Each measurement runs in a fresh child process (DeepSpeed's loader,
a locked buffer from new_cpu_locked_tensor, queue depth 32, overlap_events
on, single_submit off); the page cache is dropped (as root) and a pause taken
before each timed batch; the order of the implementations rotates every
round. Prints GB/s and CPU seconds per GB for each, and the median and spread
of the per-round ratios against streaming off (and against stock). One big
op of the same bytes is measured in the same child as the ceiling.

--with-stock needs the stock op's JIT build (DEEPNVME_DEEPSPEED_HOOK=0; set
TORCH_EXTENSIONS_DIR to the cache benches/run.sh uses).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(args):
    sys.path.insert(0, HERE)
    from bench_common import drop_caches
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()
    op = args.op_kb << 10
    total = op * args.ops
    h = aio.aio_handle(args.block_kb << 10, 32, False, True, args.parallelism)
    buf = h.new_cpu_locked_tensor(total, torch.empty(0, dtype=torch.uint8))
    buf.random_(0, 255)
    path = os.path.join(os.path.abspath(args.dir), f"op-stream-{os.getpid()}.bin")

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def many(write):
        call = h.async_pwrite if write else h.async_pread
        for i in range(args.ops):
            call(buf[i * op:(i + 1) * op], path, i * op)
        assert h.wait() == args.ops

    def one(write):
        (h.async_pwrite if write else h.async_pread)(buf, path, 0)
        assert h.wait() == 1

    out = {"module": aio.__name__}
    try:
        h.sync_pwrite(buf, path)  # full size before any read; warms the handle
        for name, fn in (("many", many), ("one", one)):
            for write in (True, False):
                drop_caches()
                c0, t0 = cpu(), time.perf_counter()
                fn(write)
                dt, dc = time.perf_counter() - t0, cpu() - c0
                key = f"{name}-{'write' if write else 'read'}"
                out[key] = {"gbps": total / dt / 1e9, "cpu_s_per_gb": dc / (total / 1e9)}
    finally:
        os.unlink(path)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=512)
    ap.add_argument("--op-kb", type=int, default=256)
    ap.add_argument("--block-kb", type=int, default=128)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dir", default=".")
    ap.add_argument("--with-stock", action="store_true")
    ap.add_argument("--baseline-python", help="also run streaming on with this interpreter (another venv's "
                    "build of deepnvme), as \"baseline\"")
    ap.add_argument("--write-docs", action="store_true", help="write docs/perf/op_stream.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    impls = {"stream on": {"DEEPNVME_OP_STREAM": "1"}, "stream off": {"DEEPNVME_OP_STREAM": "0"}}
    if args.with_stock:
        impls["stock"] = {"DEEPNVME_DEEPSPEED_HOOK": "0"}
    if args.baseline_python:
        impls["baseline"] = {"DEEPNVME_OP_STREAM": "1", "_python": args.baseline_python}
    names = list(impls)
    runs = {n: [] for n in names}
    passthrough = ["--ops", str(args.ops), "--op-kb", str(args.op_kb), "--block-kb", str(args.block_kb),
                   "--parallelism", str(args.parallelism), "--dir", args.dir]
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            settings = dict(impls[name])
            python = settings.pop("_python", sys.executable)
            env = dict(os.environ, DEEPNVME_LOG="quiet", **settings)
            # The stock op's JIT build needs the venv's ninja.
            env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
            p = subprocess.run([python, os.path.abspath(__file__), "--child"] + passthrough,
                               capture_output=True, text=True, env=env)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                sys.exit(f"{name} failed (rc {p.returncode}):\n{p.stderr[-2000:]}")
            runs[name].append(json.loads(lines[-1]))
    header = (f"{args.ops} ops of {args.op_kb} KiB, block {args.block_kb} KiB, queue depth 32, parallelism "
              f"{args.parallelism}, {args.rounds} rounds (order rotated), locked buffer")
    print(header)
    for name in names:
        print(f"  {name}: {runs[name][0]['module']}")
    rows = []
    for key in ("many-write", "many-read", "one-write", "one-read"):
        row = {"case": key}
        for n in names:
            row[n] = (statistics.median(x[key]["gbps"] for x in runs[n]),
                      statistics.median(x[key]["cpu_s_per_gb"] for x in runs[n]))
        for other in names[1:]:
            ratios = [a[key]["gbps"] / b[key]["gbps"] for a, b in zip(runs["stream on"], runs[other])]
            row["on/" + other] = (statistics.median(ratios), min(ratios), max(ratios))
        rows.append(row)
    print(f"{'':14}" + "".join(f"{n + ' GB/s':>17}{'CPU s/GB':>10}" for n in names) + "   ratios (median [min-max])")
    for row in rows:
        line = f"{row['case']:14}" + "".join(f"{row[n][0]:17.2f}{row[n][1]:10.3f}" for n in names)
        for other in names[1:]:
            m, lo, hi = row["on/" + other]
            line += f"   on/{other.replace('stream ', '')} {m:.2f} [{lo:.2f}-{hi:.2f}]"
        print(line)
    if args.write_docs:
        write_docs(args, header, names, runs, rows)


def write_docs(args, header, names, runs, rows):
    import datetime
    import platform
    flags = " ".join(a for a in sys.argv[1:])
    L = ["# Back-to-back ops: worker rings streaming them, against draining between them", "",
         f"{datetime.date.today()}, {os.cpu_count()} cores, {platform.platform()}. "
         f"Command: `python benches/op_stream_ratio.py {flags}`.", "",
         f"{header}. `many`: {args.ops} async ops of one buffer's consecutive slices, then one wait() "
         "(DeepSpeed's swapper issues swap buffers this way); `one`: the same bytes as one op. Each "
         "implementation runs in a fresh process per round: " + "; ".join(
             f"**{n}** `{runs[n][0]['module']}`" for n in names) + ". "
         "`stream on`/`stream off`: deepnvme with `DEEPNVME_OP_STREAM=1`/`0`"
         + ("; `stock`: DeepSpeed's C++ op (libaio), `DEEPNVME_DEEPSPEED_HOOK=0`." if "stock" in names else "."),
         "",
         "| case | " + " | ".join(f"{n} GB/s | {n} CPU s/GB" for n in names) + " | "
         + " | ".join(f"on/{o.replace('stream ', '')} (median [min-max])" for o in names[1:]) + " |",
         "|---|" + "---:|---:|" * len(names) + "---|" * (len(names) - 1)]
    for row in rows:
        cells = [row["case"]] + [f"{row[n][0]:.2f} | {row[n][1]:.3f}" for n in names]
        cells += [f"**{row['on/' + o][0]:.2f}** [{row['on/' + o][1]:.2f}-{row['on/' + o][2]:.2f}]" for o in names[1:]]
        L.append("| " + " | ".join(cells) + " |")
    L += ["", "With streaming off, a worker lets its ring drain at the end of every op before it starts the "
          "next one, so an op of a few blocks per worker runs at a queue depth of a few blocks however deep "
          "the ring is. Streaming starts the next queued op's requests in the slots the last one frees "
          "(ops on the same bytes, where one writes, keep their order). One big op is one run either way: "
          "its ratio is this disk's noise.", ""]
    out = os.path.join(os.path.dirname(HERE), "docs", "perf", "op_stream.md")
    with open(out, "w") as f:
        f.write("\n".join(L))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
