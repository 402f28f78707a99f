"""The real jobs, end to end, on the CPU accelerator: ZeRO-3 with parameters
and optimizer state offloaded to NVMe through DeepSpeed's own swappers
(examples/zero_infinity.py), and FastPersist checkpoint writing
(deepspeed.io.FastFileWriter), both over deepnvme's aio_handle.

Each ZeRO job runs in a fresh interpreter (DeepSpeed's process group, its
accelerator choice and zero.Init's counters are process-global), driven by
DRIVER below: it loads the example, wraps the async_io module's aio_handle
factory so that every buffer DeepSpeed hands to a transfer is recorded with
what the handle's is_pinned() said of it, runs the job, destroys the engine,
and reports losses, the records and the pinned-memory manager's counters.
Models are tiny (two Linear(512, 512) fp32 layers: each weight is exactly
1 MiB, DeepSpeed's smallest swappable tensor) so a job takes seconds.
"""

import json
import subprocess
import os
import sys

import pytest
import torch


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "zero_infinity.py")
STEPS = 6
JOB_TIMEOUT = 1200  # seconds, all jobs; the first run may JIT-build DeepSpeed's CPU Adam and shm comm ops
# torch.optim.Adam rather than DeepSpeed's CPU Adam: the optimizer is not under
# test, and DeepSpeed's is JIT-built with ninja on first use (tens of minutes
# on a busy 2-core machine). DeepSpeed's shared-memory allreduce op, likewise
# JIT-built and unused by one process, is skipped by the example.
MODEL = ["--layers", "2", "--hidden", "512", "--batch", "4", "--steps", str(STEPS), "--lr", "1e-2",
         "--optimizer", "torch-adam"]

DRIVER = r"""
import gc, importlib.util, json, os, sys, traceback

jobs, out_dir = json.loads(sys.argv[1]), sys.argv[2]
spec = importlib.util.spec_from_file_location("zero_infinity", {example!r})
zi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zi)
zi.prepare_environment(zi.parse_args(jobs[0]["argv"]))

import torch
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder

aio = AsyncIOBuilder().load()
assert aio.__name__ in ("deepnvme.async_io", "deepnvme.frontend"), aio.__name__
native = deepnvme.native()
TRANSFERS = ("async_pread", "async_pwrite", "sync_pread", "sync_pwrite", "pread", "pwrite", "read", "write")
records = []   # (method, is_pinned, contiguous, nbytes) for every transfer DeepSpeed asks for


class RecordingHandle:
    # Stands in for the aio_handle DeepSpeed creates: records every buffer
    # passed to a transfer with what the real handle's is_pinned() says of
    # it, then delegates. Everything else is the real handle's.
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name not in TRANSFERS:
            return attr
        real = self._real

        def transfer(buffer, *rest, **kw):
            records.append((name, bool(real.is_pinned(buffer)), bool(buffer.is_contiguous()),
                            buffer.numel() * buffer.element_size()))
            return attr(buffer, *rest, **kw)

        return transfer


real_factory = aio.aio_handle
aio.aio_handle = lambda *a, **kw: RecordingHandle(real_factory(*a, **kw))
stats_api = hasattr(deepnvme, "stats")

for job in jobs:
    os.environ.update(job.get("env", {{}}))
    del records[:]
    report = {{"name": job["name"]}}
    try:
        args = zi.parse_args(job["argv"])
        gc.collect()
        bounced_before = zi.deepnvme_counters()["bounced_bytes"] if stats_api else None
        pinned_before = native.pinned_stats()
        result = zi.train(args)
        gc.collect()
        result.pop("config", None)
        report.update(result)
        report.update(records=list(records), pinned_before=list(pinned_before),
                      pinned_after=list(native.pinned_stats()), stats_api=stats_api, bounced_before=bounced_before,
                      bounced_after=zi.deepnvme_counters()["bounced_bytes"] if stats_api else None)
    except BaseException:
        report["error"] = traceback.format_exc()
    for k in job.get("env", {{}}):
        os.environ.pop(k, None)
    with open(os.path.join(out_dir, job["name"] + ".json"), "w") as f:
        json.dump(report, f)
"""

