"""The striping tier: GB/s of one member alone, of stripe sets over N = 2
and N = 4 members, and of fio with one job per member (their sum is the
limit), side by side, in alternating order, through DeepSpeed's own
aio_handle (AsyncIOBuilder().load(), which is deepnvme's).

benches/stripe.sh makes the members (ext4 on zram devices, each throttled
for this process's cgroup to the same bandwidth with cgroup v1 blkio) and
runs this inside that cgroup. Every measurement moves one file of
`--mib-per-member` MiB per member it spans in one blocking op (block size 1
MiB, queue depth 32), from or into a locked tensor (new_cpu_locked_tensor)
or a plain one; each round measures every target of a row, the order
reversed every other round, and each round's ratios are kept.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 1 << 20
# Before every timed run: every member idle alike, so that each run starts a
# fresh throttle slice (blk-throttle lets a device idle for a while start
# with a slice's worth of bytes at once, which otherwise favours whichever
# run follows an idle device).
PAUSE = 0.3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--members", nargs="+", required=True, help="the member folders (one per device)")
    p.add_argument("--work", required=True, help="a folder on the checkout's disk for the stripe sets' placeholders")
    p.add_argument("--mib-per-member", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bps", type=int, required=True, help="the throttle per member, bytes/s (for the report)")
    p.add_argument("--cli", required=True, help="the deepnvme binary (stripe create)")
    p.add_argument("--out", required=True, help="where to write the JSON")
    p.add_argument("--markdown", help="where to write the results table")
    p.add_argument("--command", default="", help="the command line that reproduces this run")
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--units", action="store_true", help="also compare stripe units (256 KiB, 1 MiB, 4 MiB)")
    return p.parse_args()


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def fio(paths, rw, mib_each):
    """Summed GB/s of one fio job per path, run at once (io_uring, O_DIRECT,
    1 MiB blocks, depth 32): the limit the members allow together."""
    time.sleep(PAUSE)
    cmd = ["fio", "--output-format=json", "--group_reporting=0"]
    for i, path in enumerate(paths):
        cmd += [f"--name=m{i}", f"--filename={path}", f"--rw={rw}", "--bs=1M", "--iodepth=32",
                "--ioengine=io_uring", "--direct=1", f"--size={mib_each}M", "--end_fsync=0",
                "--invalidate=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    jobs = json.loads(out[out.index("{"):])["jobs"]
    key = "read" if rw == "read" else "write"
    return sum(j[key]["bw_bytes"] for j in jobs) / 1e9


def main():
    args = parse_args()
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()
    members = [os.path.abspath(m) for m in args.members]
    n_all = len(members)
    # Targets: one member alone (a plain folder on member 0's device), and
    # stripe sets over the first 2 and the first 4 members.
    targets = {"one member": (os.path.join(members[0], "alone"), 1)}
    for n in (2, 4):
        if n > n_all:
            continue
        root = os.path.join(args.work, f"stripe{n}")
        parts = [os.path.join(m, f"stripe{n}") for m in members[:n]]
        subprocess.run([args.cli, "stripe", "create", root, *parts, "--unit", "1M"], check=True,
                       stdout=subprocess.DEVNULL)
        targets[f"stripe N={n}"] = (root, n)
    os.makedirs(targets["one member"][0], exist_ok=True)
    for n in sorted({1, 2, 4} & set(range(1, n_all + 1))):
        for i in range(n):
            os.makedirs(os.path.join(members[i], f"fio{n}"), exist_ok=True)

    per = args.mib_per_member * MIB
    biggest = per * max(n for _, n in targets.values())
    qd = args.queue_depth
    locked_handle = aio.aio_handle(MIB, qd, False, True, 1)
    locked = locked_handle.new_cpu_locked_tensor(biggest, torch.empty(0, dtype=torch.uint8))
    plain = torch.empty(biggest, dtype=torch.uint8)
    # One repeated byte: zram keeps such pages as that word, with no memory per page.
    locked.fill_(0x5A)
    plain.fill_(0x5A)
    handles = {p: aio.aio_handle(MIB, qd, False, True, p) for p in (1, 2)}

    def run_deepnvme(target, n, memory, direction, par):
        folder, _ = targets[target]
        path = os.path.join(folder, f"bench-{n}.bin")
        nbytes = per * n
        buf = (locked if memory == "locked" else plain)[:nbytes]
        h = handles[par]
        time.sleep(PAUSE)
        t0 = time.perf_counter()
        rc = h.sync_pwrite(buf, path) if direction == "write" else h.sync_pread(buf, path)
        dt = time.perf_counter() - t0
        assert rc == 1, rc
        return gbps(nbytes, dt)

    # Every file is written once before anything is timed, as fio lays its
    # files out first: a timed write then overwrites allocated blocks (a
    # first write into a new ext4 file may go through the page cache, whose
    # writeback a cgroup v1 throttle does not see).
    for target, (folder, n) in targets.items():
        assert handles[1].sync_pwrite(locked[:per * n], os.path.join(folder, f"bench-{n}.bin")) == 1
    for n in (1, 2, 4):
        if n <= n_all:
            fio([os.path.join(members[i], f"fio{n}", "f.bin") for i in range(n)], "write", args.mib_per_member)

    rows = []
    results = []
    order = list(targets)
    for memory in ("locked", "plain"):
        for direction in ("write", "read"):
            for par in (1, 2):
                row = {"memory": memory, "direction": direction, "parallelism": par, "rounds": []}
                for r in range(args.rounds):
                    seq = order if r % 2 == 0 else order[::-1]
                    got = {}
                    for target in seq:
                        got[target] = run_deepnvme(target, targets[target][1], memory, direction, par)
                    fio_seq = [n for n in (1, 2, 4) if n <= n_all]
                    if r % 2:
                        fio_seq = fio_seq[::-1]
                    for n in fio_seq:
                        paths = [os.path.join(members[i], f"fio{n}", "f.bin") for i in range(n)]
                        got[f"fio x{n}"] = fio(paths, direction, args.mib_per_member)
                    row["rounds"].append(got)
                    print(json.dumps({"memory": memory, "direction": direction, "parallelism": par, "round": r,
                                      **{k: round(v, 3) for k, v in got.items()}}), file=sys.stderr, flush=True)
                rows.append(row)

    def median(row, key):
        return statistics.median(g[key] for g in row["rounds"])

    for row in rows:
        summary = {k: round(median(row, k), 3) for k in row["rounds"][0]}
        ratios = {}
        for n in (2, 4):
            key = f"stripe N={n}"
            if key not in summary:
                continue
            per_round_fio = [g[key] / g[f"fio x{n}"] for g in row["rounds"]]
            per_round_one = [g[key] / g["one member"] for g in row["rounds"]]
            ratios[f"N={n} / fio x{n}"] = [round(x, 2) for x in per_round_fio]
            ratios[f"N={n} / one member"] = [round(x, 2) for x in per_round_one]
        row["median_gbps"] = summary
        row["ratios_per_round"] = ratios
        results.append(row)

    # The unit: stripe sets over all members with units of 256 KiB, 1 MiB
    # and 4 MiB, locked tensors, parallelism 1, the whole file in one op and
    # the same bytes as 4 MiB ops one after another (DeepSpeed swaps tensors
    # of a few MiB: a unit as large as the op puts each op on one member).
    unit_rows = []
    if args.units:
        unit_targets = {}
        for unit in (256 << 10, MIB, 4 * MIB):
            root = os.path.join(args.work, f"units{unit >> 10}k")
            parts = [os.path.join(m, f"units{unit >> 10}k") for m in members]
            subprocess.run([args.cli, "stripe", "create", root, *parts, "--unit", str(unit)], check=True,
                           stdout=subprocess.DEVNULL)
            unit_targets[f"unit {unit >> 10} KiB"] = os.path.join(root, "f.bin")
        nbytes = per * n_all
        h = handles[1]
        for path in unit_targets.values():
            assert h.sync_pwrite(locked[:nbytes], path) == 1

        def timed(path, direction, op):
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            for off in range(0, nbytes, op):
                view = locked[off:off + op]
                rc = h.sync_pwrite(view, path, off) if direction == "write" else h.sync_pread(view, path, off)
                assert rc == 1, rc
            return gbps(nbytes, time.perf_counter() - t0)

        for direction in ("write", "read"):
            for op in (nbytes, 4 * MIB):
                row = {"direction": direction, "op_bytes": op, "rounds": []}
                keys = list(unit_targets)
                for r in range(args.rounds):
                    seq = keys if r % 2 == 0 else keys[::-1]
                    got = {k: timed(unit_targets[k], direction, op) for k in seq}
                    row["rounds"].append(got)
                    print(json.dumps({"units": direction, "op": op, "round": r, **{k: round(v, 3) for k, v in got.items()}}),
                          file=sys.stderr, flush=True)
                row["median_gbps"] = {k: round(statistics.median(g[k] for g in row["rounds"]), 3) for k in keys}
                unit_rows.append(row)

    report = {
        "command": args.command,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "throttle_bytes_per_s_per_member": args.bps,
        "mib_per_member": args.mib_per_member,
        "rounds": args.rounds,
        "handle": {"block_size": MIB, "queue_depth": qd, "overlap_events": True, "single_submit": False},
        "unit": MIB,
        "rows": results,
        "units": unit_rows,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    if args.markdown:
        lines = ["| memory | op | par | one member | N=2 | fio x2 | N=4 | fio x4 | N=2/fio | N=2/one | N=4/fio | N=4/one |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in results:
            m, rt = row["median_gbps"], row["ratios_per_round"]

            def rr(key):
                v = rt.get(key)
                return f"{min(v):.2f}–{max(v):.2f}" if v else "–"

            lines.append(
                f"| {row['memory']} | {row['direction']} | {row['parallelism']} | {m.get('one member', 0):.3f} | "
                f"{m.get('stripe N=2', 0):.3f} | {m.get('fio x2', 0):.3f} | {m.get('stripe N=4', 0):.3f} | "
                f"{m.get('fio x4', 0):.3f} | {rr('N=2 / fio x2')} | {rr('N=2 / one member')} | "
                f"{rr('N=4 / fio x4')} | {rr('N=4 / one member')} |")
        if unit_rows:
            lines += ["", "| op | op size | " + " | ".join(unit_rows[0]["median_gbps"]) + " |",
                      "|---|---|" + "---|" * len(unit_rows[0]["median_gbps"])]
            for row in unit_rows:
                size = "whole file" if row["op_bytes"] > 4 * MIB else "4 MiB"
                lines.append(f"| {row['direction']} | {size} | " +
                             " | ".join(f"{v:.3f}" for v in row["median_gbps"].values()) + " |")
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    print(json.dumps({r["memory"] + "-" + r["direction"] + "-p" + str(r["parallelism"]): r["ratios_per_round"]
                      for r in results}, indent=1))


if __name__ == "__main__":
    main()
