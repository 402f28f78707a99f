"""Stripe sets through DeepSpeed's aio_handle (both front ends): files under
one folder whose bytes are on several member folders, each on its own
block device (ext4 on a fresh loop device per member; the tests skip,
saying why, where root cannot make them).

* a model: random async and blocking reads and writes on overlapping
  slices of locked and plain tensors and of striped files, compared byte
  for byte after every wait with a model applied in submission order (the
  files are read from the member files with this file's own arithmetic);
* DeepSpeed's swap-folder handling (rmtree, makedirs, same names again,
  os.path.getsize);
* FastPersist's FastFileWriter on a stripe set: the checkpoint's logical
  bytes equal a plain torch.save's;
* DeepSpeed's checkpoint copies of its swap files (shutil.copytree, as
  the engine calls it, once DeepSpeed is imported): copies out of and into
  the set hold the bytes and keep them when the swap files are rewritten,
  and copying them back restores the swap files;
* a member failing while a write is in flight (its file made immutable):
  RuntimeError naming the member file and the errno, earlier bytes intact.

The sets come from _stripe.py.
"""

import errno
import fcntl
import io
import os
import random
import shutil
import struct
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import pattern, tbytes  # noqa: E402
from _stripe import StripeSet, cannot_make_devices  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def stripe_set(tmp_path_factory):
    why = cannot_make_devices()
    if why:
        pytest.skip(f"stripe sets on real devices not tested: {why}")
    s = StripeSet(str(tmp_path_factory.mktemp("stripe")), 3, 64 * KIB)
    try:
        yield s
    finally:
        s.close()


def test_a_model_of_random_ops_on_locked_and_plain_tensors(stripe_set, new_handle, locked):
    seed = int(os.environ.get("DEEPNVME_MODEL_SEED") or random.randrange(1 << 32))
    print(f"stripe model seed {seed} (DEEPNVME_MODEL_SEED={seed} replays it)", file=sys.stderr)
    rng = random.Random(seed)
    h = new_handle(block_size=64 * KIB, queue_depth=8, single_submit=False, overlap_events=True, intra_op_parallelism=2)
    base, file_len = 3 * MIB, 2 * MIB + 12 * KIB
    names = [f"model-{seed}-{i}.bin" for i in range(3)]
    files = []
    for i, name in enumerate(names):
        data = pattern(file_len, seed + i)
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        assert h.sync_pwrite(t, stripe_set.path(name)) == 1
        files.append(bytearray(data))
    tensors = [locked(base), torch.zeros(base, dtype=torch.uint8)]
    models = []
    for i, t in enumerate(tensors):
        init = pattern(base, seed + 100 + i)
        t.copy_(torch.frombuffer(bytearray(init), dtype=torch.uint8))
        models.append(bytearray(init))

    def check(step):
        for i, t in enumerate(tensors):
            assert tbytes(t) == bytes(models[i]), f"seed {seed}: tensor {i} after {step}"
        for i, name in enumerate(names):
            got = stripe_set.logical(name)
            if got != bytes(files[i]):
                bad = [k for k in range(len(got)) if got[k] != files[i][k]]
                raise AssertionError(f"seed {seed}: {name} after {step}: {len(bad)} bytes differ, "
                                     f"first at {bad[0]}, last at {bad[-1]}; ops: {history}")

    in_flight = []
    history = []
    for step in range(80):
        if rng.random() < 0.15:
            assert h.wait() == len(in_flight)
            in_flight.clear()
            check(f"op {step} (wait)")
            continue
        m, f = rng.randrange(2), rng.randrange(3)
        n = rng.choice([rng.randrange(1, 40) * 4096, rng.randrange(1, 150_000) * 2])
        n = min(n, file_len)
        start, off = rng.randrange(base - n + 1), rng.randrange(file_len - n + 1)
        shape = rng.randrange(3)
        if shape == 0:  # page-aligned
            start, off = start & ~4095, off & ~4095
        elif shape == 1:  # memory and file co-aligned to 512 B only: direct I/O from inside a page
            start = (start & ~511) | (off & 511)
        view = tensors[m][start:start + n]
        write, is_async = rng.random() < 0.5, rng.random() < 0.6
        call = (h.async_pwrite if write else h.async_pread) if is_async else (h.sync_pwrite if write else h.sync_pread)
        rc = call(view, stripe_set.path(names[f]), off)
        history.append((step, "w" if write else "r", "async" if is_async else "sync", f"t{m}[{start}:{start + n}]",
                        f"f{f}@{off}"))
        if write:
            files[f][off:off + n] = models[m][start:start + n]
        else:
            models[m][start:start + n] = files[f][off:off + n]
        if is_async:
            assert rc == 0
            in_flight.append(view)
        else:
            assert rc == len(in_flight) + 1
            in_flight.clear()
            check(f"op {step} (blocking)")
    assert h.wait() == len(in_flight)
    check("the last wait")