# Each knob both ways over four jobs: (pipeline_read, pipeline_write,
# intra_op_parallelism, single_submit, overlap_events).
KNOBS = [
    (False, False, 1, False, False),
    (True, True, 2, True, True),
    (True, False, 2, False, True),
    (False, True, 1, True, False),
]


def knob_flags(pr, pw, par, ss, oe):
    return ["--pipeline-read", str(pr), "--pipeline-write", str(pw), "--intra-op-parallelism", str(par),
            "--single-submit", str(ss), "--overlap-events", str(oe), "--block-size", str(1 << 20),
            "--queue-depth", "8"]


def knob_id(k):
    pr, pw, par, ss, oe = k
    return f"pr{int(pr)}-pw{int(pw)}-par{par}-ss{int(ss)}-oe{int(oe)}"


def job_list(base, stripe=None):
    """Every job the tests look at, in the order one interpreter runs them
    (with `stripe`, a stripe set of two members, the jobs on it too)."""
    def job(name, *flags, env=None):
        return {"name": name, "argv": MODEL + ["--nvme-path", str(base / name / "swap")] + list(flags),
                "env": env or {}}

    ckpt = str(base / "ckpt-fast")
    fast = {"DS_PIN_MEMORY_BACKEND": "native"}
    return ([job("cpu", "--offload", "cpu")] + [job("nvme-" + knob_id(k), *knob_flags(*k)) for k in KNOBS] + [
        job("nvme-save-fast", *knob_flags(*KNOBS[1]), "--writer", "fast", "--save-at", "3", "--ckpt-dir", ckpt,
            env=fast),
        job("nvme-resume-fast", *knob_flags(*KNOBS[1]), "--writer", "fast", "--resume", ckpt, env=fast),
        # The same with DeepSpeed's default writer (torch.save): the reference
        # for what a resumed run gives, whatever the writer.
        job("nvme-save-torch", *knob_flags(*KNOBS[1]), "--save-at", "3", "--ckpt-dir", ckpt + "-torch"),
        job("nvme-resume-torch", *knob_flags(*KNOBS[1]), "--resume", ckpt + "-torch"),
    ] + ([] if stripe is None else [
        # The same job with its nvme_path, then its FastPersist checkpoint, on a stripe set.
        {"name": "nvme-stripe", "env": {},
         "argv": MODEL + ["--nvme-path", stripe.path("zero/swap")] + knob_flags(*KNOBS[1])},
        {"name": "nvme-stripe-save-fast", "env": fast,
         "argv": MODEL + ["--nvme-path", stripe.path("zero/swap-save"), "--writer", "fast", "--save-at", "3",
                          "--ckpt-dir", stripe.path("ckpt")] + knob_flags(*KNOBS[1])},
    ] + [
        # Save (the optimizer's swap files copied into the checkpoint), train
        # on (rewriting them), then resume in a new engine (copied back): with
        # the checkpoint out of the set, and in it.
        {"name": f"nvme-stripe-{step}-{where}", "env": {},
         "argv": MODEL + ["--nvme-path", stripe.path(f"zero/swap-{step}-{where}")] + knob_flags(*KNOBS[1])
         + (["--save-at", "3", "--ckpt-dir", ckpt_dir] if step == "save" else ["--resume", ckpt_dir])}
        for where, ckpt_dir in (("out", str(base / "ckpt-stripe-out")), ("in", stripe.path("ckpt-in")))
        for step in ("save", "resume")
    ]))


