#!/usr/bin/env python3
"""The benchmark driver behind benches/run.sh (run that: it sets everything up).

Compares, on one file in one file system, in A/B order that alternates every
round (odd rounds in the listed order, even rounds reversed), with `sync`,
`echo 3 > /proc/sys/vm/drop_caches`, memory compaction and a pause before
every run:

  fio      fio's io_uring engine (O_DIRECT, --numjobs = intra_op_parallelism,
           each job its own slice), and fio's psync engine at iodepth 1 for
           the small-op round trips;
  fio-huge the same with its buffers on reserved 2 MiB pages
           (`--mem=shmhuge`; virtio tier, locked cells, as root), the
           huge-page reference deepnvme's own buffers are measured against;
  stock    DeepSpeed's own async_io op (libaio), JIT-built from the installed
           deepspeed by AsyncIOBuilder().load() with DEEPNVME_DEEPSPEED_HOOK=0;
  deepnvme deepnvme.async_io through DeepSpeed's loader (the hook on);
  cli      the `deepnvme bench` CLI (locked buffers only);
  bare     benches/bare (`target/release/bare`): the same bytes moved the
           same way with the leanest loops there are (io_uring with a
           registered buffer and file, and pread/pwrite threads; one locked
           huge-page buffer of the op size), the faster of the two per run:
           the limit of the cell, in every cell and tier.

The two Python implementations run in benches/ds_worker.py processes
(--serve): torch's import and the JIT build stay out of every timed loop,
and each run gets a fresh handle and buffer. In the fast tier every run gets
a fresh process too (--workers per-run): a long-lived process draws the
stock op's 4 KiB-paged buffer more scattered, which slows its zram writes
(docs/perf/harnesses.md); the disk tier keeps one process per
implementation (--workers long-lived), which keeps it quick. It writes
OUT/README.md, OUT/results.json (every run), OUT/grid.png, OUT/small_ops.png and
OUT/is_managed.png.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def parse_size(s):
    s = str(s).strip().lower()
    mult = 1
    for suf, m in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40)):
        if s.endswith(suf):
            s, mult = s[:-1], m
            break
    return int(float(s) * mult)


def show_size(n):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}iB"
    return f"{n} B"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the grid

def build_grid(quick):
    """(cells, trimmed-note). A cell is a dict of op, bs, qd, par, buffer,
    overlap; locked cells run fio, stock, deepnvme and cli; plain cells
    (torch.empty buffers: the bounce path) run stock and deepnvme."""
    cells = []

    def add(op, bs, qd, par, buffer):
        cells.append(dict(op=op, bs=bs, qd=qd, par=par, buffer=buffer, overlap=1))

    if quick:
        for op in ("write", "read"):
            add(op, MiB, 32, 1, "locked")
            add(op, MiB, 32, 1, "plain")
        return cells, "--quick: only locked and plain 1 MiB qd 32 par 1 (read, write), 4 KiB small ops."
    for op in ("write", "read"):
        for par in (1, 2):
            for qd in (8, 32, 128):
                add(op, MiB, qd, par, "locked")
            for bs in (128 << 10, 8 * MiB):
                add(op, bs, 32, par, "locked")
            add(op, MiB, 32, par, "plain")
        for bs in (128 << 10, 8 * MiB):
            add(op, bs, 32, 1, "plain")
    note = ("The full grid (read/write x block {128 KiB, 1 MiB, 8 MiB} x qd {8, 32, 128} x par {1, 2} x "
            "{locked, plain} = 72 cells) is trimmed to 28 to keep the run under 15 minutes: locked buffers get "
            "qd {8, 32, 128} at 1 MiB and block {128 KiB, 8 MiB} at qd 32, each at par 1 and 2 (20 cells); "
            "plain tensors get 1 MiB qd 32 at par 1 and 2 and 128 KiB / 8 MiB qd 32 at par 1 (8 cells). "
            "Dropped: block x qd cross terms other than those (e.g. 128 KiB qd 128, 8 MiB qd 8) and plain "
            "tensors at qd 8/128. Every cell has overlap_events on, single_submit off.")
    return cells, note


def cell_label(c):
    bs = show_size(c["bs"]).replace(" ", "").replace("iB", "")
    return f"{c['op'][0].upper()} {bs} q{c['qd']} p{c['par']} {'L' if c['buffer'] == 'locked' else 'P'}"


# Whether fio's buffers can be put on reserved huge pages (`--mem=shmhuge`),
# set by `reserve_huge_pages`: the virtio tier then runs fio both ways.
FIO_HUGE_PAGES = {"ok": False, "restore": None}


def reserve_huge_pages(cells):
    """Reserves enough 2 MiB pages for fio's largest cell (block size x
    queue depth x jobs), as root; `release_huge_pages` gives them back."""
    need = max((c["bs"] * c["qd"] * c["par"] for c in cells if c["buffer"] == "locked"), default=0) // (2 << 20) + 8
    knob = "/proc/sys/vm/nr_hugepages"
    try:
        with open(knob) as f:
            before = int(f.read())
        with open(knob, "w") as f:
            f.write(f"{before + need}\n")
        FIO_HUGE_PAGES["restore"] = before
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) for line in f if line.startswith("HugePages_Free:"))
        FIO_HUGE_PAGES["ok"] = free >= need
    except (OSError, ValueError, StopIteration) as e:
        log(f"run: no huge pages for fio ({e}); fio runs on 4 KiB pages only")
    if not FIO_HUGE_PAGES["ok"]:
        release_huge_pages()


def release_huge_pages():
    if FIO_HUGE_PAGES["restore"] is not None:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(f"{FIO_HUGE_PAGES['restore']}\n")
        FIO_HUGE_PAGES["restore"] = None


def cell_impls(c, fast=False, tmpfs=False):
    """What runs in a cell. The fast-device tier adds fio's libaio engine
    and drops the CLI (whose buffers hold a non-repeating pattern, which
    zram would compress); its tmpfs rows add deepnvme with io_uring forced
    (DEEPNVME_ENGINE=uring), to show what the engine per file is worth."""
    if not fast:
        fio = ["fio", "fio-huge"] if FIO_HUGE_PAGES["ok"] else ["fio"]
        return ["bare"] + fio + ["stock", "deepnvme", "cli"] if c["buffer"] == "locked" else ["bare", "stock", "deepnvme"]
    impls = ["bare", "fio", "fio-libaio", "stock", "deepnvme"] if c["buffer"] == "locked" else ["bare", "stock", "deepnvme"]
    return impls + (["deepnvme-uring"] if tmpfs else [])


def tmpfs_cells(quick):
    """The fast-device tier's tmpfs rows: 1 MiB qd 32, locked at par 1 and
    2, plain at par 1, read and write."""
    cells = []
    for op in ("write", "read"):
        for par, buffer in ((1, "locked"), (2, "locked"), (1, "plain")):
            if quick and par == 2:
                continue
            cells.append(dict(op=op, bs=MiB, qd=32, par=par, buffer=buffer, overlap=1))
    return cells


# ---------------------------------------------------------------- runners

class Worker:
    def __init__(self, impl, python, extra_env=None):
        self.impl = impl
        self.extra_env = extra_env  # kept so that a worker like this one can be started again
        env = dict(os.environ, **(extra_env or {}))
        env["DEEPNVME_LOG"] = "quiet"
        # Read by the hook at interpreter start-up: 0 lets DeepSpeed JIT-build its own op.
        env["DEEPNVME_DEEPSPEED_HOOK"] = "0" if impl == "stock" else "1"
        # DeepSpeed's JIT build needs the venv's ninja on PATH.
        env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
        self.p = subprocess.Popen([python, os.path.join(ROOT, "benches", "ds_worker.py"), "--impl", impl, "--serve"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self.p.stdout.readline()
        if not hello:
            raise SystemExit(f"run: the {impl} worker did not start (see its stderr above)")
        self.hello = json.loads(hello)

    def run(self, cfg):
        self.p.stdin.write(json.dumps(cfg) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"run: the {self.impl} worker died")
        out = json.loads(line)
        if "error" in out:
            raise SystemExit(f"run: {self.impl} {cfg}: {out['error']}")
        return out

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def fio_json(args):
    r = subprocess.run(["fio", "--output-format=json"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run: fio {' '.join(args)} failed: {r.stderr.strip()}")
    txt = r.stdout[r.stdout.index("{"):]  # fio may print notes before the JSON
    return json.loads(txt)


# The fast-device tier's buffers hold one repeated byte (what ds_worker fills
# its tensors with), so that zram stores every page without compressing it.
# Writes only: a read leaves what the layout wrote, which had the pattern.
FIO_CONSTANT = ["--buffer_pattern=0x5a", "--scramble_buffers=0"]


def run_fio(c, path, size, engine="io_uring", constant=False, huge=False):
    par = c["par"]
    per = size // par
    args = ["--name=grid", f"--filename={path}", "--direct=1", f"--ioengine={engine}", f"--rw={c['op']}",
            f"--bs={c['bs']}", f"--iodepth={c['qd']}", f"--numjobs={par}", f"--size={per}",
            f"--offset_increment={per}"] + (FIO_CONSTANT if constant and c["op"] == "write" else [])
    if huge:
        args += ["--mem=shmhuge", "--hugepage-size=2m"]
    j = fio_json(args)
    nbytes, secs, cpu = 0, 0.0, 0.0
    for job in j["jobs"]:
        x = job[c["op"]]
        nbytes += x["io_bytes"]
        rt = x["runtime"] / 1000
        secs = max(secs, rt)
        cpu += (job["usr_cpu"] + job["sys_cpu"]) / 100 * rt
    return {"gb_per_s": nbytes / secs / 1e9, "cpu_s_per_gb": cpu / (nbytes / 1e9), "seconds": secs}


def run_fio_small(path, size, op_bytes, seconds):
    args = ["--name=small", f"--filename={path}", "--direct=1", "--ioengine=psync", "--rw=randread",
            f"--bs={op_bytes}", "--iodepth=1", f"--size={size}", "--time_based", f"--runtime={seconds}s",
            "--randrepeat=1"]
    job = fio_json(args)["jobs"][0]
    x = job["read"]
    rt = x["runtime"] / 1000
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * rt
    return {"ops_per_s": x["iops"], "gb_per_s": x["bw_bytes"] / 1e9, "cpu_s_per_gb": cpu / (x["io_bytes"] / 1e9),
            "cpu_us_per_op": cpu / max(x["total_ios"], 1) * 1e6, "seconds": rt}


def run_cli(cli, c, path, size, op_bytes):
    args = [cli, "bench", "--file", path, "--keep", "--size", str(size), "--buffer-size", str(op_bytes),
            "--block-size", str(c["bs"]), "--queue-depth", str(c["qd"]), "--parallelism", str(c["par"]),
            f"--overlap-events={'true' if c['overlap'] else 'false'}", "--no-single-submit",
            "--read-only" if c["op"] == "read" else "--write-only", "--quiet", "--json"]
    r = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, DEEPNVME_LOG="quiet"))
    if r.returncode != 0:
        raise SystemExit(f"run: {' '.join(args)} failed: {r.stderr.strip()}")
    d = json.loads(r.stdout)[c["op"]]
    return {"gb_per_s": d["gb_per_s_best"], "cpu_s_per_gb": d["cpu_s_per_gb"], "seconds": d["seconds"][0]}


def run_bare(bare, c, path, size, op_bytes, rnd):
    """The cell's limit: benches/bare runs both its engines, in an order
    that alternates by round, and reports the faster. The engines' own
    numbers ride along in "engines" (for the report's note on which won)."""
    engines = "uring,psync" if rnd % 2 == 0 else "psync,uring"
    args = [bare, "--file", path, "--op", c["op"], "--size", str(size), "--op-bytes", str(op_bytes),
            "--block-size", str(c["bs"]), "--queue-depth", str(c["qd"]), "--parallelism", str(c["par"]),
            "--engines", engines]
    # Its buffer holds one repeated byte (0x5a, as ds_worker's tensors), so
    # zram stores its writes uncompressed in the fast tier too.
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"run: {' '.join(args)} failed: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    return {"gb_per_s": d["gb_per_s"], "cpu_s_per_gb": d["cpu_s_per_gb"], "seconds": d["engines"][d["best"]]["seconds"],
            "engines": {k: v["gb_per_s"] for k, v in d["engines"].items()}, "best": d["best"],
            "huge_bytes": d["buffer"]["huge_bytes"], "buffer_bytes": d["buffer"]["bytes"]}