def test_deepspeeds_swap_folder_handling(stripe_set, new_handle, locked):
    h = new_handle(block_size=MIB, queue_depth=32, single_submit=False, overlap_events=True, intra_op_parallelism=1)
    folder = stripe_set.path("zero_stage_3/float16params/rank0")
    for round_ in range(2):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder, exist_ok=True)
        n = 3 * MIB if round_ == 0 else 256 * KIB
        for p in range(3):
            rel = f"zero_stage_3/float16params/rank0/{p}_param.tensor.swp"
            t = locked(n)
            t.copy_(torch.frombuffer(bytearray(pattern(n, 10 * round_ + p)), dtype=torch.uint8))
            assert h.async_pwrite(t, stripe_set.path(rel)) == 0
            assert h.wait() == 1
            assert os.path.getsize(stripe_set.path(rel)) == n
            back = locked(n)
            assert h.sync_pread(back, stripe_set.path(rel)) == 1
            assert tbytes(back) == tbytes(t)
            assert stripe_set.logical(rel) == tbytes(t)


def test_fast_file_writer_checkpoint_on_a_stripe_set(stripe_set, new_handle, locked, tmp_path):
    import deepspeed.io.fast_file_writer as ffw
    from deepspeed.io import FastFileWriterConfig

    def cast(x):
        if isinstance(x, (list, tuple)):
            return [cast(t) for t in x]
        return x if x.nbytes <= 1 else x.reshape(-1).view(torch.uint8)

    class CpuUtils:

        def load(self, verbose=False):
            return types.SimpleNamespace(cast_to_byte_tensor=cast)

    saved = ffw.UtilsBuilder
    ffw.UtilsBuilder = CpuUtils
    try:
        h = new_handle(block_size=8192, queue_depth=8, single_submit=False, overlap_events=True,
                       intra_op_parallelism=1)
        g = torch.Generator().manual_seed(5)
        sd = {"w": torch.randn(300, 301, generator=g), "b": torch.randn(7, generator=g), "step": 3}
        os.makedirs(stripe_set.path("ckpt"), exist_ok=True)
        path = stripe_set.path("ckpt/model.pt")
        writer = ffw.FastFileWriter(file_path=path, config=FastFileWriterConfig(
            dnvme_handle=h, pinned_tensor=locked(64 * KIB, via=h), double_buffer=True))
        torch.save(sd, writer)
        writer.close()
        del writer
    finally:
        ffw.UtilsBuilder = saved
    # torch.save names the archive after the file, or "archive" for a file object.
    plain = io.BytesIO()
    torch.save(sd, plain)
    want = plain.getvalue()
    assert os.path.getsize(path) == len(want)
    assert stripe_set.logical("ckpt/model.pt") == want
    # The unaligned tail FastFileWriter appended itself is the placeholder's own.
    assert stripe_set.extent("ckpt/model.pt") < len(want)
    back = torch.empty(len(want), dtype=torch.uint8)
    assert h.sync_pread(back, path) == 1
    assert tbytes(back) == want


