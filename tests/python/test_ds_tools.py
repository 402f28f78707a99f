"""DeepSpeed's own DeepNVMe tools on deepnvme: ``ds_io`` (the console script
deepspeed installs) and ``ds_nvme_tune`` (its sweep, which runs ds_io per
configuration and suggests an "aio" config).

They run as installed, in their own processes, and reach the op through
DeepSpeed's AsyncIOBuilder, so through deepnvme's hook (this run's front
end). That it is deepnvme and not DeepSpeed's own libaio op: torch's
extensions folder is an empty one of the test's and stays empty (the stock
op is only ever JIT-built there), and ``--validate`` lines are deepnvme's
wording, naming the file. That the bytes are right: ``--validate`` re-reads
the file with plain reads and compares it with the tensor after every op,
and the files are checked here too.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import frontend

BIN = os.path.dirname(sys.executable)
SIZE = 4 << 20


def tool_env(extensions):
    env = dict(os.environ)
    env.pop("DEEPNVME_OPS", None)  # deepnvme provides every op here
    env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def run_tool(args, extensions, timeout=600):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=tool_env(extensions))
    assert proc.returncode == 0, f"{' '.join(args)}: rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert os.listdir(extensions) == [], f"something JIT-built an op: {os.listdir(extensions)}"
    return proc


@pytest.fixture
def extensions(tmp_path):
    path = tmp_path / "torch-extensions"
    path.mkdir()
    return path


@pytest.mark.parametrize("memory", ["locked", "plain"])
def test_ds_io_writes_and_reads_through_deepnvme(memory, tmp_path, extensions):
    folder = tmp_path / "io"
    folder.mkdir()
    common = [os.path.join(BIN, "ds_io"), "--folder", str(folder), "--io_size", str(SIZE), "--block_size", "256K",
              "--queue_depth", "8", "--io_parallel", "2", "--loops", "2", "--warmup_loops", "0", "--validate"]
    if memory == "plain":
        # The CPU accelerator's "pinned" tensor is an ordinary one: deepnvme bounces it.
        common.append("--use_accelerator_pin_memory")
    for op in ("write", "read"):
        proc = run_tool(common + (["--read"] if op == "read" else []), extensions)
        out = proc.stdout
        target = folder / f"_aio_{op}_{SIZE}.pt.0_0"
        assert target.stat().st_size == SIZE
        # DeepSpeed's C++ says "Pass: correctness of  deepspeed_aio_write()using read()"; deepnvme names the op.
        passes = re.findall(rf"^Pass: correctness of {op} of (\d+) bytes at offset 0 of (.+)$", out, re.M)
        assert len(passes) == 2 and {p[1] for p in passes} == {str(target)}, out[-3000:]
        assert sum(int(p[0]) for p in passes) == 2 * SIZE
        assert "Fail:" not in out and "Fail:" not in proc.stderr
        speed = re.search(rf"^E2E {op.capitalize()} Speed = ([0-9.e+-]+) GB/sec$", out, re.M)
        assert speed and float(speed.group(1)) > 0, out[-3000:]
        if op == "write" and memory == "locked":
            # A fresh locked tensor is zero-filled, so that is what ds_io wrote.
            assert target.read_bytes() == bytes(SIZE)


@pytest.mark.skipif(frontend() != "compiled",
                    reason="ds_nvme_tune runs once per suite (the compiled pass); ds_io runs in every pass")
def test_ds_nvme_tune_sweeps_and_suggests_the_best_measured_config(tmp_path, extensions):
    folder = tmp_path / "nvme"
    folder.mkdir()
    logs = tmp_path / "logs"
    # Two points (io_parallel becomes the config's num_threads): four ds_io runs.
    sweep = {"block_size": ["512K"], "queue_depth": [8], "sequential_requests": [False],
             "single_submit": [False], "io_parallel": [1, 2]}
    config = tmp_path / "sweep.json"
    config.write_text(json.dumps(sweep))
    proc = run_tool([os.path.join(BIN, "ds_nvme_tune"), "--nvme_dir", str(folder), "--sweep_config", str(config),
                     "--io_size", str(SIZE), "--log_dir", str(logs)], extensions, timeout=1200)
    out = proc.stdout
    assert "Best performance (GB/sec)" in out, out[-3000:]
    suggested = json.loads(out[out.index("{", out.index("Best performance")):])["aio"]

    # One log per configuration and direction, each a successful ds_io run.
    measured = {}
    for direction in ("read", "write"):
        folder_logs = logs / f"_aio_bench_{direction}_logs"
        files = sorted(os.listdir(folder_logs))
        assert len(files) == 2, files
        for name in files:
            text = (folder_logs / name).read_text()
            assert "Traceback" not in text and "Fail:" not in text, text[-2000:]
            m = re.search(rf"^E2E {direction.capitalize()} Speed = ([0-9.e+-]+) GB/sec$", text, re.M)
            assert m and float(m.group(1)) > 0, text[-2000:]
            bs = re.search(r"_bs(\d+)([KM])_", name)
            par = int(re.search(r"_p(\d+)\.txt$", name).group(1))
            key = (int(bs.group(1)) << (10 if bs.group(2) == "K" else 20), par)
            measured[key] = measured.get(key, 0.0) + float(m.group(1))

    # The suggestion is a swept point, the one with the best read + write.
    assert suggested["single_submit"] == "false" and suggested["overlap_events"] == "true", suggested
    assert suggested["queue_depth"] == 8 and suggested["block_size"] == 512 << 10
    best = max(measured, key=measured.get)
    assert (suggested["block_size"], suggested["num_threads"]) == best, (suggested, measured)
