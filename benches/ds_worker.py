#!/usr/bin/env python3
"""One run of one config of one DeepSpeed async_io implementation, as JSON.

    python benches/ds_worker.py --impl deepnvme --op read --file F --size 256M \\
        --block-size 1M --queue-depth 32 --parallelism 1 --overlap-events 1 --buffer locked

--impl stock     DEEPNVME_DEEPSPEED_HOOK=0: the deepnvme hook steps aside and
                 AsyncIOBuilder().load() JIT-builds DeepSpeed's own op (libaio)
                 from the installed deepspeed package.
--impl deepnvme  the hook on: AsyncIOBuilder().load() returns deepnvme.async_io.

--op read|write  moves --size bytes at increasing offsets in ops of --op-bytes
                 (one sync_pread/sync_pwrite each, on one buffer), and reports
                 GB/s (10^9 bytes/s) of the timed loop and CPU seconds per GB
                 (getrusage(RUSAGE_SELF) user+system delta over the same loop:
                 every thread of this process, io_uring/libaio kernel work
                 included).
--op small       sync_pread of --op-bytes at random --op-bytes-aligned offsets
                 inside the first --size bytes of the file for --seconds:
                 round trips per second (each call opens the file, as
                 DeepSpeed's sync_pread does).
--passes N       the timed loop runs N passes over --size (per-op times and
                 the median op's GB/s come back too); --warmup 0 leaves out
                 the untimed first op.
--buffer locked  h.new_cpu_locked_tensor(...) (I/O goes straight to it);
--buffer plain   torch.empty(...) (not page-locked: the bounce path).

--serve          read one JSON config per line on stdin (keys as the options,
                 with "-" as "_"), answer one JSON line each; the module is
                 loaded once, a new handle and buffer are made per config,
                 and one op of the config's op size runs (all untimed).
                 `benches/run.py` drives workers this way so that
                 torch's import time stays out of every run.
"""

import argparse
import json
import os
import random
import statistics
import sys
import time


# The harness's own size parser (this script runs from benches/, so run.py is
# importable; it imports only the standard library).
from run import parse_size  # noqa: E402
from bench_common import cpu_seconds  # noqa: E402


