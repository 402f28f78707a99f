"""Ops take effect in submission order: a seeded, model-based check of one
aio_handle against a byte-exact reference model.

The rule (DeepSpeed's semantics): for caller memory that overlaps on one
handle, ops take effect in the order they were submitted -- a later op's
bytes are never overwritten by an earlier op's, a write sends what the
buffer holds after every earlier op on it -- and file bytes likewise (a read
after a write of the same file bytes sees the write). Effects are only
promised once `wait()` (or a blocking op, which waits for everything
pending) has returned, so the model is only compared then, and no buffer of
an op in flight is touched meanwhile.

* Named regressions for the two reported sequences on a plain (bounced)
  tensor of 64 MiB: `async_pread(t, A)` then `sync_pread(t, B)` must leave B
  in t; `async_pread(t, A)` then `sync_pwrite(t, out)` must write A.
* The model: a random sequence of sync_pread / sync_pwrite / async_pread /
  async_pwrite / pread / pwrite (async or not) / wait, plus pauses (async
  ops finish while the caller is away) and caller writes into idle buffers,
  at page-aligned, 512-aligned and odd file offsets and buffer positions,
  over three pre-filled files of fixed size and narrows of a few base
  buffers (locked, plain torch, torch-pinned where CUDA is there, numpy and
  locked numpy on the pyo3 front end), overlapping narrows included. The
  reference is a bytearray per base buffer and file, each op applied at
  submit time; after every wait/blocking op EVERY byte of every base buffer
  and file is compared (files with plain reads), and return codes too.
* The same with two threads sharing the handle, each with its own buffers
  and files (so each thread's model is well defined), waits issued from
  either thread (a wait in one finishes the other's ops); each thread's
  state is compared at the end, after a final wait from each thread.

The engine is chosen once per process (DEEPNVME_ENGINE), so every check runs
in a child interpreter per engine (this file, imported there), on this run's
front end (DEEPNVME_FRONTEND is inherited). Each model check runs a fixed
seed and a random one (printed, and named in any failure);
DEEPNVME_MODEL_SEED=<n> replaces the random one to reproduce a failure.
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _util import run_python  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.splitext(os.path.basename(__file__))[0]
ENGINES = ["uring", "psync"]
ENGINE_NAMES = {"uring": "io_uring", "psync": "psync"}
FIXED_SEED = 20261201
_SEED_ENV = os.environ.get("DEEPNVME_MODEL_SEED", "").strip()
RANDOM_SEED = int(_SEED_ENV, 0) if _SEED_ENV else random.SystemRandom().randrange(1 << 32)
CHILD_TIMEOUT = 240   # a child that takes longer hangs: reported, never waited for forever
THREAD_TIMEOUT = 120  # joins inside the child
MiB = 1 << 20
PAGE = 4096

# The model's handle: blocks of 64 KiB so ops split and queue, two workers.
MODEL_HANDLE = (64 << 10, 8, False, True, 2)
IOP = MODEL_HANDLE[4]
# The regressions' handle: 1 MiB blocks, two workers.
REGRESSION_HANDLE = (MiB, 8, False, False, 2)
REGRESSION_BYTES = 64 * MiB


# ------------------------------------------------------------ parent side --

def _uring_or_skip(engine):
    if engine != "uring":
        return
    import deepnvme

    why = deepnvme.native().io_uring_unavailable_reason()
    if why:
        pytest.skip(f"io_uring is unavailable here: {why}")


def _frontend():
    import deepnvme

    return deepnvme.choose_frontend()[0]


def _run_child(scenario, engine, tmp_path, args):
    """Runs `scenario` of this file in a fresh interpreter on `engine`;
    returns its result dict (failing the test on a crash or a hang)."""
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import {MODULE} as m; "
            f"sys.exit(m.child_main({scenario!r}, {str(tmp_path)!r}, {json.dumps(args)!r}))")
    started = time.monotonic()
    try:
        proc = run_python(code, timeout=CHILD_TIMEOUT, env={"DEEPNVME_ENGINE": engine})
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{scenario} on {engine} did not finish in {CHILD_TIMEOUT} s (a hang?); its output:\n{out[-4000:]}")
    took = time.monotonic() - started
    print(f"{scenario} on {engine} ({_frontend()} front end): child ran {took:.1f} s")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        pytest.fail(f"{scenario} on {engine}: the child ended (rc {proc.returncode}) without a result\n"
                    f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    for line in proc.stdout.splitlines():
        if line.startswith("INFO "):
            print(line[len("INFO "):])
    return result


def _repro(request, seed):
    return (f"reproduce: DEEPNVME_MODEL_SEED={seed} DEEPNVME_FRONTEND={_frontend()} python -m pytest "
            f"'{request.node.nodeid}' (the seed replaces the random one; the fixed one is {FIXED_SEED})")


@pytest.mark.parametrize("engine", ENGINES)
def test_regression_async_pread_then_sync_pread_into_one_plain_tensor(aio, tmp_path, engine):
    """async_pread(t, A) not waited, then sync_pread(t, B) into the same
    unpinned tensor: t must hold B, not a mix of A and B."""
    _uring_or_skip(engine)
    result = _run_child("read_then_read", engine, tmp_path, {})
    assert result["ok"], result["message"]


@pytest.mark.parametrize("engine", ENGINES)
def test_regression_async_pread_then_sync_pwrite_from_one_plain_tensor(aio, tmp_path, engine):
    """async_pread(t, A) not waited, then sync_pwrite(t, out): out must get
    A's bytes (t after the read), not t's old bytes mixed with A's."""
    _uring_or_skip(engine)
    result = _run_child("read_then_write", engine, tmp_path, {})
    assert result["ok"], result["message"]


