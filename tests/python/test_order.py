"""One order for every op on a handle, from every thread (issue 30), on this
run's front end, each check in a child interpreter per engine:

* the reproductions: while one thread's blocking call runs (a windowed
  `sync_pwrite` or `sync_pread` of a plain tensor, DeepSpeed's `write`), a
  second thread submits `async_pwrite` over the same file bytes and waits.
  The blocking call was first, so it takes effect whole, first: the file
  ends with the async write's bytes only, and the blocking read returns
  none of them;
* a signal handler that calls `wait()`, `sync_pread` and `async_pwrite` on
  the handle whose blocking read it interrupts: 20 of 20 runs finish with
  the right bytes (it used to hang), with the read's memory plain (windowed)
  or locked (queued);
* a model: three threads share tensors (locked and plain) and files, each
  mixing sync_*/async_*/pread/pwrite/read/write with sizes that run inline,
  queued and windowed; after each round every byte must equal a reference
  that applied the ops in the order the handle admitted them (the sequence
  number `deepnvme._native._last_admitted_seq()` reports per thread). A fixed
  seed and a random one (printed; DEEPNVME_MODEL_SEED replays it);
* a read behind a pending `async_pwrite` that grows the file (absent or
  shorter before), by every read call, of locked and plain tensors: it
  sees the write's bytes instead of being refused as past the end.
"""

import os
import random
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import run_python  # noqa: E402

ENGINES = ["io_uring", "psync"]
FIXED_SEED = 20261202
_SEED_ENV = os.environ.get("DEEPNVME_MODEL_SEED", "").strip()
RANDOM_SEED = int(_SEED_ENV, 0) if _SEED_ENV else random.SystemRandom().randrange(1 << 32)

HEAD = r"""
import os, signal, sys, threading, time
import torch
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder

aio = AsyncIOBuilder().load()
MiB = 1 << 20
d = sys.argv[1]
os.makedirs(d, exist_ok=True)

def storage_read_bytes():
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("read_bytes:"))

def until(ready, limit=30.0):
    end = time.monotonic() + limit
    while not ready() and time.monotonic() < end:
        time.sleep(0.001)

def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()
"""

REPRO = HEAD + r"""
kind = sys.argv[2]
n = 64 * MiB if kind == "write_call" else 256 * MiB
h = aio.aio_handle(MiB, 32, False, True, 2)
path = os.path.join(d, kind + ".bin")
gen = torch.Generator().manual_seed(7)
first = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
second = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
if kind == "write_locked":
    second_buf = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    second_buf.copy_(second)
else:
    second_buf = second.clone()
results = []
if kind == "read":
    with open(path, "wb") as f:
        f.write(first.numpy().tobytes())
    back = torch.zeros(n, dtype=torch.uint8)
    before = storage_read_bytes()
    t = threading.Thread(target=lambda: results.append(h.sync_pread(back, path)))
    t.start()
    until(lambda: storage_read_bytes() >= before + 16 * MiB)
else:
    call = (lambda: h.write(first, path, False)) if kind == "write_call" else (lambda: h.sync_pwrite(first, path))
    t = threading.Thread(target=lambda: results.append(call()))
    t.start()
    until(lambda: os.path.exists(path) and os.path.getsize(path) >= 16 * MiB)
assert h.async_pwrite(second_buf, path) == 0
h.wait()
t.join()
assert len(results) == 1, results
got = file_bytes(path)
want = second.numpy().tobytes()
if got != want:
    pages = len(want) // 4096
    same = sum(got[i * 4096:(i + 1) * 4096] == want[i * 4096:(i + 1) * 4096] for i in range(pages))
    raise SystemExit(f"the file holds {same} of {pages} pages of the later async write: the blocking call did not "
                     "take effect whole, first")
if kind == "read":
    assert torch.equal(back, first), "the blocking read returned bytes of the later write"
print("ORDER-OK", flush=True)
"""

