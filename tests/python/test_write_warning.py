"""DeepSpeed's one-time consumer-SSD write warning, each scenario in a fresh
interpreter (the warning is once per process).

It is a Python warning of category ``deepnvme.DeepNVMeWarning`` (so that
``warnings`` filters can silence it), attributed to the calling line, and
it sets DeepSpeed's cross-extension marker on ``deepspeed.utils``. The
child records every warning (``simplefilter("always")``, so a second
emission would show) and still prints them as Python does.
"""

import json

import pytest

from _util import start_python

PHRASE = "heavy write traffic"

PRELUDE = r"""
import json, os, random, sys, warnings
import torch
import deepspeed.utils
import deepnvme
from deepspeed.ops.op_builder import AsyncIOBuilder
records = []
warnings.simplefilter("always", deepnvme.DeepNVMeWarning)
show = warnings.showwarning
def record(message, category, filename, lineno, file=None, line=None):
    records.append((category.__name__, str(message), filename))
    show(message, category, filename, lineno, file, line)
warnings.showwarning = record
aio = AsyncIOBuilder().load()
h = aio.aio_handle(4096, 4, False, False, 1)
D = sys.argv[1] if len(sys.argv) > 1 else os.environ["WW_DIR"]
def data(seed, n=3 * 4096 + 100):
    return random.Random(seed).randbytes(n)
def t(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()
def marker():
    return getattr(deepspeed.utils, "_deepspeed_nvme_write_warning_emitted", None)
def warn_count():
    return sum(1 for cat, msg, _ in records if "%s" in msg)
results = {}
""" % PHRASE

POSTLUDE = r"""
results["records"] = records
print("RESULT " + json.dumps(results), flush=True)
"""

SCENARIOS = {
    # The first write logs once and sets the marker; later writes of every kind do not.
    "first_write_logs_once": r"""
results["marker_before"] = marker()
# reads never warn
open(os.path.join(D, "r.bin"), "wb").write(data(9))
buf = torch.zeros(len(data(9)), dtype=torch.uint8)
results["read_rc"] = h.sync_pread(buf, os.path.join(D, "r.bin"))
results["after_read"] = warn_count()
results["rc1"] = h.sync_pwrite(t(data(1)), os.path.join(D, "1.bin"))
results["after_first"] = warn_count()
results["marker_after"] = marker()
rcs = [h.sync_pwrite(t(data(2)), os.path.join(D, "2.bin")),
       h.pwrite(t(data(3)), os.path.join(D, "3.bin"), False, False),
       h.write(t(data(4)), os.path.join(D, "4.bin"), False),
       h.async_pwrite(t(data(5)), os.path.join(D, "5.bin")), h.wait(),
       aio.aio_write(t(data(6)), os.path.join(D, "6.bin"), 4096, 4, False, False, False),
       aio.aio_handle().sync_pwrite(t(data(7)), os.path.join(D, "7.bin"))]
results["rcs"] = rcs
results["after_all"] = warn_count()
results["files_ok"] = all(open(os.path.join(D, f"{i}.bin"), "rb").read() == data(i) for i in range(1, 8))
results["read_ok"] = bytes(buf.numpy()) == data(9)
""",
    # The marker set by another extension before our first write: nothing is logged.
    "marker_preset": r"""
deepspeed.utils._deepspeed_nvme_write_warning_emitted = True
results["rc1"] = h.sync_pwrite(t(data(1)), os.path.join(D, "1.bin"))
results["rc2"] = h.async_pwrite(t(data(2)), os.path.join(D, "2.bin"))
results["wait"] = h.wait()
results["after_all"] = warn_count()
results["marker_after"] = marker()
results["files_ok"] = all(open(os.path.join(D, f"{i}.bin"), "rb").read() == data(i) for i in (1, 2))
""",
    # The first write is the fd overload (warned from inside the op, GIL held by the binding).
    "first_write_async_fd": r"""
fd = os.open(os.path.join(D, "1.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
results["rc1"] = h.async_pwrite(t(data(1)), fd)
results["wait"] = h.wait()
os.fstat(fd); os.close(fd)
results["after_first"] = warn_count()
results["rc2"] = h.async_pwrite(t(data(2)), os.path.join(D, "2.bin"))
results["wait2"] = h.wait()
results["after_all"] = warn_count()
results["marker_after"] = marker()
results["files_ok"] = all(open(os.path.join(D, f"{i}.bin"), "rb").read() == data(i) for i in (1, 2))
""",
    # A filter that turns the warning into an error must not break or change the I/O.
    "warning_is_error": r"""
warnings.simplefilter("error", deepnvme.DeepNVMeWarning)
results["rc1"] = h.sync_pwrite(t(data(1)), os.path.join(D, "1.bin"))
results["rc2"] = h.pwrite(t(data(2)), os.path.join(D, "2.bin"), False, False)
results["files_ok"] = all(open(os.path.join(D, f"{i}.bin"), "rb").read() == data(i) for i in (1, 2))
results["after_all"] = warn_count()
""",
}


