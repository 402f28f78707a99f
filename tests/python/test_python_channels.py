"""deepnvme's messages through Python's own channels, on both front ends:
the write warning is a ``deepnvme.DeepNVMeWarning`` that ``warnings``
filters silence, and informational lines are records of the ``deepnvme``
logger (printed as ``deepnvme: ...`` on stderr until the application
configures logging) that a logger level silences. ``DEEPNVME_LOG=quiet``
still drops them in the core.

Each case runs in a fresh interpreter with ``DEEPNVME_FRONTEND`` forced;
the informational line used is the engine choice that
``DEEPNVME_ENGINE=psync`` makes the core state once.
"""

import json

import pytest

from _util import start_python
from conftest import compiled_modules_installed

WARNING_PHRASE = "heavy write traffic"
INFO_PHRASE = "using the psync engine"

CHILD = r"""
import json, logging, os, sys, warnings
import torch
import deepnvme
SETUP
aio = deepnvme.load_op("async_io")
h = aio.aio_handle(4096, 4, False, False, 1)
data = torch.arange(3 * 4096, dtype=torch.uint8)
rc = h.sync_pwrite(data, os.path.join(os.environ["CH_DIR"], "w.bin"))
back = torch.zeros_like(data)
rc2 = h.sync_pread(back, os.path.join(os.environ["CH_DIR"], "w.bin"))
# The logger gets the lines from the core's logging thread, a moment after
# they are made (the exit flush sends what is left): wait for the one the
# handler scenario expects.
import time
deadline = time.monotonic() + 60
while WAIT_FOR_RECORD and not records and time.monotonic() < deadline:
    time.sleep(0.01)
print("RESULT " + json.dumps({"rc": [rc, rc2], "same": bool(torch.equal(back, data)),
                              "frontend": deepnvme.choose_frontend()[0], "records": records}), flush=True)
"""

SETUPS = {
    # Nothing configured: the warning and the line print on stderr.
    "defaults": "records = []",
    # warnings.filterwarnings silences the write warning alone.
    "warning_ignored": "records = []\n"
                       "warnings.filterwarnings('ignore', category=deepnvme.DeepNVMeWarning)",
    # A logger level silences the informational line alone.
    "info_filtered": "records = []\nlogging.getLogger('deepnvme').setLevel(logging.WARNING)",
    # An application's handler gets the record, and stderr does not.
    "info_handled": """records = []
class Rec(logging.Handler):
    def emit(self, record):
        records.append([record.name, record.levelname, record.getMessage()])
logging.getLogger("deepnvme").addHandler(Rec())""",
}


def frontends():
    marks = [] if compiled_modules_installed() else [
        pytest.mark.skip(reason="this (wheel-only) install has no compiled modules")]
    return [pytest.param("pyo3"), pytest.param("compiled", marks=marks)]


def run(frontend, setup, tmp_path, **env):
    wait = setup == "info_handled" and env.get("DEEPNVME_LOG") != "quiet"
    code = CHILD.replace("SETUP", SETUPS[setup]).replace("WAIT_FOR_RECORD", str(wait))
    proc = start_python(code,
                        env={"DEEPNVME_FRONTEND": frontend, "DEEPNVME_ENGINE": "psync", "CH_DIR": str(tmp_path),
                             **env})
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stdout + stderr
    line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["frontend"] == frontend
    assert result["rc"] == [1, 1] and result["same"], result
    return result, stderr


@pytest.mark.parametrize("frontend", frontends())
def test_by_default_both_print_on_stderr(frontend, tmp_path):
    _, stderr = run(frontend, "defaults", tmp_path)
    assert stderr.count(WARNING_PHRASE) == 1 and "DeepNVMeWarning" in stderr, stderr
    assert [ln for ln in stderr.splitlines() if INFO_PHRASE in ln] == [
        "deepnvme: using the psync engine (DEEPNVME_ENGINE=psync)"], stderr


@pytest.mark.parametrize("frontend", frontends())
def test_a_warnings_filter_silences_the_write_warning(frontend, tmp_path):
    _, stderr = run(frontend, "warning_ignored", tmp_path)
    assert WARNING_PHRASE not in stderr, stderr
    assert INFO_PHRASE in stderr, stderr


@pytest.mark.parametrize("frontend", frontends())
def test_a_logger_level_silences_informational_lines(frontend, tmp_path):
    _, stderr = run(frontend, "info_filtered", tmp_path)
    assert INFO_PHRASE not in stderr, stderr
    assert WARNING_PHRASE in stderr, stderr


@pytest.mark.parametrize("frontend", frontends())
def test_an_application_handler_gets_the_records(frontend, tmp_path):
    result, stderr = run(frontend, "info_handled", tmp_path)
    assert ["deepnvme", "INFO", "using the psync engine (DEEPNVME_ENGINE=psync)"] in result["records"], result
    assert INFO_PHRASE not in stderr, stderr


@pytest.mark.parametrize("frontend", frontends())
def test_deepnvme_log_quiet_still_drops_them(frontend, tmp_path):
    result, stderr = run(frontend, "info_handled", tmp_path, DEEPNVME_LOG="quiet")
    assert not [r for r in result["records"] if INFO_PHRASE in r[2]], result
    assert INFO_PHRASE not in stderr, stderr
