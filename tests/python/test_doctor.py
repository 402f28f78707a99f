"""`deepnvme doctor`'s frontend section against this venv: which front end
DeepSpeed loads and why, with torch, DeepSpeed and pybind11 versions; and
against a compiled install whose build record names another torch -- what
a torch upgrade under compiled modules leaves -- where it must name the
mismatch and the command that rebuilds them, and fail when
DEEPNVME_FRONTEND=compiled forces them anyway.

The mismatched install is a copy of the installed package (the shared
objects hard-linked, the build record rewritten) put first on PYTHONPATH;
the installed package is never touched. The doctor binary is built by
cargo (a no-op after tests/run-all.sh's cargo test). The other broken
setups are the CLI's own tests: crates/deepnvme-cli/tests/doctor.rs."""

import functools
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import deepnvme

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.dirname(os.path.abspath(deepnvme.__file__))

# About the compiled modules: skipped under the pyo3 pass and in a wheel-only install.
pytestmark = pytest.mark.compiled_only


@functools.lru_cache(maxsize=None)
def doctor_binary():
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not on PATH, so the deepnvme binary cannot be built here")
    proc = subprocess.run(
        ["cargo", "build", "-q", "-p", "deepnvme-cli", "--bin", "deepnvme", "--message-format=json"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "deepnvme":
            return msg["executable"]
    raise AssertionError(f"cargo reported no deepnvme executable: {proc.stdout[-2000:]}")


def doctor(tmp_path, env=None):
    """(report, exit status) of `doctor --only frontend` for this Python."""
    full = {k: v for k, v in os.environ.items() if k not in ("DEEPNVME_FRONTEND", "DEEPNVME_OPS", "PYTHONPATH")}
    full.update(env or {})
    proc = subprocess.run(
        [doctor_binary(), "doctor", "--only", "frontend", "--python", sys.executable, "--json", "--dir", str(tmp_path)],
        capture_output=True, text=True, env=full, timeout=600)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON: {proc.stdout}\n{proc.stderr}")
    return report, proc.returncode


def finding(report, check):
    for f in report["checks"]:
        if f["section"] == "frontend" and f["check"] == check:
            return f
    raise AssertionError(f"no frontend/{check} in {json.dumps(report, indent=1)}")


def test_this_venv_gets_the_compiled_modules(tmp_path):
    report, code = doctor(tmp_path)
    assert code == 0, report
    python = finding(report, "python")
    assert python["status"] == "ok"
    pybind = deepnvme.torch_abi()["pybind11"]
    import deepspeed
    for version in (torch.__version__.split("+")[0], deepspeed.__version__, pybind):
        assert version in python["summary"], (version, python)
    installed = finding(report, "deepnvme")
    assert PKG in installed["summary"] and deepnvme.build_info()["torch"] in installed["summary"], installed
    assert finding(report, "hook")["status"] == "ok"
    front = finding(report, "front end")
    assert front["status"] == "ok", front
    assert "compiled" in front["summary"] and "returns deepnvme.async_io" in front["summary"], front
    assert "match the running torch" in front["why"], front


def mismatched_copy(tmp_path, torch_version):
    """A copy of the installed package whose build record says `torch_version`."""
    dst = tmp_path / "site" / "deepnvme"

    def link(src, dest):
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)

    shutil.copytree(PKG, dst, copy_function=link, ignore=shutil.ignore_patterns("__pycache__"))
    record = dst / "_build_info.json"
    built = json.loads(record.read_text())
    record.unlink()  # a hard link to the installed record: never write through it
    record.write_text(json.dumps(dict(built, torch=torch_version)))
    assert deepnvme.build_info()["torch"] == built["torch"], "the installed record changed"
    return dst


def test_a_mismatched_compiled_front_end_is_named_with_the_rebuild(tmp_path):
    other = "2.9.1+cpu"
    copy = mismatched_copy(tmp_path, other)
    env = {"PYTHONPATH": str(copy.parent)}
    report, code = doctor(tmp_path, env)
    assert code == 0, "a mismatch with the pyo3 fallback is a warning, not a failure"
    assert str(copy) in finding(report, "deepnvme")["summary"], "the doctor checked the copy"
    front = finding(report, "front end")
    assert front["status"] == "warn", front
    assert "returns deepnvme.frontend" in front["summary"], front
    assert f"built for torch {other} and this is {torch.__version__}" in front["why"], front
    assert "pip install --no-build-isolation --no-deps --force-reinstall" in front["fix"], front
    assert "bindings" in front["fix"] and sys.executable in front["fix"], front

    # Forcing the compiled modules over the mismatch is a failure.
    report, code = doctor(tmp_path, dict(env, DEEPNVME_FRONTEND="compiled"))
    assert code == 1, report
    front = finding(report, "front end")
    assert front["status"] == "fail", front
    assert "DEEPNVME_FRONTEND=compiled" in front["summary"] and f"torch {other}" in front["why"], front
    assert "unset DEEPNVME_FRONTEND" in front["fix"], front
