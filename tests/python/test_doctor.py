"""`deepnvme doctor` against this venv, where DeepSpeed itself is there to
compare with:

* the frontend section: which front end DeepSpeed loads and why, with
  torch, DeepSpeed and pybind11 versions; a compiled install whose build
  record names another torch (what a torch upgrade under compiled modules
  leaves) must name the mismatch and the command that rebuilds them, and
  fail when DEEPNVME_FRONTEND=compiled forces them anyway; with the hook
  off, DeepSpeed's own op needs libaio-dev, ninja and a compiler;
* the config section: every field of DeepSpeed's ZeRO models and every
  aio key, with values users write, through deepspeed.initialize's own
  validation (DeepSpeedConfig, then aio_handle as the swappers call it),
  through the doctor's table (no DeepSpeed in its --python) and through
  its probe (config_probe.py): the verdicts and keys must agree; and the
  doctor run with this Python reports DeepSpeed's own messages;
* the buffers section: real ZeRO-3 jobs (examples/zero_infinity.py) whose
  swap buffers are too small or too few fail in DeepSpeed exactly where
  the doctor said they would, and the healthy one trains;
* a --no-bench run of the whole doctor stays within 10 s of CPU.

The mismatched install is a copy of the installed package (the shared
objects hard-linked, the build record rewritten) put first on PYTHONPATH;
the installed package is never touched. The doctor binary is built by
cargo (a no-op after tests/run-all.sh's cargo test). The machine-level
broken setups are the CLI's own tests: crates/deepnvme-cli/tests/doctor.rs."""

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


def run_doctor(args, env=None, cwd=None):
    """(report, exit status) of `deepnvme doctor --json ARGS`."""
    full = {k: v for k, v in os.environ.items() if k not in ("DEEPNVME_FRONTEND", "DEEPNVME_OPS", "PYTHONPATH")}
    full.update(env or {})
    proc = subprocess.run([doctor_binary(), "doctor", "--json"] + [str(a) for a in args],
                          capture_output=True, text=True, env=full, timeout=600, cwd=cwd)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON: {proc.stdout}\n{proc.stderr}")
    return report, proc.returncode


def doctor(tmp_path, env=None):
    """(report, exit status) of `doctor --only frontend` for this Python."""
    return run_doctor(["--only", "frontend", "--python", sys.executable, "--dir", tmp_path], env)


def finding(report, check, section="frontend", key=None):
    for f in report["checks"]:
        if f["section"] == section and f["check"] == check and (key is None or key in (f["key"] or "").split(", ")):
            return f
    raise AssertionError(f"no {section}/{check} ({key}) in {json.dumps(report, indent=1)}")


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


def test_with_the_hook_off_deepspeeds_own_op_needs_libaio_ninja_and_a_compiler(tmp_path):
    """The hook off, and no ninja on PATH (the venv's bin left out): DeepSpeed's
    builder tries to JIT-build its own C++ op and cannot; the fix names all
    it needs."""
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.access(os.path.join(d, "ninja"), os.X_OK))
    assert shutil.which("ninja", path=path) is None
    report, code = doctor(tmp_path, {"DEEPNVME_DEEPSPEED_HOOK": "0", "PATH": path})
    hook = finding(report, "hook")
    assert hook["status"] == "warn" and "DEEPNVME_DEEPSPEED_HOOK=0" in hook["summary"], hook
    f = finding(report, "DeepSpeed")
    assert f["status"] == "fail", f
    assert "AsyncIOBuilder().load() raises" in f["summary"] and "DeepSpeed builds its own C++ op" in f["why"], f
    for needed in ("libaio-dev", "ninja", "g++", "unset DEEPNVME_DEEPSPEED_HOOK"):
        assert needed in f["fix"], (needed, f)
    assert code == 1


# ---------------------------------------------------------------- the config, three ways