@pytest.fixture(scope="module")
def stripe(tmp_path_factory):
    """A stripe set over two members, each ext4 on a loop device (None,
    and its tests skip saying why, where root cannot make them)."""
    from _stripe import StripeSet, cannot_make_devices

    if cannot_make_devices():
        yield None
        return
    s = StripeSet(str(tmp_path_factory.mktemp("zero-stripe")), 2, 1 << 20)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory, stripe):
    """Runs every job once, in one fresh interpreter (importing torch and
    DeepSpeed once: on a busy 2-core machine that alone takes tens of
    seconds); returns {name: report}. A job that raised has "error"."""
    base = tmp_path_factory.mktemp("zero")
    jobs = job_list(base, stripe)
    for j in jobs:
        (base / j["name"]).mkdir(exist_ok=True)
    out = base / "reports"
    out.mkdir()
    env = dict(os.environ, DEEPNVME_LOG="quiet", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", DRIVER.format(example=EXAMPLE), json.dumps(jobs), str(out)],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, env=env, cwd=str(base))
    found = {}
    for j in jobs:
        path = out / (j["name"] + ".json")
        if path.exists():
            found[j["name"]] = json.loads(path.read_text())
    if proc.returncode != 0 or not found:
        pytest.fail(f"the jobs' interpreter failed with status {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    found["__base__"] = base
    return found


def report(reports, name):
    r = reports.get(name)
    assert r is not None, f"job {name} did not report"
    assert "error" not in r, f"job {name} raised:\n{r['error']}"
    return r


@pytest.mark.parametrize("knobs", KNOBS, ids=knob_id)
def test_nvme_losses_equal_cpu_offload_bit_for_bit(reports, knobs):
    floor = report(reports, "cpu")
    nvme = report(reports, "nvme-" + knob_id(knobs))
    assert nvme["op"] in ("deepnvme.async_io", "deepnvme.frontend")
    assert len(floor["losses"]) == STEPS
    assert nvme["losses"] == floor["losses"], (nvme["losses"], floor["losses"])
    # The job really swapped: DeepSpeed asked deepnvme for transfers both ways.
    methods = {m for m, *_ in nvme["records"]}
    assert methods & {"async_pwrite", "sync_pwrite"} and methods & {"async_pread", "sync_pread"}, methods
    # and the steps differ (it trains; it does not replay one step)
    assert len(set(nvme["losses"])) == STEPS, nvme["losses"]


@pytest.mark.parametrize("knobs", KNOBS, ids=knob_id)
def test_swap_buffers_are_pinned_so_nothing_bounces(reports, knobs):
    nvme = report(reports, "nvme-" + knob_id(knobs))
    records = nvme["records"]
    assert records, "DeepSpeed made no transfer through deepnvme"
    bounced = [r for r in records if not (r[1] and r[2])]
    assert not bounced, f"{len(bounced)} of {len(records)} transfers got buffers deepnvme does not " \
        f"recognise as locked and contiguous (they would bounce): {bounced[:5]}"
    if nvme["stats_api"]:
        assert nvme["bounced_after"] == nvme["bounced_before"], nvme


@pytest.mark.parametrize("knobs", KNOBS, ids=knob_id)
def test_no_locked_memory_left_after_engine_destroy(reports, knobs):
    """Every swap buffer the job locked is given back once the engine is
    destroyed and collected: the pinned-memory manager's (regions, requested
    bytes, locked bytes) are back where they were before the job.

    DeepSpeed 0.19.8 itself keeps a destroyed ZeRO-3 engine's model reachable
    (the top module on parameter_offload.FWD_MODULE_STACK, and an lru_cache
    on PartitionedParameterCoordinator.__params_to_release keyed by its
    modules), and through the parameters' swappers the 6 swap buffers (15
    MiB): the example drops those two references after destroy()
    (release_deepspeed_references) and reports what was still held before it
    did (locked_at_destroy). deepnvme holds nothing of its own: a buffer goes
    with its last reference (test_pinned.py::
    test_locked_memory_goes_with_its_last_tensor)."""
    nvme = report(reports, "nvme-" + knob_id(knobs))
    before, after = nvme["pinned_before"], nvme["pinned_after"]
    assert nvme["records"], "the job made no transfer"
    assert nvme["locked_at_destroy"] is not None, "the example did not measure deepnvme's locked memory"
    assert list(nvme["locked_after_release"]) == list(after), nvme
    assert after == before, (f"pinned_stats before the job {before}, after engine.destroy(), dropping DeepSpeed's "
                             f"references and gc {after} (before dropping them: {nvme['locked_at_destroy']})")


def test_fastpersist_checkpoint_resumes_as_torch_save_does(reports):
    """A ZeRO-3 NVMe job saves a checkpoint after step 3 through DeepSpeed's
    FastPersist writer (checkpoint.writer.type "fast": torch.save streams
    through an aio_handle); a new engine loads it and runs steps 4-6. Its
    losses are bit for bit those of the same save and resume through
    DeepSpeed's default writer (torch.save to a file), and its first step is
    the uninterrupted job's step 4.

    Later resumed steps differ from the uninterrupted job's with BOTH
    writers alike (seen 2026-11-30: step 5 gives 1.9005 where the
    uninterrupted run gives 1.8416): that is DeepSpeed's resume of this
    configuration (ZeRO-3, NVMe optimizer offload, a client torch Adam), not
    the writer or the I/O, so it is compared writer against writer.

    On the CPU accelerator the writer's I/O buffer can only be page-locked by
    DeepSpeed's native pinned-memory backend (DS_PIN_MEMORY_BACKEND=native,
    i.e. deepnvme's pin_handle): torch cannot pin memory without a GPU; and
    its byte cast comes from DeepSpeed's utils op, which the CPU accelerator
    does not implement, so the example substitutes the same view in torch
    (use_torch_byte_cast)."""
    whole = report(reports, "nvme-" + knob_id(KNOBS[1]))
    saved = report(reports, "nvme-save-fast")
    assert saved["losses"] == whole["losses"], "saving a checkpoint changed the training"
    assert any(m == "async_pwrite" for m, *_ in saved["records"]), "FastPersist wrote nothing through deepnvme"
    assert report(reports, "nvme-save-torch")["losses"] == whole["losses"]
    resumed = report(reports, "nvme-resume-fast")
    reference = report(reports, "nvme-resume-torch")
    assert resumed["first_step"] == reference["first_step"] == 4
    assert resumed["losses"][0] == whole["losses"][3], (resumed["losses"], whole["losses"])
    assert resumed["losses"] == reference["losses"], (resumed["losses"], reference["losses"])


def needs_stripe(stripe):
    if stripe is None:
        from _stripe import cannot_make_devices

        pytest.skip(f"ZeRO-3 on a stripe set not run: {cannot_make_devices()}")


def test_zero3_on_a_stripe_set_of_two_gives_the_unstriped_losses(reports, stripe):
    """The same ZeRO-3 NVMe job with its nvme_path on a stripe set of two
    members (loop devices): losses bit for bit those of the unstriped job,
    and its swap files really striped (placeholders, bytes in both members)."""
    needs_stripe(stripe)
    plain = report(reports, "nvme-" + knob_id(KNOBS[1]))
    striped = report(reports, "nvme-stripe")
    assert striped["losses"] == plain["losses"], (striped["losses"], plain["losses"])
    methods = {m for m, *_ in striped["records"]}
    assert methods & {"async_pwrite", "sync_pwrite"} and methods & {"async_pread", "sync_pread"}, methods
    swapped = []
    for folder, _, files in os.walk(stripe.path("zero/swap")):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), stripe.root)
            if stripe.is_striped(rel):
                swapped.append(rel)
                assert not stripe.holds_data(rel), f"{rel}: a placeholder holds no bytes"
    assert swapped, "DeepSpeed's swap files on the stripe set are not striped"
    for m in stripe.members:
        held = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(m, "zero")) for f in fs)
        assert held > 0, f"member {m} holds no swap bytes"