@pytest.mark.parametrize("engine", ENGINES)
def test_model_one_thread(aio, tmp_path, engine, request):
    _uring_or_skip(engine)
    print(f"model seeds: fixed {FIXED_SEED}, random {RANDOM_SEED}"
          f"{' (DEEPNVME_MODEL_SEED)' if _SEED_ENV else ''}")
    result = _run_child("model", engine, tmp_path, {"seeds": [FIXED_SEED, RANDOM_SEED], "ops": 150})
    assert result["ok"], f"{result['message']}\n{_repro(request, result.get('seed'))}"


@pytest.mark.parametrize("engine", ENGINES)
def test_model_two_threads_sharing_a_handle(aio, tmp_path, engine, request):
    _uring_or_skip(engine)
    print(f"model seeds: fixed {FIXED_SEED}, random {RANDOM_SEED}"
          f"{' (DEEPNVME_MODEL_SEED)' if _SEED_ENV else ''}")
    result = _run_child("model_threads", engine, tmp_path, {"seeds": [FIXED_SEED, RANDOM_SEED], "ops": 90})
    assert result["ok"], f"{result['message']}\n{_repro(request, result.get('seed'))}"


# ------------------------------------------------------------- child side --

class Mismatch(AssertionError):
    pass


def _load_aio():
    import deepnvme
    from deepspeed.ops.op_builder import AsyncIOBuilder

    aio = AsyncIOBuilder().load()
    name = deepnvme.native().engine_name()
    want = os.environ.get("DEEPNVME_ENGINE")
    if want and ENGINE_NAMES.get(want, want) != name:
        raise RuntimeError(f"DEEPNVME_ENGINE={want} but the engine is {name}")
    return aio


def child_main(scenario, directory, args_json):
    """Entry point in the child: prints `RESULT {json}`; exit status 0 when ok."""
    args = json.loads(args_json)
    os.makedirs(directory, exist_ok=True)
    try:
        aio = _load_aio()
        seed = None
        if scenario == "read_then_read":
            message = _regression_read_then_read(aio, directory)
        elif scenario == "read_then_write":
            message = _regression_read_then_write(aio, directory)
        elif scenario in ("model", "model_threads"):
            run = _model_one_thread if scenario == "model" else _model_threads
            message, failed, summary = None, None, []
            for seed in args["seeds"]:  # each of them: one failure does not hide another
                started = time.monotonic()
                out = run(aio, os.path.join(directory, f"seed-{seed}"), seed, args["ops"])
                line = f"seed {seed}: {'FAILED' if out else 'passed'} in {time.monotonic() - started:.2f} s"
                print(f"INFO {line}", flush=True)
                summary.append(line)
                if out and message is None:
                    message, failed = out, seed
            if message:
                message += "\nruns (" + _context() + "): " + "; ".join(summary)
            seed = failed
        else:
            raise ValueError(scenario)
        result = {"ok": message is None, "message": message or "", "seed": seed}
    except Exception:
        result = {"ok": False, "message": traceback.format_exc()}
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    # A handle whose ops hang would hang the interpreter's exit too.
    os._exit(0 if result["ok"] else 1)