def test_deepspeeds_checkpoint_copies_of_swap_files(stripe_set, new_handle, locked, tmp_path):
    """save_checkpoint and load_checkpoint copy the optimizer's swap folder
    with shutil.copytree (deepspeed/runtime/engine.py); importing DeepSpeed
    makes that deepnvme's copytree. Copies out of the set are plain files of
    the logical bytes; copies in it are striped files of their own; both
    keep their bytes when training rewrites the swap files; copied back
    over the swap files (dirs_exist_ok, as a load does), they restore them."""
    import deepnvme
    import deepspeed  # noqa: F401  (imports deepspeed.runtime.engine: the hook patches copytree)

    if os.environ.get("DEEPNVME_DEEPSPEED_HOOK") == "0":
        pytest.skip("DEEPNVME_DEEPSPEED_HOOK=0: DeepSpeed's copies are shutil's")
    assert shutil.copytree is deepnvme.copytree
    h = new_handle(block_size=MIB, queue_depth=32, single_submit=False, overlap_events=True, intra_op_parallelism=2)
    swap = "opt/rank0"
    shutil.rmtree(stripe_set.path(swap), ignore_errors=True)
    os.makedirs(stripe_set.path(swap))
    sizes = {"0_exp_avg.tensor.swp": 2 * MIB + 4096, "1_fp32.tensor.swp": 3 * MIB, "2_gradient.tensor.swp": MIB}

    def write_all(seed):
        for i, (name, n) in enumerate(sizes.items()):
            t = locked(n)
            t.copy_(torch.frombuffer(bytearray(pattern(n, seed + i)), dtype=torch.uint8))
            assert h.sync_pwrite(t, stripe_set.path(f"{swap}/{name}")) == 1
        return {name: pattern(n, seed + i) for i, (name, n) in enumerate(sizes.items())}

    first = write_all(100)
    skip_gradients = lambda _, names: [n for n in names if "gradient" in n]  # noqa: E731 (engine.py's ignore)
    out = str(tmp_path / "ckpt/offloaded_tensors/rank0")
    inside = stripe_set.path("ckpt/offloaded_tensors/rank0")
    for dst in (out, inside):
        shutil.copytree(stripe_set.path(swap), dst, ignore=skip_gradients, dirs_exist_ok=False)
    write_all(200)  # training goes on
    for name, want in first.items():
        if "gradient" in name:
            continue
        got = open(os.path.join(out, name), "rb").read()
        assert got == want, f"{name}: the copy out of the set does not hold the saved bytes"
        assert not os.listxattr(os.path.join(out, name)), "a copy out of the set carries the stripe mark"
        rel = f"ckpt/offloaded_tensors/rank0/{name}"
        assert stripe_set.is_striped(rel) and stripe_set.logical(rel) == want, f"{rel}: not the saved bytes"
    for src in (out, inside):
        write_all(300)
        shutil.copytree(src, stripe_set.path(swap), dirs_exist_ok=True)
        for name, want in first.items():
            if "gradient" in name:
                continue
            path = stripe_set.path(f"{swap}/{name}")
            assert os.path.getsize(path) == len(want)
            back = locked(len(want))
            assert h.sync_pread(back, path) == 1
            assert tbytes(back) == want, f"{name} loaded from {src}"
            assert stripe_set.logical(f"{swap}/{name}") == want
    # deepnvme.copy2 on its own: a plain file copied into the set stays a
    # plain file (torch.load, cat and cp read it), except while DeepSpeed
    # loads swap files (then it is striped: swap files stay on the drives);
    # bytes paths; a file onto itself.
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x" * 100)
    assert deepnvme.copy2(str(plain), stripe_set.path("opt")) == stripe_set.path("opt/plain.bin")
    assert not stripe_set.is_striped("opt/plain.bin") and open(stripe_set.path("opt/plain.bin"), "rb").read() == b"x" * 100
    with deepnvme._copy._loading():
        assert deepnvme.copy2(str(plain), stripe_set.path("opt")) == stripe_set.path("opt/plain.bin")
    assert stripe_set.is_striped("opt/plain.bin") and stripe_set.logical("opt/plain.bin") == b"x" * 100
    assert deepnvme.copy2(os.fsencode(stripe_set.path("opt/plain.bin")), os.fsencode(tmp_path / "b.bin"))
    assert (tmp_path / "b.bin").read_bytes() == b"x" * 100 and not os.listxattr(tmp_path / "b.bin")
    with pytest.raises(shutil.SameFileError):
        deepnvme.copy2(stripe_set.path("opt/plain.bin"), stripe_set.path("opt/plain.bin"))
    # A striped file without its member files: copytree gathers the OSError
    # naming it into shutil.Error, as for any file it cannot copy.
    os.remove(os.path.join(stripe_set.members[0], "opt/plain.bin"))
    with pytest.raises(shutil.Error, match="plain.bin"):
        shutil.copytree(stripe_set.path("opt"), str(tmp_path / "broken"), ignore=skip_gradients)


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def set_immutable(path, on):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = struct.unpack("q", buf)[0]
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("q", flags))
    finally:
        os.close(fd)


def test_a_member_failing_mid_write_names_it(stripe_set, new_handle, locked):
    h = new_handle(block_size=MIB, queue_depth=32, single_submit=False, overlap_events=True, intra_op_parallelism=2)
    first = locked(4 * MIB)
    first.copy_(torch.frombuffer(bytearray(pattern(4 * MIB, 41)), dtype=torch.uint8))
    assert h.sync_pwrite(first, stripe_set.path("fail.bin")) == 1
    big = locked(96 * MIB)
    big.fill_(7)
    member_file = os.path.join(stripe_set.members[1], "fail.bin")
    failure = None
    for attempt in range(20):
        assert h.async_pwrite(big, stripe_set.path("fail.bin"), 4 * MIB) == 0
        set_immutable(member_file, True)
        try:
            h.wait()
        except RuntimeError as e:
            failure = str(e)
        finally:
            set_immutable(member_file, False)
        if failure:
            break
    if failure is None:
        pytest.skip("every write finished before the member failed")
    assert member_file in failure and "stripe member 1" in failure, failure
    assert f"errno {errno.EPERM}" in failure, failure
    assert stripe_set.logical("fail.bin")[:4 * MIB] == tbytes(first)