DOCTOR_SRC = os.path.join(ROOT, "crates", "deepnvme-cli", "src", "doctor")
AIO_KEYS = ("block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")
# Values users write, of every JSON type ("auto" is the HF Trainer's placeholder).
PROBES = ["auto", "x", "8", " 8", "8.0", "1e3", "yes", "nvme", "NVMe", 8, 0, -1, 8.0, 8.5, 0.5, True, None, [], {}]
AIO_PROBES = [0, -1, 1, 8, 4097, 40000, 2 ** 31, "8", 8.0, 1e6, True, False, None, "yes", "false", [], 0.5]


def input_path(node, loc):
    """The part of a pydantic loc that indexes the config (union tags such as 'str' dropped)."""
    path = []
    for item in loc:
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        else:
            break
        path.append(str(item))
    return path


@functools.lru_cache(maxsize=None)
def aio_op():
    from deepspeed.ops.op_builder import AsyncIOBuilder

    op = AsyncIOBuilder().load(verbose=False)
    assert op.__name__ == "deepnvme.async_io", op.__name__
    return op


def deepspeed_says(cfg):
    """What deepspeed.initialize makes of `cfg`: DeepSpeedConfig (removed keys,
    DeepSpeedZeroConfig, get_aio_config, get_checkpoint_config), then, when
    ZeRO-3 swaps to NVMe or FastPersist writes checkpoints, aio_handle(...)
    as they call it. (refuses, keys or None)."""
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        c = DeepSpeedConfig(dict(cfg, train_batch_size=1))
    except pydantic.ValidationError as e:
        zero = cfg.get("zero_optimization")
        return True, {".".join(["zero_optimization"] + input_path(zero, list(err["loc"]))) for err in e.errors()}
    except Exception:
        return True, None
    z = c.zero_config
    swaps = int(z.stage) == 3 and any(o is not None and o.device == "nvme" for o in (z.offload_param, z.offload_optimizer))
    writer = c.checkpoint_config["writer"]
    fast = writer is not None and writer["type"] == "FAST"
    if not (swaps or fast) or c.aio_config["use_gds"]:
        return False, set()
    defaults = dict(block_size=1 << 20, queue_depth=8, single_submit=False, overlap_events=True, intra_op_parallelism=1)

    def refused(kwargs):
        try:
            aio_op().aio_handle(**kwargs)
            return False
        except Exception:
            return True

    if not refused({k: c.aio_config[k] for k in AIO_KEYS}):
        return False, set()
    return True, {f"aio.{k}" for k in AIO_KEYS if refused(dict(defaults, **{k: c.aio_config[k]}))}


@functools.lru_cache(maxsize=None)
def probe_namespace():
    """The doctor's own probe scripts, run in this interpreter once, so
    config_probe.py's _config_check can be called per config."""
    ns = {"__name__": "deepnvme_doctor_probe"}
    saved = os.environ.pop("DEEPNVME_DOCTOR_CONFIG", None)
    try:
        for name in ("frontend_probe.py", "config_probe.py"):
            with open(os.path.join(DOCTOR_SRC, name)) as f:
                exec(compile(f.read(), name, "exec"), ns)
    finally:
        if saved is not None:
            os.environ["DEEPNVME_DOCTOR_CONFIG"] = saved
    return ns


def probe_says(path):
    errors = probe_namespace()["_config_check"](str(path))["errors"]
    keys = [".".join(e["loc"]) for e in errors]
    assert len(keys) == len(set(keys)), f"the probe names a key twice: {errors}"
    return bool(errors), set(keys)


def doctor_table_says(tmp_path, path):
    """The doctor with no DeepSpeed to ask (--python /bin/false): its table."""
    report, code = run_doctor(["--only", "config", "--python", "/bin/false", "--config", path], cwd=tmp_path)
    bad = [f for f in report["checks"] if f["status"] == "fail" and f["check"] in ("validation", "aio_handle")]
    keys = [f["key"] for f in bad]
    assert len(keys) == len(set(keys)), f"the table names a key twice: {bad}"
    return bool(bad), set(keys), report