@pytest.mark.parametrize("where", ["out", "in"])
def test_a_checkpoint_of_striped_swap_files_resumes_after_training_on(reports, stripe, where):
    """ZeRO-3 with its nvme_path on a stripe set saves a checkpoint after
    step 3 (DeepSpeed's save_checkpoint copies the optimizer's swap files
    into the checkpoint's offloaded_tensors with shutil.copytree), trains on
    to step 6 (rewriting the swap files), and a new engine resumes from it
    (load_checkpoint copies them back over its own). The resumed losses are
    bit for bit those of the same save and resume unstriped, with the
    checkpoint out of the set ("out": its copies must hold the bytes, not
    zeros) and in it ("in": its copies must be files of their own, not
    second names for the live swap files' member files)."""
    needs_stripe(stripe)
    saved = report(reports, f"nvme-stripe-save-{where}")
    assert saved["losses"] == report(reports, "nvme-" + knob_id(KNOBS[1]))["losses"]
    resumed = report(reports, f"nvme-stripe-resume-{where}")
    reference = report(reports, "nvme-resume-torch")
    assert resumed["first_step"] == 4
    assert resumed["losses"] == reference["losses"], (resumed["losses"], reference["losses"])
    swap = stripe.path(f"zero/swap-resume-{where}")
    swapped = [os.path.relpath(os.path.join(d, f), stripe.root) for d, _, fs in os.walk(swap) for f in fs]
    assert swapped, f"the resumed engine has no swap files in {swap}"
    plain = [rel for rel in swapped if not stripe.is_striped(rel)]
    assert not plain, f"swap files of the resumed engine left unstriped on the set folder's own disk: {plain}"
    base = reports["__base__"]
    ckpt = str(base / "ckpt-stripe-out") if where == "out" else stripe.path("ckpt-in")
    copies = [os.path.join(d, f) for d, _, fs in os.walk(ckpt) if "offloaded_tensors" in d for f in fs]
    assert copies, f"the checkpoint in {ckpt} has no offloaded_tensors: DeepSpeed copied no swap files"
    for path in copies:
        if where == "in":
            rel = os.path.relpath(path, stripe.root)
            assert stripe.is_striped(rel) and not stripe.holds_data(rel), f"{rel}: not a striped placeholder"
            assert all(os.path.exists(os.path.join(m, rel)) for m in stripe.members), \
                f"{rel}: no member files of its own (a second name for a swap file's?)"
        else:
            assert not os.listxattr(path), f"{path}: a copy out of the set carries {os.listxattr(path)}"