class Settle:
    """sync, drop the page cache and compact memory (as root), pause: before
    every timed run. Compaction gives every participant the same chance of
    huge pages for its buffer: on a 1 GiB op, memory left fragmented by the
    run before (4 KiB pages just unlocked) made the next run fall back to
    small pages and move its bytes up to 2x slower (docs/perf/harnesses.md).
    With `sync_dirs`, only their file systems are synced (syncfs): the
    fast-device tier's runs take a fraction of a second, and a global sync
    would wait for whatever else on the machine is writing to its disk."""

    def __init__(self, pause, sync_dirs=None):
        self.pause = pause
        self.can_drop = True
        self.can_compact = True
        self.sync_dirs = [d for d in (sync_dirs or []) if d]

    def sync(self):
        if not self.sync_dirs:
            os.sync()
            return
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for d in self.sync_dirs:
            fd = os.open(d, os.O_RDONLY)
            try:
                if libc.syncfs(fd) != 0:
                    os.sync()
            finally:
                os.close(fd)

    def __call__(self):
        self.sync()
        if self.can_drop:
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            except OSError as e:
                log(f"run: cannot drop caches ({e}); continuing with sync and pause only")
                self.can_drop = False
        if self.can_compact:
            # Apart from the cache drop: a kernel without CONFIG_COMPACTION
            # has no such file, and the drop must go on without it.
            try:
                with open("/proc/sys/vm/compact_memory", "w") as f:
                    f.write("1\n")
            except OSError as e:
                log(f"run: cannot compact memory ({e}); runs start on memory as they find it")
                self.can_compact = False
        time.sleep(self.pause)


# ---------------------------------------------------------------- stats

def med(xs):
    return statistics.median(xs) if xs else float("nan")


def ratio_stats(a, b):
    """Per-round ratios a[i]/b[i] (the same round, so one pair of adjacent
    runs in alternating order): (median, min, max, n)."""
    rs = [x / y for x, y in zip(a, b) if x is not None and y]
    if not rs:
        return None
    return (statistics.median(rs), min(rs), max(rs), len(rs))


def fmt_ratio(r):
    if r is None:
        return "—"
    m, lo, hi, n = r
    return f"{m:.2f} [{lo:.2f}–{hi:.2f}]"


# ---------------------------------------------------------------- machine

