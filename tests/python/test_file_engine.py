"""The engine per file through DeepSpeed's loader: ops on a tmpfs file run on
the psync engine even though the handle's engine is io_uring, say so once on
stderr, and show in deepnvme.stats(); DEEPNVME_ENGINE=uring keeps io_uring.
Real files on /dev/shm (a tmpfs on Linux) and in the test's directory."""

import os
import subprocess
import sys

import pytest

import deepnvme

SHM = "/dev/shm"


def shm_is_tmpfs():
    try:
        out = subprocess.run(["stat", "-f", "-c", "%T", SHM], capture_output=True, text=True, timeout=10)
    except OSError:
        return False
    return out.stdout.strip() == "tmpfs"


CODE = r"""
import sys, torch, deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder
path = sys.argv[1]
h = AsyncIOBuilder().load().aio_handle(block_size=1 << 18, queue_depth=8, single_submit=False,
                                       overlap_events=True, intra_op_parallelism=2)
data = torch.arange(4 << 20, dtype=torch.uint8)
back = torch.empty_like(data)
before = deepnvme.stats()
for _ in range(3):
    assert h.sync_pwrite(data, path) == 1
    assert h.sync_pread(back, path) == 1
    assert torch.equal(back, data)
after = deepnvme.stats()
print("RUNS", after["io_uring_runs"] - before["io_uring_runs"], after["psync_runs"] - before["psync_runs"])
"""


def run(path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("DEEPNVME_ENGINE", "DEEPNVME_LOG")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", CODE, path], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RUNS "))
    uring, psync = map(int, line.split()[1:])
    return uring, psync, out.stderr


@pytest.mark.skipif(not shm_is_tmpfs(), reason="/dev/shm is not a tmpfs here")
def test_tmpfs_files_run_on_psync_and_say_so_once(tmp_path):
    if deepnvme.native().engine_name() != "io_uring":
        pytest.skip("io_uring is unavailable here: every file already runs on psync")
    path = os.path.join(SHM, f"deepnvme-file-engine-{os.getpid()}.bin")
    try:
        uring, psync, err = run(path)
        assert uring == 0 and psync > 0, (uring, psync)
        said = [ln for ln in err.splitlines() if "files on tmpfs" in ln]
        assert len(said) == 1 and "psync engine" in said[0] and "DEEPNVME_ENGINE=uring" in said[0], err

        # Asked for by name, io_uring is used there too, and nothing is said.
        uring, psync, err = run(path, DEEPNVME_ENGINE="uring")
        assert uring > 0 and psync == 0, (uring, psync)
        assert "files on tmpfs" not in err, err
    finally:
        if os.path.exists(path):
            os.unlink(path)

    # A file on the test's own disk keeps io_uring.
    uring, psync, err = run(str(tmp_path / "disk.bin"))
    assert uring > 0 and psync == 0, (uring, psync)
    assert "files on tmpfs" not in err, err
