# Run by `deepnvme doctor` (crates/deepnvme-cli/src/doctor/validation.rs) in
# the job's Python, right after frontend_probe.py in the same interpreter
# (it uses that script's `out` and `attempt`), so torch and DeepSpeed are
# imported once. When DEEPNVME_DOCTOR_CONFIG names a DeepSpeed config, it
# puts under out["config_check"] what DeepSpeed's own code says of it, the
# way deepspeed.initialize meets it: the file read as DeepSpeedConfig reads
# it (hjson, DeepSpeed's duplicate-key hook), the removed keys DeepSpeedConfig
# refuses, the zero_optimization section through DeepSpeedZeroConfig
# (pydantic: every error, with its key), the aio block through
# get_aio_config, the checkpoint block through get_checkpoint_config, and,
# when something builds an aio_handle (ZeRO-3 swapping to NVMe, FastPersist's
# checkpoint writer) and the loaded async_io op is deepnvme's (nothing is
# JIT-built), aio_handle(...) called with the block's values exactly as
# DeepSpeed calls it.
import json
import os


def _jsonable(value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def _input_path(cfg, loc):
    """The part of pydantic's loc that indexes the config (drops union tags such as 'str')."""
    path, node = [], cfg
    for item in loc:
        if isinstance(node, dict) and item in node:
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        else:
            break
        path.append(str(item))
    return path


def _model_keys(model, loc):
    """The keys the pydantic model at `loc` (below DeepSpeedZeroConfig) takes."""
    import typing

    for name in loc:
        field = model.model_fields.get(name) or next(
            (f for f in model.model_fields.values() if f.alias == name), None)
        if field is None:
            return []
        ann = field.annotation
        for arg in (typing.get_args(ann) or (ann,)):
            if hasattr(arg, "model_fields"):
                model = arg
                break
        else:
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def read_config(path):
    """The config as DeepSpeedConfig reads a file: hjson.load with DeepSpeed's
    own duplicate-key hook. Where the hook refuses an object, its error is
    kept (with the object's keys from the top and the keys given twice) and
    the object holds each key's last value, as dict keeps it, so the rest
    can still be checked. Returns (config, duplicates)."""
    import hjson
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

    refused = []

    def hook(pairs):
        try:
            return dict_raise_error_on_duplicate_keys(pairs)
        except ValueError as e:
            counts = {}
            for key, _ in pairs:
                counts[key] = counts.get(key, 0) + 1
            obj = dict(pairs)
            refused.append((obj, [k for k, n in counts.items() if n > 1], str(e)))
            return obj

    with open(path, "r") as f:
        cfg = hjson.load(f, object_pairs_hook=hook)

    def where(node, target, keys):
        if node is target:
            return keys
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            found = where(child, target, keys + [str(key)])
            if found is not None:
                return found
        return None

    return cfg, [{"object": where(cfg, obj, []) or [], "keys": keys, "message": message}
                 for obj, keys, message in refused]


def _config_check(path):
    report = {"deepspeed": out.get("deepspeed"), "errors": [], "aio_handle": None}
    if not report["deepspeed"]:
        return report
    # Read as deepspeed.initialize(config=path) reads it; what hjson or the
    # hook refuses stops here (the doctor reports it).
    try:
        read, duplicates = read_config(path)
    except Exception as e:
        report["read_error"] = f"{type(e).__name__}: {e}"
        return report
    report["read"] = {"config": read, "duplicates": duplicates}
    # A file json.load reads too is checked with JSON's numbers (1e6 a
    # float), as a script that json.loads it and passes the dict (the HF
    # Trainer does) gives them to DeepSpeed; one only hjson reads, as hjson
    # has them (1e6 an int).
    try:
        with open(path) as f:
            cfg = json.load(f)
    except ValueError:
        cfg = read
    errors = report["errors"]

    def error(loc, kind, msg, value=None, fields=None):
        entry = {"loc": [str(x) for x in loc], "kind": kind, "msg": msg, "input": _jsonable(value),
                 "fields": fields or []}
        errors.append(entry)
        return entry

    import pydantic
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig, get_zero_config
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_config
    from deepspeed.runtime.model_checkpointing.constants import (CHECKPOINT_WRITER, CHECKPOINT_WRITER_TYPE,
                                                                 CheckpointWriterType)

    # DeepSpeedConfig's first step: keys DeepSpeed removed. It stops at the
    # first, top-level ones before zero_optimization's; every one is
    # reported here, each with DeepSpeed's own message, and the rest of the
    # config is still checked without them (every error in one run).
    reject = getattr(ds_config, "_reject_removed_config_keys", None)
    zero_raw = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    removed_top = getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})
    removed_zero = getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {})
    if reject is not None:
        try:
            reject(cfg)
        except Exception as e:
            found = [([k], m, cfg[k]) for k, m in removed_top.items() if k in cfg] + [
                (["zero_optimization", k], m, zero_raw[k]) for k, m in removed_zero.items() if k in zero_raw]
            if not any(m == str(e) for _, m, _ in found):
                found.insert(0, ([], str(e), None))  # a removal this script does not know of
            for loc, message, value in found:
                error(loc, "removed", f"{type(e).__name__}: {message}", value)
    if any(k in zero_raw for k in removed_zero):
        cfg = dict(cfg, zero_optimization={k: v for k, v in zero_raw.items() if k not in removed_zero})

    zero = None
    try:
        zero = get_zero_config(cfg)
    except pydantic.ValidationError as e:
        # pydantic reports a union field once per branch, its loc tagged with
        # the branch ('str', 'int'): one error per key, naming each branch's
        # message, and no (key, kind) twice.
        by_key, seen = {}, set()
        for item in e.errors():
            path = _input_path(cfg.get("zero_optimization", {}), list(item["loc"]))
            loc = ["zero_optimization"] + path
            branch = ".".join(str(x) for x in item["loc"][len(path):])
            msg = f"{branch}: {item['msg']}" if branch else item["msg"]
            if (tuple(loc), item["type"]) in seen:
                continue
            seen.add((tuple(loc), item["type"]))
            if branch and tuple(loc) in by_key:
                by_key[tuple(loc)]["msg"] += f"; {msg}"
                continue
            fields = _model_keys(DeepSpeedZeroConfig, loc[1:-1]) if item["type"] == "extra_forbidden" else []
            entry = error(loc, item["type"], msg, item.get("input") if item["loc"] else None, fields)
            if branch:
                by_key[tuple(loc)] = entry
    except Exception as e:
        error(["zero_optimization"], "assertion_error" if isinstance(e, AssertionError) else "type_error",
              f"{type(e).__name__}: {e}")

    try:
        aio = get_aio_config(cfg)
    except AssertionError as e:
        error(["aio", "use_gds"], "assertion_error", f"AssertionError: {e}", (cfg.get("aio") or {}).get("use_gds"))
        return report
    except Exception as e:
        error(["aio"], "type_error", f"{type(e).__name__}: {e}", cfg.get("aio"))
        return report
    # FastPersist's checkpoint writer (checkpoint.writer type FAST, its
    # default) builds aio_handle(...) from the block at deepspeed.initialize.
    fast = False
    try:
        writer = get_checkpoint_config(cfg)[CHECKPOINT_WRITER]
        fast = writer is not None and writer[CHECKPOINT_WRITER_TYPE] == CheckpointWriterType.FAST
    except Exception as e:
        error(["checkpoint"], "assertion_error" if isinstance(e, AssertionError) else "type_error",
              f"{type(e).__name__}: {e}", cfg.get("checkpoint"))
    # The ZeRO-3 swappers create aio_handle(...) only when something goes to
    # NVMe. When zero_optimization has errors (DeepSpeed stops there first),
    # the aio block is still checked, as the config means it, so that one
    # run reports every error.
    if zero is not None:
        swaps = int(zero.stage) == 3 and any(
            o is not None and o.device == "nvme" for o in (zero.offload_param, zero.offload_optimizer))
    else:
        raw = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
        try:
            stage3 = float(str(raw.get("stage", 0)).strip()) == 3
        except ValueError:
            stage3 = False
        swaps = stage3 and any(isinstance(raw.get(k), dict) and str(raw[k].get("device", "")).strip().lower() == "nvme"
                               for k in ("offload_param", "offload_optimizer"))
    handle = report["aio_handle"] = {"tried": False}
    loads = out.get("deepspeed_loads") or {}
    handle["users"] = (["ZeRO-3's NVMe swappers"] if swaps else []) + (
        ["FastPersist's checkpoint writer (checkpoint.writer type fast)"] if fast else [])
    if not handle["users"]:
        handle["why_not"] = ("nothing swaps to NVMe at ZeRO stage 3 and no FastPersist writer (checkpoint.writer "
                             "type fast) writes checkpoints, so no aio_handle is created")
    elif aio.get("use_gds"):
        handle["why_not"] = "use_gds: the swappers and FastPersist create gds_handle, which needs a GPU"
    elif not str(loads.get("name", "")).startswith("deepnvme"):
        handle["why_not"] = f"the loaded async_io op is {loads.get('name')!r}, not deepnvme's (it is not built here)"
    else:
        from deepspeed.ops.op_builder import AsyncIOBuilder

        op = AsyncIOBuilder().load(verbose=False)
        handle.update(tried=True, op=op.__name__)
        keys = ("block_size", "queue_depth", "single_submit", "overlap_events", "intra_op_parallelism")
        defaults = dict(block_size=1048576, queue_depth=8, single_submit=False, overlap_events=True,
                        intra_op_parallelism=1)

        def make(kwargs):
            try:
                op.aio_handle(**kwargs)
                return None
            except Exception as e:
                return f"{type(e).__name__}: {str(e).splitlines()[0]}"

        whole = make({k: aio[k] for k in keys})
        if whole is not None:
            # The binding's TypeError names no argument: find which by
            # trying each value alone.
            culprits = [k for k in keys if make(dict(defaults, **{k: aio[k]})) is not None]
            for k in culprits:
                why = make(dict(defaults, **{k: aio[k]}))
                error(["aio", k], "aio_handle", f"{why} ({k}={aio[k]!r}, a {type(aio[k]).__name__})", aio[k])
            if not culprits:
                error(["aio"], "aio_handle", whole, cfg.get("aio"))
    return report


_path = os.environ.get("DEEPNVME_DOCTOR_CONFIG")
if _path:
    attempt("config_check", lambda: _config_check(_path))

# Alone (without frontend_probe.py), for a file the doctor cannot read itself:
# DeepSpeed's reading of the file DEEPNVME_DOCTOR_READ names, on one line
# after the marker the doctor passes in DEEPNVME_DOCTOR_MARKER.
_read = os.environ.get("DEEPNVME_DOCTOR_READ")
if _read:
    try:
        import hjson  # noqa: F401
        import deepspeed.runtime.config_utils  # noqa: F401
    except BaseException as e:
        _report = {"unavailable": f"{type(e).__name__}: {e}"}
    else:
        try:
            _cfg, _dups = read_config(_read)
            _report = {"config": _cfg, "duplicates": _dups}
        except Exception as e:
            _report = {"error": f"{type(e).__name__}: {e}"}
    print(os.environ.get("DEEPNVME_DOCTOR_MARKER", "") + json.dumps(_report), flush=True)