HANDLER = HEAD + r"""
mode = sys.argv[2]
n = 64 * MiB
# Small blocks, few in flight: the read lasts long enough to be interrupted.
h = aio.aio_handle(64 << 10, 4, False, True, 1)
big = os.path.join(d, "big.bin")
small = os.path.join(d, "small.bin")
out = os.path.join(d, "out.bin")
want = torch.randint(0, 256, (n,), dtype=torch.uint8)
side_want = torch.randint(0, 256, (8 * MiB,), dtype=torch.uint8)
with open(big, "wb") as f:
    f.write(want.numpy().tobytes())
with open(small, "wb") as f:
    f.write(side_want.numpy().tobytes())
in_call = [False]
during = [0]

def handler(signum, frame):
    # Every kind of call on the handle whose blocking read this interrupts.
    during[0] += in_call[0]
    h.wait()
    side = torch.zeros(8 * MiB, dtype=torch.uint8)  # plain, above a window: itself windowed
    h.sync_pread(side, small)
    assert torch.equal(side, side_want), "the handler's own read"
    assert h.async_pwrite(side_want[:MiB].clone(), out) == 0

signal.signal(signal.SIGUSR1, handler)
for run in range(20):
    if mode == "locked":
        buf = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8))
    else:
        buf = torch.zeros(n, dtype=torch.uint8)
    before = storage_read_bytes()
    def poke():
        until(lambda: storage_read_bytes() >= before + 4 * MiB, 10)
        os.kill(os.getpid(), signal.SIGUSR1)
    threading.Thread(target=poke).start()
    in_call[0] = True
    h.sync_pread(buf, big)
    in_call[0] = False
    h.wait()
    assert torch.equal(buf, want), f"run {run}: the interrupted read's bytes"
    assert file_bytes(out) == side_want[:MiB].numpy().tobytes(), f"run {run}: the handler's write"
    if mode == "locked":
        h.free_cpu_locked_tensor(buf)
print("HANDLER-OK", during[0], flush=True)
"""

MODEL = HEAD + r"""
import random
seed = int(sys.argv[2])
native = deepnvme.native()
h = aio.aio_handle(64 << 10, 8, False, True, 2)
B = F = 24 * MiB
rng = random.Random(seed)
gen = torch.Generator().manual_seed(seed)
locked = h.new_cpu_locked_tensor(B, torch.empty(0, dtype=torch.uint8))
locked.copy_(torch.randint(0, 256, (B,), dtype=torch.uint8, generator=gen))
plain = torch.randint(0, 256, (B,), dtype=torch.uint8, generator=gen)
bases = [locked, plain]
model_bases = [bytearray(b.numpy().tobytes()) for b in bases]
files = [os.path.join(d, f"f{i}.bin") for i in range(2)]
model_files = []
for p in files:
    data = torch.randint(0, 256, (F,), dtype=torch.uint8, generator=gen).numpy().tobytes()
    with open(p, "wb") as f:
        f.write(data)
    model_files.append(bytearray(data))
ENTRIES = ["sync_pread", "sync_pwrite", "async_pread", "async_pwrite", "pread", "pwrite", "read", "write"]

def pick(r):
    kind = r.randrange(3)
    if kind == 0:
        return 1024 * r.randrange(1, 8)
    if kind == 1:
        return 8192 * r.randrange(1, 256)
    return 4096 * r.randrange(1300, 2000)  # 5-8 MiB: windowed when blocking on plain memory

def worker(t, round_seed, out):
    r = random.Random(round_seed * 31 + t)
    done = []
    try:
        for _ in range(10):
            entry = r.choice(ENTRIES)
            n = pick(r)
            b, fi = r.randrange(2), r.randrange(2)
            start = min(r.randrange(0, (B - n) // 512) * 512 + r.choice((0, 2)), B - n)
            off = min(r.randrange(0, (F - n) // 512) * 512 + r.choice((0, 6)), F - n)
            view = bases[b][start:start + n]
            path = files[fi]
            before = native._last_admitted_seq()
            if entry in ("pread", "pwrite"):
                rc = getattr(h, entry)(view, path, False, r.random() < 0.5, off)
            elif entry in ("read", "write"):
                if off:
                    continue  # DeepSpeed's read/write take no offset
                rc = getattr(h, entry)(view, path, False)
            else:
                rc = getattr(h, entry)(view, path, off)
            seq = native._last_admitted_seq()
            assert rc >= 0, (entry, rc)
            assert seq > before, f"thread {t}: {entry} got no later sequence number"
            done.append((seq, entry, b, start, fi, off, n))
    except BaseException as e:
        out.append(("error", t, repr(e)))
    out.append(("ops", t, done))

history = []
for rnd in range(5):
    out = []
    threads = [threading.Thread(target=worker, args=(t, rng.randrange(1 << 30), out)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    h.wait()
    errors = [o for o in out if o[0] == "error"]
    assert not errors, errors
    ops = sorted(op for o in out for op in o[2])
    for seq, entry, b, start, fi, off, n in ops:
        if "read" in entry:
            model_bases[b][start:start + n] = model_files[fi][off:off + n]
        else:
            model_files[fi][off:off + n] = model_bases[b][start:start + n]
    history += ops
    for i, base in enumerate(bases):
        got = base.numpy().tobytes()
        if got != bytes(model_bases[i]):
            at = next(k for k in range(len(got)) if got[k] != model_bases[i][k])
            touching = [op for op in history if op[2] == i and op[3] <= at < op[3] + op[6]]
            raise SystemExit(f"seed {seed} round {rnd}: buffer {i} differs at byte {at}; ops on it: {touching}")
    for i, p in enumerate(files):
        got = file_bytes(p)
        if got != bytes(model_files[i]):
            at = next(k for k in range(len(got)) if got[k] != model_files[i][k])
            touching = [op for op in history if op[4] == i and op[5] <= at < op[5] + op[6]]
            raise SystemExit(f"seed {seed} round {rnd}: file {i} differs at byte {at}; ops on it: {touching}")
print("MODEL-OK", len(history), flush=True)
"""