@pytest.fixture(scope="module")
def scenario_results(tmp_path_factory):
    """Runs every scenario at once (in parallel child processes) and parses the results."""
    procs = {}
    for name, body in SCENARIOS.items():
        d = tmp_path_factory.mktemp(name)
        procs[name] = start_python(PRELUDE + body + POSTLUDE, env={"WW_DIR": str(d)})
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=180)
        except Exception:
            proc.kill()
            raise
        result = None
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        printed = "\n".join(line for line in stdout.splitlines() if not line.startswith("RESULT "))
        out[name] = (proc.returncode, printed, stderr, result)
    return out


def _get(scenario_results, name):
    rc, stdout, stderr, result = scenario_results[name]
    assert rc == 0 and result is not None, f"child failed (rc {rc}):\n{stdout}\n{stderr}"
    return stdout, stderr, result


def test_first_write_warns_once_as_a_deepnvme_warning(scenario_results):
    stdout, stderr, r = _get(scenario_results, "first_write_logs_once")
    assert r["marker_before"] is None
    assert r["read_rc"] == 1 and r["read_ok"]
    assert r["after_read"] == 0, "a read logged the write warning"
    assert r["rc1"] == 1
    assert r["after_first"] == 1
    assert r["marker_after"] is True
    assert r["after_all"] == 1, "the warning was logged more than once"
    assert r["rcs"] == [1, 1, 0, 0, 1, 0, 1]
    assert r["files_ok"]
    # A DeepNVMeWarning, attributed to the calling line (the child's -c code)
    assert [(cat, filename) for cat, msg, filename in r["records"] if PHRASE in msg] == [
        ("DeepNVMeWarning", "<string>")]
    # Python prints it on stderr, exactly once in all the output
    assert (stdout + stderr).count(PHRASE) == 1, stdout + stderr
    assert "DeepNVMeWarning: " in stderr and PHRASE in stderr, stderr


def test_preset_marker_suppresses_the_warning(scenario_results):
    stdout, stderr, r = _get(scenario_results, "marker_preset")
    assert (r["rc1"], r["rc2"], r["wait"]) == (1, 0, 1)
    assert r["after_all"] == 0
    assert r["marker_after"] is True
    assert r["files_ok"]
    assert PHRASE not in stdout + stderr


def test_async_fd_write_first_logs_once(scenario_results):
    stdout, stderr, r = _get(scenario_results, "first_write_async_fd")
    assert (r["rc1"], r["wait"], r["rc2"], r["wait2"]) == (0, 1, 0, 1)
    assert r["after_first"] == 1
    assert r["after_all"] == 1
    assert r["marker_after"] is True
    assert r["files_ok"]
    assert (stdout + stderr).count(PHRASE) == 1


def test_warning_as_error_does_not_change_io(scenario_results):
    stdout, stderr, r = _get(scenario_results, "warning_is_error")
    assert (r["rc1"], r["rc2"]) == (1, 1)
    assert r["files_ok"]
    # the error was dropped: nothing printed, nothing raised
    assert r["after_all"] == 0 and PHRASE not in stdout + stderr