def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def machine(dir_):
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    src = sh(f"df --output=source {shlex.quote(dir_)} | tail -1")
    fstype = sh(f"df --output=fstype {shlex.quote(dir_)} | tail -1")
    dev = os.path.basename(src)
    parent = sh(f"lsblk -no PKNAME {shlex.quote(src)} 2>/dev/null | head -1") or dev
    model = sh(f"lsblk -dno MODEL /dev/{parent} 2>/dev/null").strip()
    if not model:
        drv = sh(f"basename $(readlink -f /sys/block/{parent}/device/driver) 2>/dev/null")
        model = f"(lsblk gives no model; driver {drv or '?'})"
    rota = sh(f"cat /sys/block/{parent}/queue/rotational 2>/dev/null")
    sched = sh(f"cat /sys/block/{parent}/queue/scheduler 2>/dev/null")
    return {
        "nproc": os.cpu_count(),
        "memory": mem,
        "kernel": platform.release(),
        "cpu": sh("awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo"),
        "disk": f"/dev/{parent} {model}, rotational={rota}, scheduler {sched}",
        "filesystem": f"{src} ({fstype}) at {dir_}",
        "fio": sh("fio --version"),
    }


def versions(python):
    code = ("import torch, deepspeed, importlib.metadata as m; "
            "print('VERSIONS', torch.__version__, deepspeed.__version__, m.version('deepnvme'))")
    text = subprocess.run([python, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, DEEPNVME_DEEPSPEED_HOOK="0")).stdout
    # deepspeed may log to stdout on import: take our own line only.
    out = next((ln.split()[1:] for ln in text.splitlines() if ln.startswith("VERSIONS ")), [])
    sha = sh(f"git -C {shlex.quote(ROOT)} rev-parse --short HEAD")
    dirty = sh(f"git -C {shlex.quote(ROOT)} status --porcelain -- src cpp bindings Cargo.toml crates")
    return {"torch": out[0] if out else "?", "deepspeed": out[1] if len(out) > 1 else "?",
            "deepnvme": (out[2] if len(out) > 2 else "?") + f" (git {sha}{'+dirty' if dirty else ''})"}


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few cells at small sizes (checks the harness)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per cell [4; --quick 2]; even keeps orders balanced")
    ap.add_argument("--size", default=None, help="bytes per throughput run and file size [256M; fast tier 1G; --quick 64M]")
    ap.add_argument("--op-bytes", default=None, help="bytes per op/buffer [min(size, 128M); fast tier: size]")
    ap.add_argument("--dir", default=None, help="where the test file goes [./target/perf]")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "perf"), help="output folder [docs/perf]")
    ap.add_argument("--pause", type=float, default=0.3, help="seconds to pause before each run [0.3]")
    ap.add_argument("--small-seconds", type=float, default=None, help="seconds per small-op run [3; --quick 1]")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--cli", default=os.path.join(ROOT, "target", "release", "deepnvme"))
    ap.add_argument("--bare-bin", default=os.path.join(ROOT, "target", "release", "bare"),
                    help="benches/bare's binary (cargo build --release --bin bare)")
    ap.add_argument("--is-managed-bin", default=os.path.join(ROOT, "target", "release", "examples", "is_managed_bench"))
    ap.add_argument("--command", default=None, help="the command line to print in the report")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite OUT/README.md and the charts from OUT/results.json, run nothing")
    ap.add_argument("--fast-device", action="store_true",
                    help="the fast-device tier: --dir is ext4 on zram (run.sh sets it up); writes OUT/fast_device.*")
    ap.add_argument("--tmpfs-dir", default=None, help="--fast-device: a tmpfs for the tmpfs rows")
    ap.add_argument("--cells", default=None,
                    help="only these cells, by label, comma-separated (e.g. 'W 1M q32 p1 L,R 1M q32 p2 L'): a rerun of a few")
    ap.add_argument("--no-small-ops", action="store_true", help="leave out the small-op round trips")
    ap.add_argument("--workers", choices=("per-run", "long-lived"), default=None,
                    help="a fresh ds_worker process for every run, or one kept per implementation "
                         "[fast tier: per-run; disk tier: long-lived]")
    a = ap.parse_args()
    fast = a.fast_device
    if a.report_only:
        with open(os.path.join(a.out, "fast_device.json" if fast else "results.json")) as f:
            res = json.load(f)
        if fast:
            fast_charts(res, a.out)
            write_fast_report(res, a.out)
        else:
            charts(res, a.out)
            write_report(res, a.out)
        return

    quick = a.quick
    rounds = a.rounds or (2 if quick else 4)
    size = parse_size(a.size or ("64M" if quick else ("1G" if fast else "256M")))
    # The fast tier moves one 1 GiB tensor per op, as the fresh-process
    # harness (fresh_ratio.py) does: with 128 MiB ops the stock op ran
    # 1.4x slower per byte than with 1 GiB ones while deepnvme did not
    # change much, which inflated deepnvme/stock (docs/perf/harnesses.md).
    op_bytes = parse_size(a.op_bytes) if a.op_bytes else (size if fast else min(size, 128 * MiB))
    small_seconds = a.small_seconds or (1.0 if quick else 3.0)
    dir_ = os.path.abspath(a.dir or os.path.join(ROOT, "target", "perf"))
    os.makedirs(dir_, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    if size % op_bytes or op_bytes % (8 * MiB):
        raise SystemExit("run: --size must be a multiple of --op-bytes, and --op-bytes of 8 MiB")
    command = a.command or " ".join(shlex.quote(x) for x in sys.argv)

    started = time.time()
    start_stamp = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()
    mach = machine(dir_)
    vers = versions(a.python)
    log(f"run: {'QUICK ' if quick else ''}rounds {rounds}, size {show_size(size)}, op {show_size(op_bytes)}, dir {dir_}")
    log(f"run: load average {load_before[0]:.2f} at start")

    cells, trimmed = build_grid(quick)
    if a.cells:
        wanted = {x.strip() for x in a.cells.split(",")}
        cells = [c for c in cells if cell_label(c) in wanted]
        trimmed += f" This run: only {', '.join(sorted(wanted))} (--cells)."
        if not cells:
            raise SystemExit(f"run: --cells {a.cells} matches no cell of the grid")
    settle = Settle(a.pause, [dir_, a.tmpfs_dir] if fast else None)
    path = os.path.join(dir_, "perf-grid.dat")

    log("run: starting the stock worker (its first start JIT-builds DeepSpeed's async_io: minutes, far longer on a busy machine) ...")
    worker_mode = a.workers or ("per-run" if fast else "long-lived")
    log(f"run: Python workers: {worker_mode}")
    # Started either way: the first start JIT-builds the stock op, and their
    # greetings name the modules in the report.
    workers = {"stock": Worker("stock", a.python)}
    log(f"run: stock: {workers['stock'].hello}")
    workers["deepnvme"] = Worker("deepnvme", a.python)
    log(f"run: deepnvme: {workers['deepnvme'].hello}")
    tmpfs_dir = None
    if fast and a.tmpfs_dir:
        tmpfs_dir = os.path.abspath(a.tmpfs_dir)
        workers["deepnvme-uring"] = Worker("deepnvme", a.python, {"DEEPNVME_ENGINE": "uring"})
    if worker_mode == "per-run":
        for w in workers.values():
            w.close()

    def in_worker(impl, cfg):
        if worker_mode == "long-lived":
            return workers[impl].run(cfg)
        w = Worker(workers[impl].impl, a.python, workers[impl].extra_env)
        try:
            return w.run(cfg)
        finally:
            w.close()

    def layout(p, direct=1):
        log(f"run: laying out {p} ({show_size(size)}, untimed) ...")
        fio_json(["--name=layout", f"--filename={p}", f"--direct={direct}", "--ioengine=io_uring", "--rw=write",
                  f"--size={size}", "--bs=1M", "--iodepth=32"] + (FIO_CONSTANT if fast else []))

    layout(path)

    if not os.access(a.bare_bin, os.X_OK):
        raise SystemExit(f"run: {a.bare_bin} is missing: cargo build --release --bin bare")

    def run_one(impl, c, p, rnd):
        settle()
        if impl == "bare":
            return run_bare(a.bare_bin, c, p, size, op_bytes, rnd)
        if impl in ("fio", "fio-libaio", "fio-huge"):
            return run_fio(c, p, size, "libaio" if impl == "fio-libaio" else "io_uring", constant=fast,
                           huge=impl == "fio-huge")
        if impl == "cli":
            return run_cli(a.cli, c, p, size, op_bytes)
        cfg = {"op": c["op"], "file": p, "size": size, "op_bytes": op_bytes, "block_size": c["bs"],
               "queue_depth": c["qd"], "parallelism": c["par"], "overlap_events": c["overlap"],
               "single_submit": 0, "buffer": c["buffer"]}
        return in_worker(impl, cfg)

    results = {"cells": [], "small": [], "is_managed": None}
    tmpfs = tmpfs_cells(quick) if tmpfs_dir else []
    if a.cells:
        tmpfs = [c for c in tmpfs if cell_label(c) in wanted]
    total = (sum(len(cell_impls(c, fast)) for c in cells) + sum(len(cell_impls(c, fast, True)) for c in tmpfs)) * rounds
    done = 0

    def run_cells(cs, p, on_tmpfs, into):
        nonlocal done
        for c in cs:
            impls = cell_impls(c, fast, on_tmpfs)
            runs = {i: [] for i in impls}
            cpu = {i: [] for i in impls}
            huge = {i: [] for i in impls if i in ("stock", "deepnvme")}
            phys = {i: [] for i in huge}
            bare_runs = []
            for r in range(rounds):
                order = impls if r % 2 == 0 else list(reversed(impls))
                for impl in order:
                    out = run_one(impl, c, p, r)
                    runs[impl].append(out["gb_per_s"])
                    cpu[impl].append(out["cpu_s_per_gb"])
                    if impl in huge:
                        huge[impl].append(out.get("anon_huge_bytes"))
                        phys[impl].append(out.get("physical_runs"))
                    if impl == "bare":
                        bare_runs.append({k: out[k] for k in ("engines", "best", "huge_bytes", "buffer_bytes")})
                    done += 1
                log(f"run: [{done}/{total}] {'tmpfs ' if on_tmpfs else ''}{cell_label(c)} round {r + 1} "
                    f"({' '.join(order)}): " + "  ".join(f"{i} {runs[i][-1]:.3f}" for i in impls))
            into.append({**c, "label": cell_label(c), "gb_per_s": runs, "cpu_s_per_gb": cpu, "bare": bare_runs,
                         "anon_huge_bytes": huge, "physical_runs": phys})

    if not fast:
        reserve_huge_pages(cells)
    try:
        run_cells(cells, path, False, results["cells"])
    finally:
        release_huge_pages()
    if tmpfs_dir:
        results["tmpfs"] = []
        tmpfs_path = os.path.join(tmpfs_dir, "perf-grid.dat")
        layout(tmpfs_path, direct=0)
        run_cells(tmpfs, tmpfs_path, True, results["tmpfs"])
        os.unlink(tmpfs_path)

    small_sizes = [] if a.no_small_ops else [4096] if quick else [4096, 65536]
    for ob in small_sizes:
        impls = ["fio-psync", "stock", "deepnvme"]
        ops = {i: [] for i in impls}
        cpu = {i: [] for i in impls}
        for r in range(rounds):
            order = impls if r % 2 == 0 else list(reversed(impls))
            for impl in order:
                settle()
                if impl == "fio-psync":
                    out = run_fio_small(path, size, ob, small_seconds)
                else:
                    out = in_worker(impl, {"op": "small", "file": path, "size": size, "op_bytes": ob,
                                             "seconds": small_seconds, "seed": r + 1, "buffer": "locked",
                                             "block_size": MiB, "queue_depth": 32, "parallelism": 1})
                ops[impl].append(out["ops_per_s"])
                cpu[impl].append(out["cpu_us_per_op"])
            log(f"run: small {show_size(ob)} round {r + 1} ({' '.join(order)}): "
                + "  ".join(f"{i} {ops[i][-1]:.0f}/s" for i in impls))
        results["small"].append({"op_bytes": ob, "ops_per_s": ops, "cpu_us_per_op": cpu})

    for w in (workers.values() if worker_mode == "long-lived" else ()):
        w.close()
    try:
        os.unlink(path)
    except OSError:
        pass

    counts = "10,1000" if quick else "10,1000,100000"
    if not fast:
        log(f"run: is_managed microbenchmark ({counts} live regions) ...")
        r = subprocess.run([a.is_managed_bin, "--counts", counts, "--json", "--budget-ms", "50" if quick else "200"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            results["is_managed"] = json.loads(r.stdout)
        else:
            log(f"run: is_managed_bench failed: {r.stderr.strip()}")

    duration = time.time() - started
    load_after = os.getloadavg()
    meta = {"quick": quick, "date": start_stamp.isoformat(timespec="seconds"), "command": command,
            "duration_s": round(duration, 1), "rounds": rounds, "size": size, "op_bytes": op_bytes,
            "pause_s": a.pause, "small_seconds": small_seconds, "drop_caches": settle.can_drop,
            "load_before": load_before, "load_after": load_after, "machine": mach, "versions": vers,
            "trimmed": trimmed, "stock_module": workers["stock"].hello, "deepnvme_module": workers["deepnvme"].hello,
            "fast_device": fast, "tmpfs_dir": tmpfs_dir, "workers": worker_mode,
            "tmpfs_filesystem": machine(tmpfs_dir)["filesystem"] if tmpfs_dir else None}
    results["meta"] = meta
    name = "fast_device" if fast else "README"
    with open(os.path.join(a.out, "fast_device.json" if fast else "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if fast:
        fast_charts(results, a.out)
        write_fast_report(results, a.out)
    else:
        charts(results, a.out)
        write_report(results, a.out)
    log(f"run: done in {duration:.0f} s; wrote {a.out}/{name}.md")


# ---------------------------------------------------------------- output

def grouped_bars(ax, cells, impls, width, colors, labels=None):
    """One bar per implementation and cell (median GB/s, min-max as error
    bars), the implementations side by side around each cell's tick."""
    for k, impl in enumerate(impls):
        xs, ys, lo, hi = [], [], [], []
        for i, c in enumerate(cells):
            v = c["gb_per_s"].get(impl)
            if not v:
                continue
            m = med(v)
            xs.append(i + (k - (len(impls) - 1) / 2) * width)
            ys.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=(labels or {}).get(impl, impl), color=colors[impl])


def charts(res, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bare": "#000000", "fio": "#777777", "stock": "#d95f02", "deepnvme": "#1b9e77", "cli": "#7570b3",
              "fio-psync": "#777777"}
    q = " (QUICK run: harness check, not a measurement)" if res["meta"]["quick"] else ""

    cells = res["cells"]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.75 * len(cells)), 8), squeeze=False)
    for ax, op in zip(axes[:, 0], ("read", "write")):
        cs = [c for c in cells if c["op"] == op]
        grouped_bars(ax, cs, ["bare", "fio", "stock", "deepnvme", "cli"], 0.16, colors)
        ax.set_xticks(range(len(cs)))
        ax.set_xticklabels([c["label"][2:] for c in cs], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("GB/s (median, bars: min–max)")
        ax.set_title(f"{op}s{q}", fontsize=10)
        ax.legend(fontsize=8, ncol=5)
    fig.suptitle("block size, queue depth q, intra_op_parallelism p, L = locked buffer, P = plain torch.empty",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "grid.png"), dpi=100)
    plt.close(fig)

    small = res["small"]
    fig, ax = plt.subplots(figsize=(7, 4))
    impls = ["fio-psync", "stock", "deepnvme"]
    w = 0.25
    for k, impl in enumerate(impls):
        ys = [med(s["ops_per_s"][impl]) for s in small]
        lo = [y - min(s["ops_per_s"][impl]) for y, s in zip(ys, small)]
        hi = [max(s["ops_per_s"][impl]) - y for y, s in zip(ys, small)]
        ax.bar([i + (k - 1) * w for i in range(len(small))], ys, w, yerr=[lo, hi], capsize=3, label=impl,
               color=colors[impl])
    ax.set_xticks(range(len(small)))
    ax.set_xticklabels([f"{show_size(s['op_bytes'])} sync_pread" for s in small])
    ax.set_ylabel("round trips / s (median, min–max)")
    ax.set_title(f"small reads at random aligned offsets, queue depth 1{q}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "small_ops.png"), dpi=100)
    plt.close(fig)

    im = res.get("is_managed")
    if im and im.get("rows"):
        fig, ax = plt.subplots(figsize=(6, 4))
        n = [r["regions"] for r in im["rows"]]
        for key, lab, col, st in (("deepnvme_hit_ns", "deepnvme hit", colors["deepnvme"], "-"),
                                  ("linear_hit_ns", "linear scan hit", colors["stock"], "-"),
                                  ("deepnvme_miss_ns", "deepnvme miss", colors["deepnvme"], "--"),
                                  ("linear_miss_ns", "linear scan miss", colors["stock"], "--")):
            ax.plot(n, [r[key] for r in im["rows"]], st, marker="o", color=col, label=lab)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("live locked allocations")
        ax.set_ylabel("ns per is_managed lookup")
        ax.set_title(f"pinned-manager lookup{q}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "is_managed.png"), dpi=100)
        plt.close(fig)


def ratio_of(cell, a, b, key="gb_per_s"):
    return ratio_stats(cell[key][a], cell[key][b]) if a in cell[key] and b in cell[key] else None


def plain_vs_locked(cells):
    """Report lines: deepnvme with plain tensors against deepnvme with
    locked ones in the same cell (per-round ratios of the two runs)."""
    L = ["### Plain tensors against locked ones", "",
         "deepnvme's GB/s with a plain `torch.empty` tensor (bounced: read into, or written from, a pooled "
         "buffer, the copy on the calling thread, spread over cores for large copies) over its GB/s with a "
         "locked tensor in the same cell, per round. What bounds it: [bounds.md](bounds.md).", "",
         "| cell | locked | plain | plain/locked |", "|---|---:|---:|---:|"]
    locked = {(c["op"], c["bs"], c["qd"], c["par"]): c for c in cells if c["buffer"] == "locked"}
    for c in cells:
        if c["buffer"] != "plain":
            continue
        lc = locked.get((c["op"], c["bs"], c["qd"], c["par"]))
        if not lc:
            continue
        r = ratio_stats(c["gb_per_s"]["deepnvme"], lc["gb_per_s"]["deepnvme"])
        L.append(f"| {c['label'][:-2]} | {med(lc['gb_per_s']['deepnvme']):.3f} | {med(c['gb_per_s']['deepnvme']):.3f} "
                 f"| {fmt_ratio(r)} |")
    L.append("")
    return L


def bare_lines(cells):
    """Report lines on the bare participant: what it is, which of its
    engines won how often, and how much of its buffer was on huge pages."""
    wins, huge, total = {}, [], []
    for c in cells:
        for b in c.get("bare", []):
            wins[b["best"]] = wins.get(b["best"], 0) + 1
            if b.get("huge_bytes") is not None:
                huge.append(b["huge_bytes"])
                total.append(b["buffer_bytes"])
    if not wins:
        return []
    on_huge = (f"{sum(huge) / sum(total):.0%} of its buffers' bytes were on huge pages (`/proc/self/smaps`)"
               if total else "its huge-page share could not be read")
    return ["**bare** is the cell's limit: [benches/bare](../../benches/bare/src/main.rs) moves the same bytes the same "
            "way (one locked buffer of the op size on huge pages, O_DIRECT, the cell's block size, queue depth and "
            "parallelism, one untimed op first, then the same ops at increasing offsets) with nothing of deepnvme or "
            "DeepSpeed in it: io_uring with a registered buffer and file, one ring per worker, and pread/pwrite "
            "threads, both in every run (their order alternating by round); the faster is the run's number. "
            f"Faster engine over all runs: {', '.join(f'{k} {v}' for k, v in sorted(wins.items()))}; {on_huge}. "
            "deepnvme/bare and stock/bare are per-round ratios like the others.", ""] + huge_page_lines(cells)


def huge_page_lines(cells):
    """How much of each Python worker's memory was on huge pages once its
    buffer was filled (`AnonHugePages`, `ds_worker.py`), over the runs."""
    share = {}
    for c in cells:
        for impl, xs in c.get("anon_huge_bytes", {}).items():
            got = [x for x in xs if x is not None]
            if got:
                have, want = share.get(impl, (0, 0))
                share[impl] = (have + sum(got), want + len(got))
    if not share:
        return []
    parts = [f"{impl} {have / n / (1 << 20):.0f} MiB per run" for impl, (have, n) in sorted(share.items())]
    return ["Huge pages in the Python workers once the buffer is filled (`AnonHugePages`): " + ", ".join(parts) +
            " (DeepSpeed's `new_cpu_locked_tensor` is `posix_memalign` + `mlock`, on huge pages only when THP is "
            "`always`; deepnvme's is advised `MADV_HUGEPAGE`).", ""]


def fast_charts(res, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bare": "#000000", "fio": "#777777", "fio-libaio": "#bbbbbb", "stock": "#d95f02", "deepnvme": "#1b9e77",
              "deepnvme-uring": "#66a61e"}
    q = " (QUICK run: harness check, not a measurement)" if res["meta"]["quick"] else ""
    groups = [(f"{op}s, ext4 on zram", [c for c in res["cells"] if c["op"] == op]) for op in ("read", "write")]
    if res.get("tmpfs"):
        groups.append(("tmpfs", res["tmpfs"]))
    impls = ["bare", "fio", "fio-libaio", "stock", "deepnvme", "deepnvme-uring"]
    widest = max(len(cs) for _, cs in groups)
    fig, axes = plt.subplots(len(groups), 1, figsize=(max(8, 0.8 * widest), 3.6 * len(groups)), squeeze=False)
    for ax, (title, cs) in zip(axes[:, 0], groups):
        grouped_bars(ax, cs, impls, 0.14, colors, labels={"deepnvme-uring": "deepnvme, io_uring forced"})
        ax.set_xticks(range(len(cs)))
        ax.set_xticklabels([c["label"] if title == "tmpfs" else c["label"][2:] for c in cs], rotation=45,
                           ha="right", fontsize=8)
        ax.set_ylabel("GB/s (median, min–max)")
        ax.set_title(f"{title}{q}", fontsize=10)
        ax.legend(fontsize=7, ncol=6)
    fig.suptitle("fast-device tier: block size, queue depth q, intra_op_parallelism p, L locked / P plain", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fast_device.png"), dpi=100)
    plt.close(fig)


def write_fast_report(res, out):
    m = res["meta"]
    mach, v = m["machine"], m["versions"]
    L = ["# Performance: the fast-device tier (ext4 on zram, and tmpfs)", ""]
    if m["quick"]:
        L += ["> **QUICK RUN (`--quick`): a check of the harness at small sizes on a busy machine, not a "
              "measurement.** Repeat the full run on a quiet machine before quoting any number.", ""]
    L += ["Generated by `benches/run.sh` (its fast-device tier); every run is in [fast_device.json](fast_device.json). "
          "The virtio disk's tier: [README.md](README.md).", "",
          "## Why zram stands in for a multi-drive NVMe array", "",
          "The project's VM has one virtio disk of 1–5 GB/s, where every implementation waits on the disk and "
          "the software's cost hides. An array of NVMe drives moves 10–50 GB/s, and there the cost per byte and "
          "per request of the software above the drives decides the throughput. A zram device is a block "
          "device in memory: the benchmark puts ext4 on it and runs the whole kernel stack above it, as on an "
          "NVMe array (O_DIRECT through ext4's iomap direct I/O, page pinning, bios through the block layer's "
          "submit path), and only the drive is replaced (zram takes bios itself: there is no blk-mq request queue "
          "and no DMA, the copy is the CPU's). "
          "Its pages are filled with one repeated byte (deepnvme and the stock op fill their tensors with 0x5A, "
          "fio gets `--buffer_pattern=0x5a --scramble_buffers=0`), which zram stores as that value without "
          "compressing anything, so a transfer costs a memset or a page-sized store, not a compressor. What "
          "differs from NVMe: zram completes a bio synchronously in the submitting thread (no interrupt, no "
          "device queue), so queue depth buys no device parallelism, and the cores that submit also do the "
          "\"device's\" work. It bounds how much CPU the stack costs per byte, the quantity that limits a "
          "fast array on a machine this size.", "",
          "What bounds each target that is not met, with the measurements: [bounds.md](bounds.md).", "",
          "tmpfs is the other case: a file system in the page cache, on which io_uring cannot run a read or "
          "write without blocking and hands every request to a kernel worker thread; deepnvme runs such files "
          "on its psync engine (`src/engine/choice.rs`). Its rows add deepnvme with io_uring forced "
          "(`DEEPNVME_ENGINE=uring`) to show what that choice is worth.", "",
          "| | |", "|---|---|",
          f"| date | {m['date']} |",
          f"| command | `{m['command']}` ({m['duration_s']:.0f} s, this tier) |",
          f"| machine | {mach['nproc']} CPUs ({mach['cpu']}), {mach['memory']} memory, kernel {mach['kernel']} |",
          f"| device | {mach['disk']} |",
          f"| file system | {mach['filesystem']}; tmpfs rows: {m.get('tmpfs_filesystem') or '—'} |",
          f"| load average | {m['load_before'][0]:.2f} at start, {m['load_after'][0]:.2f} at end (1 min) |",
          f"| software | {mach['fio']}, torch {v['torch']}, deepspeed {v['deepspeed']}, deepnvme {v['deepnvme']} |",
          f"| sizes | {show_size(m['size'])} per throughput run (the whole file), {show_size(m['op_bytes'])} per op/buffer, "
          f"{m['small_seconds']:g} s per small-op run |",
          f"| rounds | {m['rounds']} per cell, alternating order; each run after syncfs of the tier's file systems, drop_caches, "
          f"memory compaction and a {m['pause_s']:g} s pause |", "",
          "Method as in [README.md](README.md#method); fio also runs its libaio engine "
          "(`--ioengine=libaio`, otherwise the same job). Ratios are median [min–max] of per-round ratios. "
          + ("The stock op and deepnvme run in a fresh `ds_worker.py` process per run (`--workers per-run`): "
             "in a long-lived one the stock op's 4 KiB-paged buffer lands more scattered and its writes run up "
             "to 1.7x slower ([harnesses.md](harnesses.md))."
             if m.get("workers") == "per-run" else
             "The stock op and deepnvme run in one long-lived `ds_worker.py` process each (`--workers long-lived`)."),
          ""]

    def table(cells, with_uring):
        T = ["| cell | bare | fio io_uring | fio libaio | stock | deepnvme |" + (" deepnvme io_uring forced |" if with_uring else "")
             + " deepnvme/bare | stock/bare | deepnvme/stock | deepnvme/fio io_uring | deepnvme/fio libaio |"
             " CPU s/GB bare / fio / libaio / stock / deepnvme | CPU deepnvme/stock |",
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if with_uring else "") + "---:|---:|---:|---:|---:|---:|---:|"]
        for c in cells:
            g, cp = c["gb_per_s"], c["cpu_s_per_gb"]

            def gv(i):
                return f"{med(g[i]):.3f}" if i in g else "—"

            def cv(i):
                return f"{med(cp[i]):.3f}" if i in cp else "—"
            T.append(f"| {c['label']} | {gv('bare')} | {gv('fio')} | {gv('fio-libaio')} | {gv('stock')} | **{gv('deepnvme')}** |"
                     + (f" {gv('deepnvme-uring')} |" if with_uring else "")
                     + f" **{fmt_ratio(ratio_of(c, 'deepnvme', 'bare'))}** | {fmt_ratio(ratio_of(c, 'stock', 'bare'))} |"
                     f" {fmt_ratio(ratio_of(c, 'deepnvme', 'stock'))} | {fmt_ratio(ratio_of(c, 'deepnvme', 'fio'))} |"
                     f" {fmt_ratio(ratio_of(c, 'deepnvme', 'fio-libaio'))} |"
                     f" {cv('bare')} / {cv('fio')} / {cv('fio-libaio')} / {cv('stock')} / {cv('deepnvme')} |"
                     f" {fmt_ratio(ratio_of(c, 'deepnvme', 'stock', 'cpu_s_per_gb'))} |")
        return T

    # The targets, each as measured.
    cells, tm = res["cells"], res.get("tmpfs", [])
    locked = [c for c in cells if c["buffer"] == "locked"]

    def worst(cs, a, b, key="gb_per_s", pick=min):
        rs = [(ratio_of(c, a, b, key), c["label"]) for c in cs]
        rs = [(r[0], lab) for r, lab in rs if r]
        return pick(rs) if rs else (float("nan"), "—")

    def verdict(ok):
        return "**met**" if ok else "**not met**"
    lk_min = worst(locked, "deepnvme", "stock")
    all_min = worst(cells, "deepnvme", "stock")
    cpu_max = worst(cells, "deepnvme", "stock", "cpu_s_per_gb", max)
    tm_min = worst(tm, "deepnvme", "stock")
    n15 = sum(1 for c in locked if (ratio_of(c, "deepnvme", "stock") or (0,))[0] >= 1.5)
    pl = []
    lmap = {(c["op"], c["bs"], c["qd"], c["par"]): c for c in locked}
    for c in cells:
        if c["buffer"] == "plain" and c["bs"] == MiB and c["qd"] == 32 and c["par"] == 2:
            lc = lmap.get((c["op"], c["bs"], c["qd"], c["par"]))
            if lc:
                r = ratio_stats(c["gb_per_s"]["deepnvme"], lc["gb_per_s"]["deepnvme"])
                if r:
                    pl.append((r[0], c["label"]))
    pl_min = min(pl) if pl else (float("nan"), "—")
    q32 = [c for c in locked if c["bs"] == MiB and c["qd"] == 32]
    bare_min = worst(q32, "deepnvme", "bare")
    L += ["## Targets", "",
          "Medians of per-round ratios; the worst cell is named.", "",
          "| target | measured | |", "|---|---|---|",
          f"| locked cells ≥ 1.5x the stock op | {n15} of {len(locked)} cells; the lowest {lk_min[0]:.2f}x ({lk_min[1]}) | {verdict(n15 == len(locked))} |",
          f"| no cell below 1.2x the stock op | lowest {all_min[0]:.2f}x ({all_min[1]}) | {verdict(all_min[0] >= 1.2)} |",
          f"| CPU per GB ≤ 0.7x the stock op's | highest {cpu_max[0]:.2f}x ({cpu_max[1]}) | {verdict(cpu_max[0] <= 0.7)} |",
          f"| tmpfs ≥ 1.0x the stock op | lowest {tm_min[0]:.2f}x ({tm_min[1]}) | {verdict(tm_min[0] >= 1.0) if tm else '—'} |",
          f"| plain ≥ 0.8x locked at 1 MiB q32 p2 | lowest {pl_min[0]:.2f}x ({pl_min[1]}) | {verdict(pl_min[0] >= 0.8) if pl else '—'} |",
          f"| deepnvme ≥ 0.9x bare, locked 1 MiB q32, p1 and p2, read and write | lowest {bare_min[0]:.2f}x ({bare_min[1]}) | "
          f"{verdict(bare_min[0] >= 0.9) if bare_min[1] != '—' else '—'} |",
          "", "A verdict from a run on a loaded machine (load average above) or a `--quick` run is not a measurement.", "",
          "## ext4 on zram", "", "![fast device](fast_device.png)", ""]
    L += table(cells, False)
    L += ["", f"Grid: {m['trimmed']}", ""]
    L += bare_lines(cells + tm)
    L += plain_vs_locked(cells)
    if tm:
        L += ["## tmpfs", "",
              "The same file laid out on a tmpfs; 'deepnvme io_uring forced' is deepnvme with "
              "`DEEPNVME_ENGINE=uring` (every request through the kernel's io_uring worker threads).", ""]
        L += table(tm, True)
        L += [""]
    L += ["## Small ops on ext4 on zram: `sync_pread` round trips per second", "",
          "As in [README.md](README.md#small-ops-sync_pread-round-trips-per-second), on the zram file.", "",
          "| op | fio psync qd1 | stock | deepnvme | deepnvme/stock | deepnvme/fio | CPU µs/op fio / stock / deepnvme |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    for sm in res["small"]:
        o, cp = sm["ops_per_s"], sm["cpu_us_per_op"]
        L.append(f"| {show_size(sm['op_bytes'])} | {med(o['fio-psync']):.0f} | {med(o['stock']):.0f} | "
                 f"**{med(o['deepnvme']):.0f}** | {fmt_ratio(ratio_stats(o['deepnvme'], o['stock']))} | "
                 f"{fmt_ratio(ratio_stats(o['deepnvme'], o['fio-psync']))} | "
                 f"{med(cp['fio-psync']):.1f} / {med(cp['stock']):.1f} / {med(cp['deepnvme']):.1f} |")
    L += ["", "## Reproduce", "", "```sh",
          "benches/run.sh --fast-device          # this tier only (root): zram + ext4 and a tmpfs, set up and torn down",
          "benches/run.sh --fast-device --quick  # harness check",
          "benches/run.sh                        # both tiers (this one where it can be set up)",
          "```", ""]
    with open(os.path.join(out, "fast_device.md"), "w") as f:
        f.write("\n".join(L))


def write_report(res, out):
    m = res["meta"]
    mach, v = m["machine"], m["versions"]
    L = []
    title = "# Performance: deepnvme against fio and DeepSpeed's stock async_io"
    L.append(title)
    L.append("")
    if m["quick"]:
        L.append("> **QUICK RUN (`--quick`): a check of the harness at small sizes on a busy machine, not a "
                 "measurement.** Repeat the full run (below) on a quiet machine before quoting any number.")
        L.append("")
    L.append("Generated by `benches/run.sh`; every run is in [results.json](results.json).")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    L.append(f"| date | {m['date']} |")
    L.append(f"| command | `{m['command']}` ({m['duration_s']:.0f} s) |")
    L.append(f"| machine | {mach['nproc']} CPUs ({mach['cpu']}), {mach['memory']} memory, kernel {mach['kernel']} |")
    L.append(f"| disk | {mach['disk']} |")
    L.append(f"| file system | {mach['filesystem']} |")
    L.append(f"| load average | {m['load_before'][0]:.2f} at start, {m['load_after'][0]:.2f} at end (1 min) |")
    L.append(f"| software | {mach['fio']}, torch {v['torch']}, deepspeed {v['deepspeed']}, deepnvme {v['deepnvme']} |")
    L.append(f"| stock op | `{m['stock_module']['module']}` (DEEPNVME_DEEPSPEED_HOOK=0, JIT-built from the installed deepspeed, "
             f"libaio; `load()` took {m['stock_module']['load_seconds']:.0f} s, inside the duration above: "
             "a first JIT build on a busy machine dominates it) |")
    L.append(f"| deepnvme op | `{m['deepnvme_module']['module']}` (AsyncIOBuilder().load() with the hook on) |")
    L.append(f"| sizes | {show_size(m['size'])} per throughput run (the whole file), {show_size(m['op_bytes'])} per op/buffer, "
             f"{m['small_seconds']:g} s per small-op run |")
    L.append(f"| rounds | {m['rounds']} per cell |")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append("One file on one file system. For every cell each implementation runs once per round; odd rounds "
             "run them in the listed order, even rounds in reverse (the disk here favours whichever run goes "
             "second), each run after `sync`, `echo 3 > /proc/sys/vm/drop_caches`"
             + ("" if m["drop_caches"] else " (**not permitted here: skipped**)")
             + ", `echo 1 > /proc/sys/vm/compact_memory` (so every participant's buffer finds huge pages alike)"
             + f" and a {m['pause_s']:g} s pause. A ratio is taken per round (two runs of the same round) and "
             "reported as median [min–max] over the rounds. GB/s are 10^9 bytes/s.")
    L.append("")
    L.append("* **fio**: `--ioengine=io_uring --direct=1 --bs=B --iodepth=Q --numjobs=P`, each job its own "
             "1/P of the file (as intra_op_parallelism splits a buffer); CPU from fio's usr/sys per job.")
    L.append("* **stock**: DeepSpeed's `aio_handle` (libaio) from `AsyncIOBuilder().load()` with "
             "`DEEPNVME_DEEPSPEED_HOOK=0`; **deepnvme**: the same call with the hook on. Both run in "
             + ("a fresh `benches/ds_worker.py --serve` process per run" if m.get("workers") == "per-run"
                else "a long-lived `benches/ds_worker.py --serve` process")
             + " (one fresh handle and buffer per run, then one op of the "
             "run's op size at offset 0, all untimed, so the timed loop sees a warm handle as a training job does: "
             "rings made, deepnvme's fixed buffers registered, its bounce pool filled); "
             "the timed loop is `sync_pread`/`sync_pwrite` of one buffer per op at increasing offsets; "
             "CPU is `getrusage(RUSAGE_SELF)` user+system over the loop (all threads of the process).")
    L.append("* **cli**: `deepnvme bench --read-only|--write-only` with the same knobs (its own timed "
             "section and process CPU).")
    L.append("* **L** = `new_cpu_locked_tensor` buffer (direct I/O into it); **P** = plain `torch.empty` "
             "(not page-locked: both implementations bounce it, DeepSpeed through a buffer it allocates and "
             "mlocks per op, deepnvme through an unlocked page-aligned one).")
    L.append("")
    L.append(f"Grid: {m['trimmed']}")
    L.append("")
    L.append("## Throughput grid")
    L.append("")
    L.append("![grid](grid.png)")
    L.append("")
    L.append("Median GB/s; ratios are median [min–max] of per-round ratios; CPU is median CPU seconds per GB.")
    L.append("")
    L.append("| cell | bare | fio | fio, huge pages | stock | deepnvme | cli | deepnvme/bare | stock/bare | deepnvme/stock | "
             "deepnvme/fio | deepnvme/fio huge | cli/fio | CPU s/GB bare / fio / stock / deepnvme / cli |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in res["cells"]:
        g, cp = c["gb_per_s"], c["cpu_s_per_gb"]

        def gv(i):
            return f"{med(g[i]):.3f}" if i in g else "—"

        def cv(i):
            return f"{med(cp[i]):.3f}" if i in cp else "—"

        dn_st = ratio_stats(g["deepnvme"], g["stock"])
        dn_fio = ratio_stats(g["deepnvme"], g["fio"]) if "fio" in g else None
        cli_fio = ratio_stats(g["cli"], g["fio"]) if "cli" in g and "fio" in g else None
        dn_fio_huge = ratio_stats(g["deepnvme"], g["fio-huge"]) if "fio-huge" in g else None
        L.append(f"| {c['label']} | {gv('bare')} | {gv('fio')} | {gv('fio-huge')} | {gv('stock')} | **{gv('deepnvme')}** | "
                 f"{gv('cli')} | **{fmt_ratio(ratio_of(c, 'deepnvme', 'bare'))}** | {fmt_ratio(ratio_of(c, 'stock', 'bare'))} | "
                 f"{fmt_ratio(dn_st)} | {fmt_ratio(dn_fio)} | {fmt_ratio(dn_fio_huge)} | {fmt_ratio(cli_fio)} | "
                 f"{cv('bare')} / {cv('fio')} / {cv('stock')} / {cv('deepnvme')} / {cv('cli')} |")
    L.append("")
    L.append("Cell: R/W, block size, queue depth q, intra_op_parallelism p, L locked / P plain; "
             "overlap_events on, single_submit off everywhere.")
    L.append("")
    L.extend(bare_lines(res["cells"]))
    lk = [c for c in res["cells"] if c["buffer"] == "locked"]
    huge = any("fio-huge" in c["gb_per_s"] for c in lk)
    fio_ref = "fio-huge" if huge else "fio"
    rs = [(ratio_of(c, "deepnvme", "bare"), ratio_of(c, "deepnvme", fio_ref), c["label"]) for c in lk]
    rs = [(b[0], f[0] if f else float("nan"), lab) for b, f, lab in rs if b]
    if rs:
        lo_b, lo_f = min(rs), min(rs, key=lambda x: x[1])
        fio_words = ("fio with its buffers on reserved huge pages (`--mem=shmhuge`)" if huge else
                     "fio (its buffers on 4 KiB pages: no huge pages could be reserved; bare is the huge-page baseline)")
        L.append(f"Locked cells against the limit: deepnvme/bare lowest {lo_b[0]:.2f}x ({lo_b[2]}), target 0.95x; "
                 f"deepnvme against {fio_words} lowest {lo_f[1]:.2f}x ({lo_f[2]}), target 1.0x. A run on a loaded "
                 "machine or a `--quick` run is no verdict.")
        L.append("")
    L.extend(plain_vs_locked(res["cells"]))
    L.append("The fast-device tier (ext4 on zram, and tmpfs: the kernel's stack without a slow disk under it) "
             "is in [fast_device.md](fast_device.md).")
    L.append("")
    L.append("## Small ops: `sync_pread` round trips per second")
    L.append("")
    L.append("![small ops](small_ops.png)")
    L.append("")
    L.append("Random offsets aligned to the op size inside the file, one at a time, on a locked buffer; "
             "fio: `--ioengine=psync --iodepth=1 --rw=randread --direct=1` on the same file. DeepSpeed's "
             "`sync_pread` opens and closes the file on every call (both implementations do, by contract).")
    L.append("")
    L.append("| op | fio psync qd1 | stock | deepnvme | deepnvme/stock | deepnvme/fio | CPU µs/op fio / stock / deepnvme |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for s in res["small"]:
        o, cp = s["ops_per_s"], s["cpu_us_per_op"]
        L.append(f"| {show_size(s['op_bytes'])} | {med(o['fio-psync']):.0f} | {med(o['stock']):.0f} | "
                 f"**{med(o['deepnvme']):.0f}** | {fmt_ratio(ratio_stats(o['deepnvme'], o['stock']))} | "
                 f"{fmt_ratio(ratio_stats(o['deepnvme'], o['fio-psync']))} | "
                 f"{med(cp['fio-psync']):.1f} / {med(cp['stock']):.1f} / {med(cp['deepnvme']):.1f} |")
    L.append("")
    L.append("## Pinned-memory manager: `is_managed` lookups")
    L.append("")
    im = res.get("is_managed")
    if im:
        L.append("![is_managed](is_managed.png)")
        L.append("")
        L.append("`cargo run --release --example is_managed_bench` (examples/is_managed_bench.rs): "
                 "`PinnedMemoryManager::is_managed` (a page-index lookup under a read lock: one hash probe and at most one table load) against a "
                 "linear scan over the same regions under a mutex, as DeepSpeed's C++ `deepspeed_pin_tensor_t` "
                 "does; each region is a 1-byte allocation (one locked page). Hit: a random live region "
                 "(the scan stops at the match, N/2 entries on average); miss: an address in no region "
                 "(the scan walks all N). ns per lookup, best of 3 timed passes.")
        L.append("")
        L.append(f"Locked memory: {im['memlock']}. vm.max_map_count {im['max_map_count']}.")
        L.append("")
        L.append("| live regions | deepnvme hit | linear hit | deepnvme miss | linear miss | linear/deepnvme (hit) |")
        L.append("|---:|---:|---:|---:|---:|---:|")
        for r in im["rows"]:
            L.append(f"| {r['regions']:,} | {r['deepnvme_hit_ns']:.1f} ns | {r['linear_hit_ns']:.1f} ns | "
                     f"{r['deepnvme_miss_ns']:.1f} ns | {r['linear_miss_ns']:.1f} ns | "
                     f"{r['linear_hit_ns'] / r['deepnvme_hit_ns']:.1f}x |")
        for s in im.get("skipped", []):
            L.append(f"\nSkipped: {s}")
    else:
        L.append("(is_managed_bench did not run; see the run's stderr)")
    L.append("")
    L.append("## Reproduce")
    L.append("")
    L.append("```sh")
    L.append("benches/run.sh            # full run: 384 throughput runs, 24 small-op runs, is_managed; 7-9 min")
    L.append("                          # after setup; the first stock JIT build adds minutes")
    L.append("benches/run.sh --quick    # harness check: 24 + 6 runs, 2-3 min after setup")
    L.append("benches/run.sh --help     # --rounds N, --size, --dir, --quick, --fast-device, --no-fast-device")
    L.append("                          # (as root, run.sh also runs the fast-device tier: fast_device.md)")
    L.append("```")
    L.append("")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    main()
