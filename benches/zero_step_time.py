"""ZeRO-3 NVMe offload step time: deepnvme against DeepSpeed's stock C++
async_io (libaio), with `device: cpu` offload as the floor, interleaved.

    python benches/zero_step_time.py [--rounds 5] [--steps 8] [--dir target/zero-bench]
    python benches/zero_step_time.py --stream-ab [--rounds 6]   # op streaming on/off

Each round runs examples/zero_infinity.py three times, each in a fresh
interpreter: deepnvme and stock in alternating order (this disk favours
whichever run goes second, so round r runs deepnvme first when r is even),
then the cpu floor. A run's step time is the mean of its steps after the
first. Reported: per-round ratios deepnvme/stock (median and spread) and the
part of the step that NVMe adds over cpu offload, deepnvme's against
stock's. Writes docs/perf/zero_step_time.md and .json (with --write-docs).

The model is the issue's: 8 bias-free Linear(2048, 2048) fp32 layers, Adam
(torch's: DeepSpeed's CPU Adam is a long JIT build), batch 8; aio 1 MiB
blocks, queue depth 32, parallelism 2. `--op stock` needs libaio-dev and a
compiler (DeepSpeed JIT-builds it; cached under the venv).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "zero_infinity.py")
MODEL = ["--layers", "8", "--hidden", "2048", "--batch", "8", "--optimizer", "torch-adam", "--lr", "1e-3",
         "--block-size", str(1 << 20), "--queue-depth", "32", "--intra-op-parallelism", "2",
         "--param-buffer-count", "10"]  # one swap buffer per layer (and spare): 5 run out at 8 layers


def run(kind, steps, directory, tag):
    out = os.path.join(directory, f"{tag}.json")
    argv = [sys.executable, EXAMPLE, *MODEL, "--steps", str(steps), "--json-out", out]
    if kind == "cpu":
        argv += ["--offload", "cpu"]
    else:
        argv += ["--nvme-path", os.path.join(directory, f"swap-{tag}")]
        if kind == "stock":
            argv += ["--op", "stock"]
    env = dict(os.environ, DEEPNVME_LOG="quiet")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "deepnvme-torch-extensions"))
    subprocess.run(["sync"], check=False)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(out) as f:
        report = json.load(f)
    steps_s = report["step_seconds"][1:]
    counters = [c for c in report.get("deepnvme", [])[1:] if c]
    per_step = lambda k: statistics.mean(c[k] or 0 for c in counters) if counters else None  # noqa: E731
    return {
        # deepnvme's own counters per step (None for the stock op): ops, bytes
        # bounced, and the sum of the ops' submit-to-finish latencies.
        "ops_per_step": per_step("ops"),
        "bounced_per_step": per_step("bounced_bytes"),
        "io_time_per_step": per_step("io_time_s"),
        "wait_per_step": per_step("wait_time_s"),
        "kind": kind,
        "step_s": statistics.mean(steps_s),
        "losses": report["losses"],
        "read_per_step": statistics.mean(report["read_bytes"][1:]),
        "written_per_step": statistics.mean(report["write_bytes"][1:]),
    }


def stream_ab(args):
    """deepnvme's step time with op streaming on against off, in alternating
    order (on first in even rounds); prints per-round ratios and medians."""
    got = {"1": [], "0": []}
    for r in range(args.rounds):
        for stream in (["1", "0"] if r % 2 == 0 else ["0", "1"]):
            os.environ["DEEPNVME_OP_STREAM"] = stream
            out = run("deepnvme", args.steps, args.dir, f"stream{stream}-r{r}")
            got[stream].append(out)
            print(f"round {r} stream {'on ' if stream == '1' else 'off'} {out['step_s'] * 1000:8.1f} ms/step, "
                  f"blocked {out['wait_per_step'] * 1000:6.1f} ms/step", flush=True)
    os.environ.pop("DEEPNVME_OP_STREAM", None)
    if any(a["losses"] != b["losses"] for a, b in zip(got["1"], got["0"])):
        raise SystemExit("losses differ between streaming on and off")
    ratio = [a["step_s"] / b["step_s"] for a, b in zip(got["1"], got["0"])]
    med = lambda k, s: statistics.median(x[k] for x in got[s]) * 1000  # noqa: E731
    print(json.dumps({
        "command": "python benches/zero_step_time.py " + " ".join(sys.argv[1:]),
        "on_over_off": {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio),
                        "per_round": ratio},
        "median_step_ms": {"on": med("step_s", "1"), "off": med("step_s", "0")},
        "median_blocked_ms": {"on": med("wait_per_step", "1"), "off": med("wait_per_step", "0")},
    }, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dir", default=os.path.join(ROOT, "target", "zero-bench"))
    p.add_argument("--write-docs", action="store_true", help="write docs/perf/zero_step_time.{md,json}")
    p.add_argument("--stream-ab", action="store_true",
                   help="instead: deepnvme with op streaming on against off (DEEPNVME_OP_STREAM=1/0), alternating")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if args.stream_ab:
        return stream_ab(args)

    rounds = []
    for r in range(args.rounds):
        order = ["deepnvme", "stock"] if r % 2 == 0 else ["stock", "deepnvme"]
        got = {}
        for kind in order + ["cpu"]:
            got[kind] = run(kind, args.steps, args.dir, f"r{r}-{kind}")
            print(f"round {r} {kind:8s} {got[kind]['step_s'] * 1000:8.1f} ms/step", flush=True)
        if got["deepnvme"]["losses"] != got["stock"]["losses"] or got["deepnvme"]["losses"] != got["cpu"]["losses"]:
            raise SystemExit(f"round {r}: losses differ: {got}")
        rounds.append({"order": order, **{k: v["step_s"] for k, v in got.items()},
                       "ops_per_step": got["deepnvme"]["ops_per_step"],
                       "bounced_per_step": got["deepnvme"]["bounced_per_step"],
                       "io_time_per_step": got["deepnvme"]["io_time_per_step"],
                       "wait_per_step": got["deepnvme"]["wait_per_step"],
                       "read_per_step": got["deepnvme"]["read_per_step"],
                       "written_per_step": got["deepnvme"]["written_per_step"]})

    ratio = [x["deepnvme"] / x["stock"] for x in rounds]
    added = [(x["deepnvme"] - x["cpu"]) / (x["stock"] - x["cpu"]) for x in rounds if x["stock"] > x["cpu"]]
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    summary = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.platform()}",
        "command": "python benches/zero_step_time.py " + " ".join(sys.argv[1:]),
        "model": MODEL, "steps": args.steps, "rounds": rounds,
        "median_ms": {k: med(rounds, k) * 1000 for k in ("deepnvme", "stock", "cpu")},
        "ratio_deepnvme_over_stock": {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)},
        "nvme_added_ratio": {"median": statistics.median(added), "min": min(added), "max": max(added)} if added else None,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    if args.write_docs:
        docs = os.path.join(ROOT, "docs", "perf")
        with open(os.path.join(docs, "zero_step_time.json"), "w") as f:
            json.dump(summary, f, indent=1)
        lines = [
            "# ZeRO-3 NVMe offload: step time, deepnvme vs DeepSpeed's stock async_io",
            "",
            f"{summary['date']}, {summary['machine']}. Command: `{summary['command']}`.",
            f"Model: 8 x Linear(2048, 2048) fp32, batch 8, torch Adam; aio 1 MiB blocks, queue depth 32, "
            f"parallelism 2; {args.steps} steps per run, step time = mean of steps 2..{args.steps}. "
            "Each round runs deepnvme and stock in alternating order, then `device: cpu` offload (the floor); "
            "the losses of all three are checked equal bit for bit.",
            "",
            "| round | order | deepnvme ms | stock ms | cpu ms | deepnvme/stock |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for i, x in enumerate(rounds):
            lines.append(f"| {i} | {' then '.join(x['order'])} | {x['deepnvme'] * 1000:.0f} | {x['stock'] * 1000:.0f} "
                         f"| {x['cpu'] * 1000:.0f} | {x['deepnvme'] / x['stock']:.2f} |")
        r = summary["ratio_deepnvme_over_stock"]
        lines += ["", f"deepnvme/stock step time: median **{r['median']:.2f}** (range {r['min']:.2f}-{r['max']:.2f}).",
                  f"Median step: deepnvme {summary['median_ms']['deepnvme']:.0f} ms, stock "
                  f"{summary['median_ms']['stock']:.0f} ms, cpu offload {summary['median_ms']['cpu']:.0f} ms."]
        if added:
            a = summary["nvme_added_ratio"]
            lines.append(f"Time NVMe adds over cpu offload, deepnvme's / stock's: median **{a['median']:.2f}** "
                         f"(range {a['min']:.2f}-{a['max']:.2f}).")
        lines.append(f"Per step: {rounds[0]['read_per_step'] / 2**20:.0f} MiB read, "
                     f"{rounds[0]['written_per_step'] / 2**20:.0f} MiB written (/proc/self/io).")
        if rounds[0]["io_time_per_step"] is not None:
            io = statistics.median(x["io_time_per_step"] for x in rounds)
            waited = statistics.median(x["wait_per_step"] for x in rounds)
            added_ms = (summary["median_ms"]["deepnvme"] - summary["median_ms"]["cpu"])
            lines += [
                "",
                "## Where the step's time goes (deepnvme's counters, median per step)",
                "",
                "| | per step |",
                "|---|---:|",
                f"| step time, deepnvme | {summary['median_ms']['deepnvme']:.0f} ms |",
                f"| step time, cpu offload (compute, optimizer, Python) | {summary['median_ms']['cpu']:.0f} ms |",
                f"| what NVMe offload adds | {added_ms:.0f} ms |",
                f"| deepnvme ops | {statistics.median(x['ops_per_step'] for x in rounds):.0f} |",
                f"| time the step was blocked in deepnvme calls (wait(), sync_*) | {waited * 1000:.0f} ms |",
                f"| the rest of what NVMe adds: DeepSpeed's swap bookkeeping in Python | "
                f"{added_ms - waited * 1000:.0f} ms |",
                "| sum of op latencies (submit to finish; ops overlap each other and the compute) | "
                f"{io * 1000:.0f} ms |",
                f"| bytes bounced (not page-locked) | {statistics.median(x['bounced_per_step'] for x in rounds):.0f} |",
                "",
                "The blocked time is what the training thread spent inside deepnvme's waiting calls (the "
                "device moving the swapped bytes); the rest of what NVMe adds over cpu offload is DeepSpeed's "
                "swap bookkeeping in Python (swap-buffer management, tensor copies to and from the swap "
                "buffers). Zero bounced bytes: every swap buffer is page-locked, so no step time goes to "
                "bounce copies.",
            ]
        with open(os.path.join(docs, "zero_step_time.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