def _engine_name():
    import deepnvme

    return deepnvme.native().engine_name()


def _context():
    import deepnvme

    return f"engine {_engine_name()}, front end {deepnvme.choose_frontend()[0]}"


def _page_census(got, a, b):
    """(pages equal to a, pages equal to b, other pages) of 4 KiB pages."""
    na = nb = other = 0
    for i in range(0, len(got), PAGE):
        g = got[i:i + PAGE]
        if g == b[i:i + PAGE]:
            nb += 1
        elif g == a[i:i + PAGE]:
            na += 1
        else:
            other += 1
    return na, nb, other


def _first_diff(got, want):
    """Index of the first byte where got and want differ (None: equal)."""
    n = min(len(got), len(want))
    step = 1 << 16
    for lo in range(0, n, step):
        if got[lo:lo + step] != want[lo:lo + step]:
            return next(i for i in range(lo, min(lo + step, n)) if got[i] != want[i])
    return None if len(got) == len(want) else n


def _regression_read_then_read(aio, directory):
    import torch

    n = REGRESSION_BYTES
    a, b = random.Random(1).randbytes(n), random.Random(2).randbytes(n)
    pa, pb = os.path.join(directory, "A.bin"), os.path.join(directory, "B.bin")
    for p, d in ((pa, a), (pb, b)):
        with open(p, "wb") as f:
            f.write(d)
    h = aio.aio_handle(*REGRESSION_HANDLE)
    # The pause lets the first read finish while the caller is elsewhere
    # (as when the caller does other work before its next call).
    pauses = [0.1, 0.3, 0.05, 0.1, 0.3, 0.02, 0.1, 0.0]
    for round_, pause in enumerate(pauses):
        t = torch.empty(n, dtype=torch.uint8)  # plain memory: bounced
        assert h.async_pread(t, pa) == 0
        time.sleep(pause)
        rc = h.sync_pread(t, pb)
        got = t.numpy().tobytes()
        if got != b or rc != 2:
            na, nb, other = _page_census(got, a, b)
            i = _first_diff(got, b)
            return (f"round {round_ + 1} of {len(pauses)} (pause {pause} s; {_context()}; handle "
                    f"{REGRESSION_HANDLE}): h.async_pread(t, A) then h.sync_pread(t, B) into one plain tensor of "
                    f"{n >> 20} MiB: sync_pread returned {rc} (want 2) and t must hold B, but of its {n // PAGE} "
                    f"4-KiB pages {na} hold A's bytes, {nb} B's, {other} neither; first wrong byte at {i}")
    assert h.wait() == 0
    return None


def _regression_read_then_write(aio, directory):
    import torch

    n = REGRESSION_BYTES
    a, old = random.Random(3).randbytes(n), random.Random(4).randbytes(n)
    pa, out = os.path.join(directory, "A.bin"), os.path.join(directory, "out.bin")
    with open(pa, "wb") as f:
        f.write(a)
    h = aio.aio_handle(*REGRESSION_HANDLE)
    pauses = [0.05, 0.1, 0.05, 0.2, 0.02, 0.05, 0.1, 0.0]  # how long the read runs alone first
    for round_, pause in enumerate(pauses):
        t = torch.frombuffer(bytearray(old), dtype=torch.uint8).clone()  # plain, holding `old`
        assert h.async_pread(t, pa) == 0
        time.sleep(pause)
        rc = h.sync_pwrite(t, out)
        with open(out, "rb") as f:
            written = f.read()
        got_t = t.numpy().tobytes()
        if written != a or got_t != a or rc != 2:
            n_old, n_a, other = _page_census(written, old, a)
            i = _first_diff(written, a)
            return (f"round {round_ + 1} of {len(pauses)} (pause {pause} s; {_context()}; handle "
                    f"{REGRESSION_HANDLE}): h.async_pread(t, A) then h.sync_pwrite(t, out) from one plain tensor "
                    f"of {n >> 20} MiB: sync_pwrite returned {rc} (want 2); out must hold A (t after the read), "
                    f"but of its {len(written) // PAGE} 4-KiB pages {n_a} hold A's bytes, {n_old} t's old bytes, "
                    f"{other} neither (first wrong byte at {i}); t itself {'holds' if got_t == a else 'does not hold'}"
                    f" A afterwards")
    assert h.wait() == 0
    return None