def tensors_of(obj, prefix=""):
    """Every tensor in a loaded checkpoint, by its path in the structure."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in tensors_of(obj[k], f"{prefix}/{k}")]
    if isinstance(obj, (list, tuple)):
        return [t for i, v in enumerate(obj) for t in tensors_of(v, f"{prefix}/{i}")]
    return []


def test_fastpersist_checkpoint_on_a_stripe_set_reads_back_through_stripe_cat(reports, stripe, tmp_path):
    """A FastPersist checkpoint saved into a stripe set: `deepnvme stripe
    cat` gives each file's logical bytes exactly (as read from the member
    files, and the placeholder's own tail), and what it gives loads with
    torch.load to the tensors of the same checkpoint saved unstriped."""
    needs_stripe(stripe)
    from _stripe import cli_binary

    saved = report(reports, "nvme-stripe-save-fast")
    assert saved["losses"] == report(reports, "nvme-save-fast")["losses"]
    cli = cli_binary()
    if cli is None:
        pytest.skip("cargo is not on PATH: no deepnvme CLI to run `stripe cat` with")
    files = sorted(os.path.relpath(os.path.join(d, f), stripe.root)
                   for d, _, fs in os.walk(stripe.path("ckpt")) for f in fs)
    striped = [f for f in files if stripe.is_striped(f)]
    assert any(f.endswith(".pt") for f in striped), f"no checkpoint file was striped: {files}"
    out = tmp_path / "copied"
    for rel in files:
        got = subprocess.run([cli, "stripe", "cat", stripe.path(rel)], capture_output=True, timeout=300)
        assert got.returncode == 0, got.stderr.decode()
        want = stripe.logical(rel) if rel in striped else open(stripe.path(rel), "rb").read()
        assert got.stdout == want, f"stripe cat {rel}: {len(got.stdout)} bytes, not the file's {len(want)}"
        dest = out / os.path.relpath(rel, "ckpt")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(got.stdout)
    reference = os.path.join(str(reports["__base__"]), "ckpt-fast")
    for rel in striped:
        if not rel.endswith(".pt"):
            continue
        mine = torch.load(str(out / os.path.relpath(rel, "ckpt")), weights_only=False)
        theirs = torch.load(os.path.join(reference, os.path.relpath(rel, "ckpt")), weights_only=False)
        a, b = tensors_of(mine), tensors_of(theirs)
        assert [k for k, _ in a] == [k for k, _ in b], rel
        for (k, x), (_, y) in zip(a, b):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f"{rel}: {k}"