def anon_huge_bytes():
    """AnonHugePages of /proc/self/smaps_rollup, in bytes (None if unreadable)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def physical_runs(torch, buf):
    """How many physically contiguous runs the buffer's pages form (1 for one
    contiguous range, one per page when scattered), from /proc/self/pagemap;
    None when the frame numbers are hidden (not root) or unreadable."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = buf.data_ptr() // page
    end = (buf.data_ptr() + buf.numel() * buf.element_size() + page - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(start * 8)
            raw = f.read((end - start) * 8)
    except OSError:
        return None
    entries = torch.frombuffer(bytearray(raw), dtype=torch.int64)
    pfn = entries & ((1 << 55) - 1)
    if len(pfn) == 0 or int(pfn.max()) == 0:  # frame numbers read as 0 without CAP_SYS_ADMIN
        return None
    return 1 + int((pfn[1:] != pfn[:-1] + 1).sum())


class Impl:
    def __init__(self, impl):
        import torch  # noqa: F401
        from deepspeed.ops.op_builder import AsyncIOBuilder

        self.torch = torch
        b = AsyncIOBuilder()
        self.compatible = bool(b.is_compatible())
        if not self.compatible:
            raise SystemExit(f"ds_worker: AsyncIOBuilder().is_compatible() is False for --impl {impl}")
        t0 = time.time()
        self.mod = b.load()
        self.load_seconds = time.time() - t0
        self.module_name = self.mod.__name__
        want_deepnvme = impl == "deepnvme"
        if want_deepnvme != self.module_name.startswith("deepnvme"):
            raise SystemExit(f"ds_worker: --impl {impl} loaded {self.module_name} ({getattr(self.mod, '__file__', '?')})")
        self.impl = impl

    def run(self, c):
        torch = self.torch
        op = c["op"]
        size = parse_size(c["size"])
        op_bytes = parse_size(c.get("op_bytes") or min(size, 256 << 20))
        h = self.mod.aio_handle(
            block_size=parse_size(c.get("block_size", "1M")),
            queue_depth=int(c.get("queue_depth", 32)),
            single_submit=bool(int(c.get("single_submit", 0))),
            overlap_events=bool(int(c.get("overlap_events", 1))),
            intra_op_parallelism=int(c.get("parallelism", 1)),
        )
        buffer = c.get("buffer", "locked")
        if buffer == "locked":
            buf = h.new_cpu_locked_tensor(op_bytes, torch.empty(0, dtype=torch.uint8))
        elif buffer == "plain":
            buf = torch.empty(op_bytes, dtype=torch.uint8)
        else:
            raise SystemExit(f"ds_worker: --buffer must be locked or plain, not {buffer}")
        buf.fill_(0x5A)
        huge = anon_huge_bytes()
        runs = physical_runs(torch, buf)
        path = c["file"]
        out = {
            "impl": self.impl,
            "module": self.module_name,
            "op": op,
            "buffer": buffer,
            "pinned": bool(h.is_pinned(buf)),
            "size_bytes": size,
            "op_bytes": op_bytes,
            "block_size": h.get_block_size(),
            "queue_depth": h.get_queue_depth(),
            "single_submit": bool(h.get_single_submit()),
            "overlap_events": bool(h.get_overlap_events()),
            "parallelism": h.get_intra_op_parallelism(),
            # The process's anonymous memory on huge pages once the buffer is
            # filled: ~op_bytes when the buffer got them, ~0 when not.
            "anon_huge_bytes": huge,
            # Physically contiguous runs of the buffer's pages: where a 4 KiB-
            # paged buffer landed, which decides the stock op's zram writes
            # (docs/perf/harnesses.md).
            "physical_runs": runs,
        }
        try:
            if op in ("read", "write"):
                if size % op_bytes:
                    raise SystemExit(f"ds_worker: --size {size} is not a multiple of --op-bytes {op_bytes}")
                call = h.sync_pread if op == "read" else h.sync_pwrite
                # One untimed op first: a training job's handle and buffers are
                # warm (rings made, fixed buffers registered, bounce pool
                # filled); the timed loop measures that steady state.
                # warmup 0 times a fresh handle's first op too.
                if int(c.get("warmup", 1)) and call(buf, path, 0) < 0:
                    raise SystemExit(f"ds_worker: the untimed first {op} returned an error")
                passes = int(c.get("passes", 1))
                op_seconds = []
                c0, t0 = cpu_seconds(), time.perf_counter()
                for _ in range(passes):
                    for off in range(0, size, op_bytes):
                        t = time.perf_counter()
                        r = call(buf, path, off)
                        op_seconds.append(time.perf_counter() - t)
                        if r < 0:
                            raise SystemExit(f"ds_worker: {op} at offset {off} returned {r}")
                secs = time.perf_counter() - t0
                cpu = cpu_seconds() - c0
                moved = size * passes
                out.update(seconds=secs, gb_per_s=moved / secs / 1e9, cpu_s_per_gb=cpu / (moved / 1e9),
                           op_seconds=op_seconds, gb_per_s_median_op=op_bytes / statistics.median(op_seconds) / 1e9)
            elif op == "small":
                seconds = float(c.get("seconds", 3))
                slots = size // op_bytes
                rng = random.Random(int(c.get("seed", 1)))
                offsets = [rng.randrange(slots) * op_bytes for _ in range(4096)]
                n = 0
                c0, t0 = cpu_seconds(), time.perf_counter()
                deadline = t0 + seconds
                while True:
                    for _ in range(64):  # check the clock every 64 round trips
                        off = offsets[n & 4095]
                        if h.sync_pread(buf, path, off) < 0:
                            raise SystemExit(f"ds_worker: sync_pread at {off} failed")
                        n += 1
                    if time.perf_counter() >= deadline:
                        break
                secs = time.perf_counter() - t0
                cpu = cpu_seconds() - c0
                moved = n * op_bytes
                out.update(seconds=secs, ops=n, ops_per_s=n / secs, gb_per_s=moved / secs / 1e9,
                           cpu_s_per_gb=cpu / (moved / 1e9), cpu_us_per_op=cpu / n * 1e6)
            else:
                raise SystemExit(f"ds_worker: --op must be read, write or small, not {op}")
        finally:
            if buffer == "locked":
                h.free_cpu_locked_tensor(buf)
            del h
        return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("stock", "deepnvme"), required=True)
    p.add_argument("--serve", action="store_true")
    p.add_argument("--op", choices=("read", "write", "small"))
    p.add_argument("--file")
    p.add_argument("--size", default="256M")
    p.add_argument("--op-bytes", default=None, help="bytes per op and buffer [min(size, 256M)]")
    p.add_argument("--block-size", default="1M")
    p.add_argument("--queue-depth", type=int, default=32)
    p.add_argument("--parallelism", type=int, default=1)
    p.add_argument("--single-submit", type=int, default=0)
    p.add_argument("--overlap-events", type=int, default=1)
    p.add_argument("--buffer", choices=("locked", "plain"), default="locked")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--passes", type=int, default=1, help="timed passes over --size [1]")
    p.add_argument("--warmup", type=int, default=1, help="1: one untimed op first [1]; 0: every op timed")
    a = p.parse_args()

    # The hook is installed by a .pth file at interpreter start-up, so the
    # switch must be in the environment before Python starts: re-exec once.
    want = "0" if a.impl == "stock" else "1"
    if os.environ.get("DEEPNVME_DEEPSPEED_HOOK", "1") != want:
        env = dict(os.environ, DEEPNVME_DEEPSPEED_HOOK=want)
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)

    # Our JSON goes to the real stdout; everything else that writes to fd 1
    # (DeepSpeed's JIT build log, C++ prints) goes to stderr instead.
    out_stream = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)

    def emit(obj):
        out_stream.write(json.dumps(obj) + "\n")
        out_stream.flush()

    impl = Impl(a.impl)
    if not a.serve:
        if not a.op or not a.file:
            p.error("--op and --file are needed without --serve")
        c = {k: v for k, v in vars(a).items() if k not in ("impl", "serve")}
        out = impl.run(c)
        out["load_seconds"] = impl.load_seconds
        emit(out)
        return
    emit({"ready": True, "impl": a.impl, "module": impl.module_name, "load_seconds": impl.load_seconds})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            out = impl.run(json.loads(line))
        except SystemExit as e:
            out = {"error": str(e)}
        except Exception as e:  # report and keep serving
            out = {"error": f"{type(e).__name__}: {e}"}
        emit(out)


if __name__ == "__main__":
    main()
