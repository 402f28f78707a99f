"""Helpers shared by the deepnvme Python tests (no fixtures here; see conftest.py).

Everything works on real files and real memory: nothing is mocked.
"""

import os
import random
import re
import subprocess
import sys
import textwrap
import threading

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")
DTYPES = (torch.uint8, torch.float16, torch.float32, torch.int64)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def pattern(nbytes, seed):
    """`nbytes` deterministic pseudo-random bytes (never all equal)."""
    return random.Random(seed).randbytes(nbytes)


def tensor_from_bytes(data, dtype=torch.uint8):
    """A fresh (unpinned, contiguous, 1-D) CPU tensor holding `data`."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
    return t.view(dtype)


def tbytes(t):
    """The bytes of tensor `t` in logical (row-major) order, whatever its strides.

    Compares exactly, also for float tensors whose random bytes are NaNs.
    """
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def fill(t, data):
    """Copies `data` into tensor `t` in logical order (works for any strides)."""
    src = tensor_from_bytes(data, t.dtype).reshape(t.shape)
    t.copy_(src)
    assert tbytes(t) == data


def open_fd_count():
    return len(os.listdir("/proc/self/fd"))


def open_fds():
    """{fd: target} of this process, for diagnosing leaks."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def status_kb(field):
    """A `kB` field of /proc/self/status, e.g. VmLck."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def vmlck_kb():
    return status_kb("VmLck")


def o_direct_supported(directory):
    """(True, None) when `directory` accepts an aligned O_DIRECT write, else (False, why)."""
    import mmap

    path = os.path.join(directory, ".odirect-probe")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as e:
        return False, f"open(O_DIRECT) failed: {e}"
    try:
        buf = mmap.mmap(-1, PAGE)  # page-aligned memory
        buf.write(b"\xa5" * PAGE)
        try:
            n = os.write(fd, buf)
        except OSError as e:
            return False, f"aligned O_DIRECT write failed: {e}"
        if n != PAGE:
            return False, f"short O_DIRECT write ({n} of {PAGE})"
        return True, None
    finally:
        os.close(fd)
        os.unlink(path)


def run_python(code, timeout=120, env=None, cwd=None):
    """Runs `code` in a fresh interpreter of this venv; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.pop("DEEPNVME_ENGINE", None)
    full_env.pop("DEEPNVME_OPS", None)  # a child's mix is its caller's choice (default: all)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )


def start_python(code, env=None, cwd=None):
    """Starts `code` in a fresh interpreter; returns the Popen (stdout/stderr piped)."""
    full_env = dict(os.environ)
    full_env.pop("DEEPNVME_ENGINE", None)
    full_env.pop("DEEPNVME_OPS", None)  # a child's mix is its caller's choice (default: all)
    if env:
        full_env.update(env)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
        cwd=cwd,
    )


def peer_progress_during(call, max_calls):
    """How many calls of `call()` ran before a GIL-starved peer thread ran (None: never).

    With sys.setswitchinterval(60) the interpreter never forces a switch, so
    the peer can only run while the calling thread has released the GIL.
    """
    peer_ready = threading.Event()
    peer_ran = threading.Event()
    gate = threading.Lock()
    gate.acquire()

    def run_peer():
        peer_ready.set()
        with gate:
            peer_ran.set()

    peer = threading.Thread(target=run_peer, daemon=True)
    peer.start()
    assert peer_ready.wait(timeout=5)
    original = sys.getswitchinterval()
    ran_after = None
    try:
        sys.setswitchinterval(60)
        gate.release()
        for i in range(max_calls):
            call()
            if peer_ran.is_set():
                ran_after = i + 1
                break
    finally:
        sys.setswitchinterval(original)
        if gate.locked():
            gate.release()
        peer.join(timeout=5)
    assert not peer.is_alive()
    return ran_after