# The model ---------------------------------------------------------------

class Base:
    """A base buffer, its narrows, and its model bytes."""

    def __init__(self, name, kind, obj, size):
        self.name, self.kind, self.obj, self.size = name, kind, obj, size
        self.model = bytearray(size)

    def _array(self):
        import numpy as np

        return self.obj if isinstance(self.obj, np.ndarray) else self.obj.numpy()

    def view(self, start, length):
        return self.obj[start:start + length]

    def set(self, start, data):
        import numpy as np

        self._array()[start:start + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.model[start:start + len(data)] = data

    def actual(self):
        return self._array().tobytes()


class File:
    def __init__(self, name, path, data):
        self.name, self.path, self.size = name, path, len(data)
        self.model = bytearray(data)
        with open(path, "wb") as f:
            f.write(data)

    def actual(self):
        with open(self.path, "rb") as f:
            return f.read()


def _make_bases(h, rng, prefix, sizes):
    """The base buffers of this front end: (bases, notes on kinds skipped)."""
    import torch

    notes = []
    kinds = ["locked", "plain", "torch_pinned"]
    import deepnvme

    if deepnvme.choose_frontend()[0] == "pyo3":
        kinds += ["numpy", "numpy_locked"]
    else:
        notes.append("numpy kinds: pyo3 front end only")
    bases = []
    for i, kind in enumerate(kinds):
        size = sizes[i % len(sizes)]
        if kind == "locked":
            obj = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
        elif kind == "plain":
            obj = torch.empty(size, dtype=torch.uint8)
        elif kind == "torch_pinned":
            if not torch.cuda.is_available():
                notes.append("torch_pinned skipped: torch.cuda is unavailable (pin_memory needs CUDA)")
                continue
            obj = torch.empty(size, dtype=torch.uint8).pin_memory()
        elif kind == "numpy":
            import numpy as np

            obj = np.empty(size, dtype=np.uint8)
        else:
            import numpy as np

            obj = h.new_cpu_locked_tensor(size, np.empty(0, dtype=np.uint8))
        b = Base(f"{prefix}{kind}", kind, obj, size)
        b.set(0, rng.randbytes(size))
        bases.append(b)
    return bases, notes


def _free_bases(h, bases):
    for b in bases:
        if b.kind in ("locked", "numpy_locked"):
            h.free_cpu_locked_tensor(b.obj)


def _pick_len(rng, limit):
    r = rng.random()
    if r < 0.15:
        n = rng.randrange(1, 2048) * 2
    elif r < 0.40:
        n = rng.randrange(1, 17) * PAGE
    elif r < 0.70:
        n = rng.randrange(1, 512) * 512
    else:
        n = rng.randrange(PAGE, limit + 1)
    n = min(n, limit)
    return max(IOP, n - n % IOP)


def _pick_pos(rng, span):
    """A position in 0..span: page-aligned mostly, some 512-aligned or odd."""
    r = rng.random()
    if r < 0.25 or span == 0:
        return 0 if r < 0.15 or span < PAGE else span - span % PAGE
    if r < 0.60:
        return rng.randrange(0, span // PAGE + 1) * PAGE
    if r < 0.80:
        return rng.randrange(0, span // 512 + 1) * 512
    return rng.randrange(0, span + 1)


class Model:
    """One thread's ops on a shared handle, its bases and files, its model."""

    OPS = ("sync_pread", "sync_pwrite", "async_pread", "async_pwrite", "pread", "pwrite", "wait", "pause", "poke")

    def __init__(self, h, rng, bases, files, weights, check_counts):
        self.h, self.rng, self.bases, self.files = h, rng, bases, files
        self.weights = weights
        self.check_counts = check_counts  # only meaningful with one thread
        self.history = []
        self.pending = 0          # own async ops since this thread's last wait/blocking op
        self.inflight = []        # views of ops in flight, kept alive until waited for
        self.last = None          # the last op's (base, start, length): reused to overlap
        self.checked_after = 0    # history index of the last checkpoint that passed
        self.snapshot = {}        # every model's bytes at the last checkpoint that passed
        # Since then: (op index, destination name, start, bytes, source name, source start).
        self.window = []

    # -- generation (depends on the seed and the op sequence only, never on timing) --
    def next_op(self):
        rng = self.rng
        names = [n for n in self.OPS if n != "poke" or (self.pending == 0 and self.check_counts)]
        op = rng.choices(names, weights=[self.weights[n] for n in names])[0]
        if op == "wait":
            return {"op": op}
        if op == "pause":
            return {"op": op, "seconds": rng.choice([0.001, 0.004, 0.02])}
        if op == "poke":
            b = rng.choice(self.bases)
            n = min(b.size, rng.randrange(1, 64 << 10))
            s = rng.randrange(0, b.size - n + 1)
            return {"op": op, "base": b, "start": s, "data": rng.randbytes(n)}
        f = rng.choice(self.files)
        if self.last is not None and rng.random() < 0.35:
            b, s, n = self.last  # the same memory again (the reported pattern), maybe another file
            n = min(n, f.size)
        else:
            b = rng.choice(self.bases)
            n = _pick_len(rng, min(b.size, f.size))
            s = _pick_pos(rng, b.size - n)
        off = _pick_pos(rng, f.size - n)
        spec = {"op": op, "base": b, "start": s, "len": n, "file": f, "offset": off}
        if op in ("pread", "pwrite"):
            spec["async"] = rng.random() < 0.6
        self.last = (b, s, n)
        return spec

    @staticmethod
    def describe(spec):
        op = spec["op"]
        if op == "wait":
            return "wait()"
        if op == "pause":
            return f"pause {spec['seconds']} s"
        if op == "poke":
            return f"caller writes {len(spec['data'])} B into {spec['base'].name}[{spec['start']}:]"
        b, s, n, f, off = spec["base"], spec["start"], spec["len"], spec["file"], spec["offset"]
        arrow = "<-" if "read" in op else "->"
        extra = f", async={spec['async']}" if "async" in spec else ""
        return f"{op}({b.name}[{s}:{s + n}] {arrow} {f.name}@{off}, {n} B{extra})"

    # -- execution --
    def step(self, spec):
        """Submits `spec`, applies it to the model; returns True at a checkpoint."""
        h, op = self.h, spec["op"]
        index = len(self.history)
        self.history.append(f"#{index} {self.describe(spec)}")
        if op == "pause":
            time.sleep(spec["seconds"])
            return False
        if op == "poke":
            spec["base"].set(spec["start"], spec["data"])
            self.window.append((index, spec["base"].name, spec["start"], spec["data"], None, None))
            return False
        if op == "wait":
            rc = h.wait()
            self._count(rc, self.pending, index)
            self._all_finished()
            return True
        b, s, n, f, off = spec["base"], spec["start"], spec["len"], spec["file"], spec["offset"]
        view = b.view(s, n)
        reading = "read" in op
        is_async = op.startswith("async_") or spec.get("async", False)
        # The model takes the op's effect now, in submission order.
        if reading:
            b.model[s:s + n] = f.model[off:off + n]
            self.window.append((index, b.name, s, bytes(b.model[s:s + n]), f.name, off))
        else:
            f.model[off:off + n] = b.model[s:s + n]
            self.window.append((index, f.name, off, bytes(f.model[off:off + n]), b.name, s))
        if op == "sync_pread":
            rc = h.sync_pread(view, f.path, off)
        elif op == "sync_pwrite":
            rc = h.sync_pwrite(view, f.path, off)
        elif op == "async_pread":
            rc = h.async_pread(view, f.path, off)
        elif op == "async_pwrite":
            rc = h.async_pwrite(view, f.path, off)
        elif op == "pread":
            rc = h.pread(view, f.path, False, is_async, off)
        else:
            rc = h.pwrite(view, f.path, False, is_async, off)
        self.history[-1] += f" -> {rc}"
        if is_async:
            if rc != 0:
                raise Mismatch(self.report(f"{op} returned {rc}, want 0"))
            self.pending += 1
            self.inflight.append(view)
            return False
        self._count(rc, self.pending + 1, index)
        self._all_finished()
        return True

    def _count(self, rc, want, index):
        if self.check_counts and rc != want:
            raise Mismatch(self.report(f"op #{index} returned {rc}; want {want} (the ops it finished)"))
        if not self.check_counts and rc < 0:
            raise Mismatch(self.report(f"op #{index} returned {rc}"))

    def _all_finished(self):
        self.pending = 0
        self.inflight.clear()

    def check(self, when):
        """Compares every byte of every base buffer and file with the model."""
        for thing in list(self.bases) + list(self.files):
            got = thing.actual()
            want = bytes(thing.model)
            if got == want:
                continue
            i = _first_diff(got, want)
            diffs = [j for j in range(i, min(len(got), len(want))) if got[j] != want[j]]
            last = diffs[-1] if diffs else i
            what = (f"{thing.name}: {len(diffs)} bytes differ from the model, first at byte {i} "
                    f"(got {got[i:i + 16].hex()} want {want[i:i + 16].hex()}), last at byte {last}")
            if len(got) != len(want):
                what = f"{thing.name}: {len(got)} bytes, the model has {len(want)}"
            raise Mismatch(self.report(f"after {when}: {what}", thing, i, got))
        self.checked_after = len(self.history)
        self.snapshot = {t.name: bytes(t.model) for t in list(self.bases) + list(self.files)}
        self.window.clear()

    def attribute(self, name, byte, got):
        """Whose bytes `got` holds at `byte` of `name`: the state at the last
        good check, or one of the ops since then that wrote there."""
        seen = got[byte:byte + 16]
        found = []
        old = self.snapshot.get(name)
        if old is not None and old[byte:byte + len(seen)] == seen:
            found.append("the bytes it held at the last good check (as if no op since had run)")
        for index, dest, start, data, src, src_start in self.window:
            if dest == name and start <= byte < start + len(data):
                part = data[byte - start:byte - start + len(seen)]
                if part == seen[:len(part)]:
                    found.append(f"op #{index}'s bytes")
                elif src is not None and src in self.snapshot:
                    at = src_start + byte - start
                    if self.snapshot[src][at:at + len(part)] == seen[:len(part)]:
                        found.append(f"what op #{index}'s source {src} held at the last good check (the ops "
                                     f"before #{index} on {src} had not taken effect)")
        return found

    def report(self, what, thing=None, byte=None, got=None):
        lines = [f"{what} [{_context()}; handle {MODEL_HANDLE}]"]
        if thing is not None and byte is not None and got is not None:
            found = self.attribute(thing.name, byte, got)
            lines.append(f"what {thing.name} holds at byte {byte} is " + (" or ".join(found) if found else
                                                                           "none of the recent ops' bytes"))
        if thing is not None and byte is not None:
            touching = [h for h in self.history[:self.checked_after] if _touches(h, thing.name, byte)]
            if touching:
                lines.append(f"earlier ops (all checked good after them) that touched {thing.name} byte {byte}:")
                lines += ["  " + h for h in touching[-4:]]
        since = self.history[self.checked_after:]
        lines.append(f"ops since the last good check ({self.checked_after} ops before it):")
        if len(since) > 40 and thing is not None and byte is not None:
            touching = [h for h in since if _touches(h, thing.name, byte)]
            lines.append(f"  ({len(since)} ops; those that touched {thing.name} byte {byte}, then the last 12:)")
            lines += ["  " + h for h in touching] + ["  ..."] + ["  " + h for h in since[-12:]]
        else:
            lines += ["  " + h for h in since]
        return "\n".join(lines)


def _touches(history_line, name, byte):
    """Whether a history line's op covered `byte` of `name` (a base or file)."""
    import re

    m = re.search(r"\((\S+)\[(\d+):(\d+)\] (<-|->) (\S+)@(\d+), (\d+) B", history_line)
    if not m:
        return False
    base, s, e, _, f, off, n = m.groups()
    if base == name:
        return int(s) <= byte < int(e)
    if f == name:
        return int(off) <= byte < int(off) + int(n)
    return False


def _files(rng, directory, prefix, sizes):
    return [File(f"{prefix}f{i}", os.path.join(directory, f"{prefix}f{i}.bin"), rng.randbytes(size))
            for i, size in enumerate(sizes)]


WEIGHTS = {"sync_pread": 10, "sync_pwrite": 8, "async_pread": 22, "async_pwrite": 18, "pread": 10,
           "pwrite": 8, "wait": 10, "pause": 6, "poke": 4}


def _model_one_thread(aio, directory, seed, nops):
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    h = aio.aio_handle(*MODEL_HANDLE)
    bases, notes = _make_bases(h, rng, "", [1 * MiB, 2 * MiB, 512 << 10])
    files = _files(rng, directory, "", [4 * MiB, 3 * MiB + 512, 2 * MiB + 6])
    print(f"INFO seed {seed}: bases {[(b.name, b.size) for b in bases]}; {'; '.join(notes)}", flush=True)
    m = Model(h, rng, bases, files, WEIGHTS, check_counts=True)
    try:
        m.check("setup")
        for _ in range(nops):
            spec = m.next_op()
            if m.step(spec):
                m.check(m.history[-1])
        m.step({"op": "wait"})
        m.check("the final wait()")
    except Mismatch as e:
        h.wait()
        return f"seed {seed}: {e}"
    finally:
        try:
            h.wait()
        except RuntimeError:
            pass
    _free_bases(h, bases)
    return None


def _model_threads(aio, directory, seed, nops):
    os.makedirs(directory, exist_ok=True)
    h = aio.aio_handle(*MODEL_HANDLE)
    models, errors = [], [None, None]
    # Thread 0 mostly submits; thread 1 waits often, so it finishes thread 0's ops.
    weights = [dict(WEIGHTS, wait=3, poke=0, sync_pread=4, sync_pwrite=3),
               dict(WEIGHTS, wait=18, poke=0)]
    for k in range(2):
        rng = random.Random(seed * 7919 + k + 1)
        bases, _ = _make_bases(h, rng, f"t{k}.", [1 * MiB, 512 << 10, 768 << 10])
        files = _files(rng, directory, f"t{k}.", [2 * MiB, 1 * MiB + 512])
        models.append(Model(h, rng, bases, files, weights[k], check_counts=False))
    start = threading.Barrier(2, timeout=THREAD_TIMEOUT)

    def run(k):
        m = models[k]
        try:
            start.wait()
            for _ in range(nops):
                m.step(m.next_op())
            m.step({"op": "wait"})  # the final wait from each thread
        except Exception:
            errors[k] = traceback.format_exc() + "\n" + m.report("thread stopped")

    threads = [threading.Thread(target=run, args=(k,), daemon=True, name=f"model-{k}") for k in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + THREAD_TIMEOUT
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        hung = [t.name for t in threads if t.is_alive()]
        return f"seed {seed}: threads {hung} did not finish in {THREAD_TIMEOUT} s (a hang?); " + "\n".join(
            f"thread {k} history tail: {models[k].history[-10:]}" for k in range(2))
    for k in range(2):
        if errors[k]:
            return f"seed {seed}: thread {k}: {errors[k]}"
    assert h.wait() == 0, "ops still pending after both threads' final wait()"
    for k, m in enumerate(models):
        try:
            m.check(f"both threads' final wait() (thread {k}'s state)")
        except Mismatch as e:
            return f"seed {seed}, thread {k} of 2 sharing the handle: {e}"
    for m in models:
        _free_bases(h, m.bases)
    return None