GROWING = HEAD + r"""
# async_pwrite grows a file (absent, or shorter), then at once, with the
# write still pending, every read call reads those bytes back: the order
# makes the read see the write, so none may be refused as past the end.
h = aio.aio_handle(1 << 20, 32, False, False, 1)
n = 16 * MiB + 4096
calls = {
    "async_pread": lambda r, p: (h.async_pread(r, p, 0), h.wait()),
    "sync_pread": lambda r, p: (h.sync_pread(r, p, 0), h.wait()),
    "pread": lambda r, p: (h.pread(r, p, False, False, 0), h.wait()),
    "read": lambda r, p: (h.read(r, p, False), h.wait()),
}
failures = []
for memory in ("locked", "plain"):
    w = h.new_cpu_locked_tensor(n, torch.empty(0, dtype=torch.uint8)) if memory == "locked" else torch.empty(n, dtype=torch.uint8)
    for name, call in calls.items():
        for start in ("absent", "shorter"):
            w.fill_(0x5A + len(failures) % 7)
            p = os.path.join(d, f"{memory}-{name}-{start}.bin")
            if start == "shorter":
                with open(p, "wb") as f:
                    f.write(b"\0" * 4096)
            assert h.async_pwrite(w, p, 0) == 0
            r = torch.zeros(n, dtype=torch.uint8)
            try:
                rcs = call(r, p)
            except Exception as e:
                failures.append((memory, name, start, f"raised {e}"))
                continue
            if not torch.equal(r, w) or os.path.getsize(p) != n:
                failures.append((memory, name, start, f"returned {rcs}, read the write's bytes: {torch.equal(r, w)}, size {os.path.getsize(p)}"))
    if memory == "locked":
        h.free_cpu_locked_tensor(w)
if failures:
    raise SystemExit(f"reads behind a pending growing write: {failures}")
print("GROWING-OK", flush=True)
"""


def _child(code, args, engine, timeout=600):
    try:
        return run_python(code.replace("sys.argv[1]", repr(args[0])).replace("sys.argv[2]", repr(args[1])),
                          timeout=timeout, env={"DEEPNVME_ENGINE": engine})
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the child did not finish in {timeout} s (a hang?):\n{out[-3000:]}")


def _uring_or_skip(engine):
    import deepnvme

    if engine == "io_uring" and deepnvme.native().io_uring_unavailable_reason():
        pytest.skip(f"io_uring is unavailable here: {deepnvme.native().io_uring_unavailable_reason()}")


@pytest.mark.parametrize("kind", ["write_locked", "write_plain", "read", "write_call"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_blocking_call_takes_effect_whole_before_another_threads_async_write(aio, tmp_path, engine, kind):
    _uring_or_skip(engine)
    proc = _child(REPRO, (str(tmp_path), kind), engine)
    assert proc.returncode == 0 and "ORDER-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("mode", ["plain", "locked"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_signal_handler_may_call_the_handle_it_interrupts(aio, tmp_path, engine, mode):
    _uring_or_skip(engine)
    proc = _child(HANDLER, (str(tmp_path), mode), engine)
    assert proc.returncode == 0 and "HANDLER-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    during = int(proc.stdout.split("HANDLER-OK")[1].split()[0])
    print(f"{engine} {mode}: the handler ran inside the blocking call in {during} of 20 runs")
    assert during > 0, "the handler never ran during the blocking call: the test proved nothing"


@pytest.mark.parametrize("engine", ENGINES)
def test_threads_sharing_tensors_and_files_match_the_model(aio, tmp_path, engine):
    _uring_or_skip(engine)
    print(f"order model seeds: fixed {FIXED_SEED}, random {RANDOM_SEED} (DEEPNVME_MODEL_SEED replays it)")
    for seed in (FIXED_SEED, RANDOM_SEED):
        proc = _child(MODEL, (str(tmp_path / f"seed-{seed}"), str(seed)), engine)
        assert proc.returncode == 0 and "MODEL-OK" in proc.stdout, (
            f"seed {seed} (DEEPNVME_MODEL_SEED={seed}):\n" + proc.stdout[-2000:] + proc.stderr[-3000:])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_read_behind_a_pending_write_that_grows_the_file_sees_it(aio, tmp_path, engine):
    _uring_or_skip(engine)
    proc = _child(GROWING, (str(tmp_path), ""), engine)
    assert proc.returncode == 0 and "GROWING-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