def config_cases(nvme_path):
    """(name, config): every field of DeepSpeed's ZeRO models and every aio
    key with each probe value, and the combinations the models check."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    offload = {"device": "nvme", "nvme_path": nvme_path}
    cases = []

    def fields(model):
        return [(f.alias or n, f) for n, f in model.model_fields.items()]

    for key, field in fields(DeepSpeedZeroConfig):
        if key == "stage":
            probes = PROBES + [3, "3", 3.0, 4, "03"]
        else:
            probes = PROBES
        for v in probes:
            cases.append((f"zero.{key}={v!r}", {"zero_optimization": {"stage": 3, key: v}} if key != "stage"
                          else {"zero_optimization": {key: v}}))
        nested = [a for a in (getattr(field.annotation, "__args__", None) or (field.annotation,))
                  if hasattr(a, "model_fields")]
        for model in nested:
            base = dict(offload) if key.startswith("offload_") else {}
            for sub, _ in fields(model):
                for v in PROBES:
                    block = dict(base)
                    block[sub] = v
                    cases.append((f"zero.{key}.{sub}={v!r}", {"zero_optimization": {"stage": 3, key: block}}))
    for key in AIO_KEYS + ("use_gds",):
        for v in AIO_PROBES:
            cases.append((f"aio.{key}={v!r}",
                          {"zero_optimization": {"stage": 3, "offload_param": dict(offload)}, "aio": {key: v}}))
            # FastPersist builds the same aio_handle, with no NVMe offload.
            cases.append((f"fast writer, aio.{key}={v!r}", {"zero_optimization": {"stage": 2},
                          "checkpoint": {"writer": {"type": "fast"}}, "aio": {key: v}}))
    for writer in ({}, {"type": "FAST"}, {"type": "Fast"}, {"type": "python"}, {"type": "mock"}, {"type": None}, None):
        for aio in ({"queue_depth": 0}, {"block_size": "1M"}, {"queue_depth": 16}):
            cases.append((f"writer {writer!r}, aio {aio!r}", {"zero_optimization": {"stage": 1},
                          "checkpoint": {"writer": writer}, "aio": aio}))
    both = [
        {"stage3_prefetch_bucket_size": 5, "prefetch_bucket_size": 6},
        {"cpu_offload": True, "offload_optimizer": {"device": "cpu"}},
        {"cpu_offload": False},
        {"cpu_offload_param": True, "offload_param": {"device": "cpu"}},
        {"stage3_gather_fp16_weights_on_model_save": True, "stage3_gather_16bit_weights_on_model_save": False},
        {"compute_grad_norm": False, "stage": 2},
        {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
        {"mics_shard_size": 2},
        {"zenflow": {"select_interval": "5"}},
        {"zenflow": {"update_interval": 0}},
        {"leaf_module": {"classes": "a.B"}},
    ]
    cases += [(f"combination {c}", {"zero_optimization": dict({"stage": 3}, **c)}) for c in both]
    # Keys DeepSpeed removed, which it refuses before anything else.
    from deepspeed.runtime import config as ds_config
    for key in ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS:
        for v in ({}, None, True):
            cases.append((f"removed {key}={v!r}", {key: v, "zero_optimization": {"stage": 3}}))
        cases.append((f"removed {key} and a bad aio block", {key: {}, "zero_optimization": {
            "stage": 3, "offload_param": dict(offload)}, "aio": {"queue_depth": 0}}))
    for key in ds_config._REMOVED_ZERO_CONFIG_KEYS:
        cases.append((f"removed zero.{key}", {"zero_optimization": {"stage": 3, key: 2}}))
    for z in (True, False, None, "x", [1]):
        cases.append((f"zero_optimization={z!r}", {"zero_optimization": z}))
    for a in (None, [1], "x"):
        cases.append((f"aio={a!r}", {"zero_optimization": {"stage": 3, "offload_param": dict(offload)}, "aio": a}))
    return cases


def test_the_doctors_table_and_probe_agree_with_deepspeed_on_every_field(tmp_path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    disagree = []
    cases = config_cases(str(nvme))
    assert len(cases) > 1000, len(cases)
    for i, (name, cfg) in enumerate(cases):
        path = tmp_path / f"c{i}.json"
        path.write_text(json.dumps(cfg))
        ds_refuses, ds_keys = deepspeed_says(cfg)
        table_refuses, table_keys, report = doctor_table_says(tmp_path, path)
        probe_refuses, probe_keys = probe_says(path)
        row = (name, ("deepspeed", ds_refuses, ds_keys), ("table", table_refuses, table_keys),
               ("probe", probe_refuses, probe_keys))
        if not (ds_refuses == table_refuses == probe_refuses):
            disagree.append(row)
        elif ds_refuses and ds_keys is not None and not (ds_keys == table_keys == probe_keys):
            disagree.append(row)
        elif ds_refuses and ds_keys is None:
            # An assertion or a TypeError: one finding, about the section it is in.
            top = next(iter(cfg))
            if not all(k.split(".")[0] in (top, "aio", "zero_optimization") for k in table_keys | probe_keys):
                disagree.append(row)
        # (A missing nvme_path passes DeepSpeedConfig and fails when the
        # swapper starts: the doctor's nvme_path check, not a config error.)
        failed = [f for f in report["checks"] if f["status"] == "fail" and f["check"] != "nvme_path"]
        if not ds_refuses and failed:
            disagree.append((name, "the doctor fails a config DeepSpeed accepts", failed))
    assert not disagree, f"{len(disagree)} of {len(cases)} disagree:\n" + "\n".join(map(repr, disagree[:40]))


def test_removed_keys_fail_with_deepspeeds_own_text(tmp_path):
    """Every key DeepSpeed removed, top-level and in zero_optimization: the
    table and the probe fail it under its own key with DeepSpeed's whole
    message (the issue it links included)."""
    from deepspeed.runtime import config as ds_config

    removed = [([k], m) for k, m in ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS.items()]
    removed += [(["zero_optimization", k], m) for k, m in ds_config._REMOVED_ZERO_CONFIG_KEYS.items()]
    # Two at once: each is named with its own message.
    both = {"zero_optimization": {"stage": 3, "mics_shard_size": 2}, "amp": {}}
    cases = [(loc, message, {loc[0]: {"stage": 3, loc[1]: 2}} if len(loc) == 2
              else {loc[0]: {}, "zero_optimization": {"stage": 3}}) for loc, message in removed]
    cases += [(loc, message, both) for loc, message in removed if loc[-1] in ("amp", "mics_shard_size")]
    for i, (loc, message, cfg) in enumerate(cases):
        path = tmp_path / f"removed{i}.json"
        path.write_text(json.dumps(cfg))
        key = ".".join(loc)
        _, _, report = doctor_table_says(tmp_path, path)
        table = finding(report, "validation", "config", key)
        assert table["status"] == "fail" and f"DeepSpeedConfigError: {message}" in table["summary"], (key, table)
        probe = [e for e in probe_namespace()["_config_check"](str(path))["errors"] if e["loc"] == loc]
        assert [e["msg"] for e in probe] == [f"DeepSpeedConfigError: {message}"], (key, probe)


def test_a_union_field_is_one_finding_naming_each_branch(tmp_path):
    """pydantic refuses a Union[str, int] field once per branch: DeepSpeed's
    own validation through the doctor gives one FAIL for the key, with both
    messages."""
    cfg = tmp_path / "union.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3, "zenflow": {"select_interval": 2.5}}}))
    report, code = run_doctor(["--only", "config", "--python", sys.executable, "--config", cfg])
    fails = [f for f in report["checks"] if f["status"] == "fail"]
    assert [f["key"] for f in fails] == ["zero_optimization.zenflow.select_interval"], fails
    assert "str: Input should be a valid string; int: Input should be a valid integer, got a number with a " \
        "fractional part" in fails[0]["summary"], fails
    assert code == 1


def test_the_doctor_asks_deepspeed_itself_when_its_python_has_it(tmp_path):
    """--python with DeepSpeed: each error is DeepSpeed's, through its own
    models and the real aio_handle; what DeepSpeed accepts is no finding."""
    nvme = str(tmp_path)
    configs = {
        "device": {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme ", "nvme_path": nvme,
                                                                       "buffer_count": "five"}},
                   "aio": {"queue_depth": "8"}},
        "accepted": {"zero_optimization": {"stage": 3, "offload_param": {
            "device": "nvme", "nvme_path": nvme, "pin_memory": "yes", "buffer_count": "8", "buffer_size": 1e6}},
            "aio": {"queue_depth": 0}},
    }
    paths = {}
    for name, cfg in configs.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(cfg))
    report, code = run_doctor(["--only", "config", "--python", sys.executable, "--config", paths["device"]])
    import deepspeed
    dev = finding(report, "validation", "config", "zero_optimization.offload_param.device")
    assert dev["status"] == "fail" and "Input should be 'none', 'cpu' or 'nvme'" in dev["summary"], dev
    assert f"DeepSpeed {deepspeed.__version__}'s own validation in {sys.executable}" in dev["why"], dev
    assert '"device": "nvme"' in dev["fix"], dev
    count = finding(report, "validation", "config", "zero_optimization.offload_param.buffer_count")
    assert count["status"] == "fail" and "unable to parse string as an integer" in count["summary"], count
    # The aio block too, in the same run (DeepSpeed itself would stop at the first error).
    handle = finding(report, "aio_handle", "config", "aio.queue_depth")
    assert "incompatible constructor arguments" in handle["summary"] and "a str" in handle["summary"], handle
    assert code == 1
    report, code = run_doctor(["--only", "config", "--python", sys.executable, "--config", paths["accepted"]])
    handle = finding(report, "aio_handle", "config", "aio.queue_depth")
    assert handle["status"] == "fail" and "queue_depth must be positive" in handle["summary"], handle
    assert "deepnvme.async_io raised" in handle["why"], handle
    assert not [f for f in report["checks"] if f["status"] != "ok" and f["check"] != "aio_handle"], report
    assert code == 1


def test_a_fastpersist_writers_aio_block_goes_through_the_real_aio_handle(tmp_path):
    """FastPersist builds aio_handle(...) from the aio block at
    deepspeed.initialize, with nothing offloaded: the doctor calls the real
    handle for it, and a healthy FastPersist config is all ok."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": {"type": "fast"}},
                               "aio": {"queue_depth": 0}}))
    report, code = run_doctor(["--only", "config", "--python", sys.executable, "--config", bad])
    handle = finding(report, "aio_handle", "config", "aio.queue_depth")
    assert handle["status"] == "fail" and "queue_depth must be positive" in handle["summary"], handle
    assert "FastPersist" in handle["why"] and "deepnvme.async_io raised" in handle["why"], handle
    assert code == 1
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 2}, "checkpoint": {"writer": {"type": "fast"}},
                                "aio": {"queue_depth": 8}}))
    report, code = run_doctor(["--only", "config", "--python", sys.executable, "--config", good])
    assert not [f for f in report["checks"] if f["status"] != "ok"], report
    assert "aio_handle(...) takes the aio block" in finding(report, "validation", "config")["summary"], report
    assert code == 0


# ---------------------------------------------------------------- swap buffers, proven by DeepSpeed

EXAMPLE = os.path.join(ROOT, "examples", "zero_infinity.py")
HIDDEN, LAYERS = 512, 2  # two Linear(512, 512) fp32 weights: 1 MiB each, DeepSpeed's smallest swappable
JOB = r"""
import importlib.util, json, sys, traceback
spec = importlib.util.spec_from_file_location("zero_infinity", sys.argv[1])
zi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zi)
jobs, out = json.loads(sys.argv[2]), {}
base = zi.ds_config
for job in jobs:
    def config(args, job=job):
        cfg = base(args)
        cfg["zero_optimization"]["offload_param"].update(job["offload_param"])
        with open(job["config_out"], "w") as f:
            json.dump(cfg, f)
        return cfg
    zi.ds_config = config
    try:
        out[job["name"]] = {"losses": zi.train(zi.parse_args(job["argv"]))["losses"]}
    except BaseException as e:
        out[job["name"]] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
print("JOBS:" + json.dumps(out))
"""


def test_the_buffer_findings_are_where_deepspeed_fails(tmp_path):
    """Three real ZeRO-3 jobs with NVMe parameter offload: a buffer smaller
    than a weight, one buffer for two weights, and two. DeepSpeed fails the
    first two with the errors of #3506 and #3062 and trains the third; the
    doctor, given the same config and the model's sizes, fails the same two
    checks and passes the third."""
    base = ["--layers", str(LAYERS), "--hidden", str(HIDDEN), "--batch", "4", "--steps", "2", "--optimizer", "torch-adam"]
    jobs = []
    for name, param in (("small-buffer", {"buffer_size": HIDDEN * HIDDEN // 2}), ("one-buffer", {"buffer_count": 1}),
                        ("two-buffers", {"buffer_count": 2})):
        (tmp_path / name).mkdir()
        jobs.append({"name": name, "offload_param": param, "config_out": str(tmp_path / name / "ds.json"),
                     "argv": base + ["--nvme-path", str(tmp_path / name / "swap")]})
    env = dict(os.environ, DEEPNVME_LOG="quiet", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", JOB, EXAMPLE, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=1200, env=env, cwd=str(tmp_path))
    line = next((l for l in proc.stdout.splitlines() if l.startswith("JOBS:")), None)
    assert line, f"{proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = json.loads(line[len("JOBS:"):])
    assert "More elements 262144 than buffer size 131072" in results["small-buffer"].get("error", ""), results
    assert "Not enough buffers 0 for swapping 1" in results["one-buffer"].get("error", ""), results
    assert "error" not in results["two-buffers"] and len(results["two-buffers"]["losses"]) == 2, results

    model = ["--model-params", str(LAYERS * HIDDEN * HIDDEN), "--largest-param", str(HIDDEN * HIDDEN)]
    verdicts = {}
    for job in jobs:
        report, code = run_doctor(["--only", "buffers", "--python", "/bin/false", "--config", job["config_out"]] + model)
        verdicts[job["name"]] = {f["check"]: f["status"] for f in report["checks"]}, code
    assert verdicts["small-buffer"][0]["buffer_size"] == "fail", verdicts
    assert verdicts["one-buffer"][0] == {"buffer_size": "ok", "buffer_count": "fail",
                                         "optimizer buffer_count": "ok"}, verdicts
    assert set(verdicts["two-buffers"][0].values()) == {"ok"} and verdicts["two-buffers"][1] == 0, verdicts


def test_a_no_bench_run_stays_within_ten_seconds_of_cpu(tmp_path):
    """The whole doctor without the bench, with this Python (torch and
    DeepSpeed imported once for the frontend and config sections), on a
    healthy config: no WARN or FAIL, and under 10 s of CPU (the wall time
    is printed: on a shared, loaded machine it waits for the CPU)."""
    import resource
    import time

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3, "sub_group_size": 1e6, "offload_param": {
        "device": "nvme", "nvme_path": str(tmp_path / "swap"), "buffer_count": 2, "buffer_size": 1e6},
        "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "swap")}}}))
    doctor_binary()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    report, code = run_doctor(["--no-bench", "--python", sys.executable, "--config", cfg])
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"doctor --no-bench: {wall:.1f} s wall, {cpu:.1f} s CPU")
    problems = [f for f in report["checks"] if f["status"] in ("warn", "fail")]
    assert not problems, problems
    assert code == 0
    assert cpu < 10, f"{cpu:.1f} s of CPU"
