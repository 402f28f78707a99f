#!/usr/bin/env python3
"""ZeRO-Infinity on deepnvme: ZeRO-3 training with parameters and optimizer
state offloaded to NVMe through DeepSpeed's own swappers, whose aio handles
deepnvme's hook provides.

A model built in code (``--layers`` bias-free ``Linear(H, H)`` layers with
ReLU between them, a mean-squared-error regression loss against a fixed
random linear teacher) trains for ``--steps`` steps on the accelerator
DeepSpeed picks (``DS_ACCELERATOR``, default ``cpu`` here) as one process
(rank 0 of 1, gloo), without a launcher. Every step prints its loss, its wall
time and the bytes this process read from and wrote to storage during it
(``/proc/self/io`` read_bytes / write_bytes), plus deepnvme's own counters
when the core has ``deepnvme.stats()``.

    python examples/zero_infinity.py --nvme-path /nvme/swap
    python examples/zero_infinity.py --aio-config tune.json   # from `deepnvme tune --json`
    python examples/zero_infinity.py --offload cpu            # the floor: no NVMe
    python examples/zero_infinity.py --op stock               # DeepSpeed's C++ async_io (libaio)

``--op stock`` re-runs the script with ``DEEPNVME_DEEPSPEED_HOOK=0`` so that
DeepSpeed JIT-builds its own async_io; where that cannot build (no libaio-dev,
no compiler) the script says so and exits with status 2.

``--save-at K --ckpt-dir D`` saves a checkpoint after step K (``--writer
fast`` uses DeepSpeed's FastPersist writer over an aio handle);
``--resume D`` loads the latest checkpoint in D and continues from the step
after it. Batches depend only on (seed, step), so a resumed run sees the same
data as an uninterrupted one. ``--json-out FILE`` writes everything measured
as JSON (the tests read it).

After ``engine.destroy()`` the script drops the references through which
DeepSpeed keeps the destroyed model and its locked swap buffers alive
(``release_deepspeed_references``) and prints deepnvme's locked memory before
and after: all of it comes back.
"""

import argparse
import gc
import json
import os
import socket
import sys
import time

STOCK_EXIT = 2  # --op stock cannot run here


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model and training")
    m.add_argument("--layers", type=int, default=4, help="Linear(H, H) layers [4]")
    m.add_argument("--hidden", type=int, default=1024, help="H [1024]; a parameter is swapped to NVMe only "
                   "when it holds at least max(1 MiB, aio block_size) bytes")
    m.add_argument("--batch", type=int, default=8, help="micro-batch size [8]")
    m.add_argument("--steps", type=int, default=5, help="optimizer steps to run [5]")
    m.add_argument("--lr", type=float, default=1e-3)
    m.add_argument("--seed", type=int, default=1234)
    m.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="training dtype [fp32]")
    m.add_argument("--optimizer", choices=("ds-cpu-adam", "torch-adam"), default="ds-cpu-adam",
                   help="DeepSpeed's CPU Adam (JIT-built with ninja on first use) or torch.optim.Adam "
                   "(no build; \"zero_force_ds_cpu_optimizer\": false) [ds-cpu-adam]")
    m.add_argument("--shm-comm", action="store_true",
                   help="let DeepSpeed JIT-build its shared-memory allreduce op (unused by one process; "
                   "skipped by default)")
    o = p.add_argument_group("offload")
    o.add_argument("--offload", choices=("nvme", "cpu"), default="nvme",
                   help="where parameters and optimizer state live [nvme]; cpu is the floor")
    o.add_argument("--offload-param", choices=("nvme", "cpu", "none"), help="override --offload for parameters")
    o.add_argument("--offload-optimizer", choices=("nvme", "cpu", "none"),
                   help="override --offload for optimizer state")
    o.add_argument("--nvme-path", default=None,
                   help="swap folder (must accept O_DIRECT) [./zero-infinity-swap]")
    o.add_argument("--op", choices=("deepnvme", "stock"), default="deepnvme",
                   help="which async_io DeepSpeed loads [deepnvme]")
    o.add_argument("--aio-config", metavar="FILE",
                   help="JSON with an \"aio\" block, e.g. the output of `deepnvme tune --json`")
    o.add_argument("--block-size", type=int, help="aio block_size (overrides --aio-config)")
    o.add_argument("--queue-depth", type=int, help="aio queue_depth")
    o.add_argument("--intra-op-parallelism", type=int, help="aio intra_op_parallelism")
    o.add_argument("--single-submit", type=_bool, metavar="BOOL", help="aio single_submit")
    o.add_argument("--overlap-events", type=_bool, metavar="BOOL", help="aio overlap_events")
    o.add_argument("--pipeline-read", type=_bool, default=False, metavar="BOOL",
                   help="offload_optimizer.pipeline_read [false]")
    o.add_argument("--pipeline-write", type=_bool, default=False, metavar="BOOL",
                   help="offload_optimizer.pipeline_write [false]")
    o.add_argument("--param-buffer-count", type=int, default=5, help="offload_param.buffer_count [5]")
    o.add_argument("--optimizer-buffer-count", type=int, default=4, help="offload_optimizer.buffer_count [4]")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--ckpt-dir", help="where --save-at saves")
    c.add_argument("--save-at", type=int, help="save a checkpoint after this step")
    c.add_argument("--resume", metavar="DIR", help="load the latest checkpoint in DIR first")
    c.add_argument("--writer", choices=("python", "fast"), default="python",
                   help="checkpoint writer: torch.save (python, the default engine) or FastPersist over an aio handle (fast)")
    r = p.add_argument_group("output")
    r.add_argument("--json-out", metavar="FILE", help="write losses, step times and I/O as JSON")
    r.add_argument("--print-config", action="store_true", help="print the DeepSpeed config")
    args = p.parse_args(argv)
    if args.save_at is not None and not args.ckpt_dir:
        p.error("--save-at needs --ckpt-dir")
    return args


def _bool(s):
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s!r}")


# ---------------------------------------------------------------- environment


def prepare_environment(args):
    """Single-process distributed setup without a launcher, the accelerator,
    ninja on PATH for DeepSpeed's JIT builds, and the hook switch for --op."""
    if args.op == "stock" and os.environ.get("DEEPNVME_DEEPSPEED_HOOK") != "0":
        # The hook is installed at interpreter start (a .pth file): only a
        # fresh interpreter can run without it.
        env = dict(os.environ, DEEPNVME_DEEPSPEED_HOOK="0")
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.writer == "fast" and os.environ["DS_ACCELERATOR"] == "cpu":
        # FastPersist needs a page-locked I/O buffer; torch cannot pin without
        # a GPU, DeepSpeed's native backend locks it through the pin_memory op.
        os.environ.setdefault("DS_PIN_MEMORY_BACKEND", "native")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"), ("LOCAL_SIZE", "1"),
                 ("CROSS_RANK", "0"), ("CROSS_SIZE", "1")):
        os.environ.setdefault(k, v)
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_op(args):
    """Which async_io DeepSpeed will load; exits STOCK_EXIT where --op stock cannot build."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    builder = AsyncIOBuilder()
    if args.op == "deepnvme":
        mod = builder.load()
        if not mod.__name__.startswith("deepnvme."):
            sys.exit(f"AsyncIOBuilder().load() returned {mod.__name__}, not deepnvme's module "
                     "(is deepnvme installed in this interpreter, and DEEPNVME_DEEPSPEED_HOOK unset?)")
        return mod.__name__
    if getattr(type(builder), "_deepnvme_backed", False):
        sys.exit("--op stock: deepnvme's hook is still active (DEEPNVME_DEEPSPEED_HOOK=0 did not take)")
    if not builder.is_compatible(verbose=True):
        print("--op stock is impossible here: DeepSpeed's async_io is not compatible on this machine "
              "(it needs libaio-dev: apt-get install libaio-dev, and a C++ compiler)", file=sys.stderr)
        sys.exit(STOCK_EXIT)
    try:
        mod = builder.load(verbose=False)
    except BaseException as error:  # the JIT build raises anything from RuntimeError to SystemExit
        print(f"--op stock is impossible here: DeepSpeed's JIT build of async_io failed: {error!r}", file=sys.stderr)
        sys.exit(STOCK_EXIT)
    return getattr(mod, "__name__", "async_io")


# ---------------------------------------------------------------- config


AIO_KEYS = ("block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events")


def aio_block(args):
    """The "aio" section: DeepSpeed's defaults, then --aio-config, then flags."""
    aio = {"block_size": 1 << 20, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
           "overlap_events": True}
    if args.aio_config:
        with open(args.aio_config) as f:
            doc = json.load(f)
        block = doc.get("aio", doc) if isinstance(doc, dict) else None
        if not isinstance(block, dict):
            sys.exit(f"{args.aio_config}: no \"aio\" object (expected `deepnvme tune --json` output)")
        for k in AIO_KEYS + ("use_gds",):
            if k in block:
                aio[k] = block[k]
    for k in AIO_KEYS:
        v = getattr(args, k)
        if v is not None:
            aio[k] = v
    return aio


def ds_config(args):
    param_dev = args.offload_param or args.offload
    optim_dev = args.offload_optimizer or args.offload
    nvme_path = os.path.abspath(args.nvme_path or "zero-infinity-swap")
    aio = aio_block(args)
    elem = 4 if args.dtype == "fp32" else 2
    # One parameter buffer holds the largest parameter (H*H), rounded up to
    # the aio alignment; the default (1e8 elements x 5 buffers) would lock GBs.
    align = max(4096, aio["block_size"]) // elem
    param_buffer = -(-args.hidden * args.hidden // align) * align
    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_max_live_parameters": args.hidden * args.hidden,
        "stage3_prefetch_bucket_size": args.hidden * args.hidden,
        "offload_param": {"device": param_dev},
        "offload_optimizer": {"device": optim_dev},
    }
    if param_dev == "nvme":
        zero["offload_param"].update(nvme_path=nvme_path, buffer_count=args.param_buffer_count,
                                     buffer_size=param_buffer, max_in_cpu=0)
    if optim_dev == "nvme":
        zero["offload_optimizer"].update(nvme_path=nvme_path, buffer_count=args.optimizer_buffer_count,
                                         pipeline_read=args.pipeline_read, pipeline_write=args.pipeline_write)
    cfg = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_optimization": zero,
        "aio": aio,
    }
    if args.writer == "fast":  # FastPersist; without a writer block DeepSpeed uses torch.save
        cfg["checkpoint"] = {"writer": {"type": "fast", "io_buffer_size": 1 << 20, "io_buffer_double": True}}
    if args.optimizer == "ds-cpu-adam":
        cfg["optimizer"] = {"type": "Adam", "params": {"lr": args.lr}}
    else:
        cfg["zero_force_ds_cpu_optimizer"] = False
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


# ---------------------------------------------------------------- model and data


def build_model(args, config):
    import deepspeed
    import torch

    class Net(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(args.hidden, args.hidden, bias=False) for _ in range(args.layers))

        def forward(self, x, y):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i + 1 < len(self.layers):
                    x = torch.relu(x)
            return torch.nn.functional.mse_loss(x, y)

    torch.manual_seed(args.seed)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Net()
    return model


def batch_for(args, step, dtype, device):
    """Batch `step` (1-based): depends only on (seed, step)."""
    import torch

    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    x = torch.randn(args.batch, args.hidden, generator=g)
    teacher = torch.Generator().manual_seed(args.seed)
    w = torch.randn(args.hidden, args.hidden, generator=teacher) / args.hidden**0.5
    y = x @ w
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


# ---------------------------------------------------------------- measurement


def proc_io():
    out = {}
    with open("/proc/self/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k.strip()] = int(v)
    return out


def deepnvme_counters():
    """deepnvme.stats() as a dict of the byte counters, or None where the core has no stats API."""
    try:
        import deepnvme
    except ImportError:
        return None
    fn = getattr(deepnvme, "stats", None)
    if fn is None:
        return None
    s = fn()
    get = (lambda k: s.get(k)) if isinstance(s, dict) else (lambda k: getattr(s, k, None))
    return {k: get(k) for k in ("ops", "bytes_read", "bytes_written", "bounced_bytes", "io_time_s", "wait_time_s")}


def locked_memory():
    """(regions, requested bytes, locked bytes) held by deepnvme's pinned-memory
    manager, or None where deepnvme is not importable (the stock op)."""
    try:
        import deepnvme
        return tuple(deepnvme.native().pinned_stats())
    except (ImportError, AttributeError):
        return None


def release_deepspeed_references(module_ids):
    """Drops the two references through which DeepSpeed (0.19.x) keeps a
    destroyed ZeRO-3 engine's model, and with it every swap buffer its
    parameters' swappers hold (locked memory), reachable for the life of the
    process. Call it after ``engine.destroy()`` with the ids of the engine's
    modules (``{id(m) for m in model.modules()}``).

    * ``parameter_offload.FWD_MODULE_STACK``, a module-level list that the
      top module is pushed onto when its hooks are set up and never popped
      from: this engine's modules are taken out (other engines' stay).
    * the ``functools.lru_cache`` on
      ``PartitionedParameterCoordinator.__params_to_release``, keyed by
      (coordinator, module, step): cleared (a pure cache: live engines
      refill it on their next step).

    Found with a reverse-reference walk over ``gc.get_objects()`` on
    DeepSpeed 0.19.8; with both dropped, ``gc.collect()`` gives every swap
    buffer back. Each step is skipped where DeepSpeed has no such object.
    Returns what was dropped, for the log."""
    dropped = []
    try:
        from deepspeed.runtime.zero import parameter_offload
    except ImportError:
        return dropped
    stack = getattr(parameter_offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        # (ids are safe here: the stack keeps its modules alive)
        kept = [m for m in stack if id(m) not in module_ids]
        if len(kept) != len(stack):
            dropped.append(f"{len(stack) - len(kept)} module(s) on FWD_MODULE_STACK")
            stack[:] = kept
    try:
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    except ImportError:
        return dropped
    fn = getattr(PartitionedParameterCoordinator, "_PartitionedParameterCoordinator__params_to_release", None)
    # DeepSpeed wraps the cached method in instrument_w_nvtx: the cache is the
    # wrapper's __wrapped__ or a cell of its closure.
    candidates = [fn, getattr(fn, "__wrapped__", None)]
    candidates += [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    for c in candidates:
        if callable(getattr(c, "cache_clear", None)):
            c.cache_clear()
            dropped.append("the __params_to_release cache")
            break
    return dropped


def mib(n):
    return f"{n / (1 << 20):8.2f} MiB"


def use_torch_byte_cast():
    """FastFileWriter takes cast_to_byte_tensor from DeepSpeed's utils op, which
    the CPU accelerator does not implement (NotImplementedBuilder). Substitute
    the same view written in torch (csrc/utils/tensor_cast.cpp: the tensor's
    bytes as uint8; tensors of at most one byte as they are)."""
    import types
    import torch
    import deepspeed.io.fast_file_writer as ffw

    def cast(x):
        if isinstance(x, (list, tuple)):
            return [cast(t) for t in x]
        return x if x.nbytes <= 1 else x.reshape(-1).view(torch.uint8)

    class TorchUtilsBuilder:

        def load(self, verbose=False):
            return types.SimpleNamespace(cast_to_byte_tensor=cast)

    ffw.UtilsBuilder = TorchUtilsBuilder


# ---------------------------------------------------------------- the job


def train(args, on_engine=None):
    """Runs the job; returns a dict of what was measured. `on_engine(engine)`
    is called once the engine exists (the tests use it)."""
    prepare_environment(args)
    import torch
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    op_name = check_op(args) if "nvme" in (args.offload_param or args.offload, args.offload_optimizer or args.offload) \
        else "none (no NVMe offload)"
    config = ds_config(args)
    if args.print_config:
        print(json.dumps(config, indent=2))
    if not torch.distributed.is_initialized():
        if not args.shm_comm:
            # On the CPU accelerator DeepSpeed JIT-builds a shared-memory
            # allreduce when its comm backend starts; one process never uses it.
            import importlib
            # (by module name: the package attribute deepspeed.comm.torch is torch itself)
            importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo")
    # zero.Init numbers parameters from a class counter; a second engine in
    # one process must start from 0 again for its swap files and checkpoint.
    from deepspeed.runtime.zero.partition_parameters import Init
    Init.param_id = 0

    if args.writer == "fast" and get_accelerator().device_name() == "cpu":
        use_torch_byte_cast()
    model = build_model(args, config)
    optimizer = None
    if args.optimizer == "torch-adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), optimizer=optimizer,
                                           config=config)
    if on_engine is not None:
        on_engine(engine)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = get_accelerator().current_device_name()

    first = 1
    if args.resume:
        load_path, _ = engine.load_checkpoint(args.resume)
        if load_path is None:
            sys.exit(f"no checkpoint found in {args.resume}")
        first = engine.global_steps + 1

    print(f"zero_infinity: {args.layers} x Linear({args.hidden}, {args.hidden}) {args.dtype}, batch {args.batch}, "
          f"param offload {config['zero_optimization']['offload_param']['device']}, optimizer offload "
          f"{config['zero_optimization']['offload_optimizer']['device']}, async_io {op_name}, "
          f"aio {json.dumps(config['aio'], sort_keys=True)}", flush=True)
    result = {"op": op_name, "config": config, "first_step": first, "losses": [], "step_seconds": [],
              "read_bytes": [], "write_bytes": [], "deepnvme": []}
    for step in range(first, args.steps + 1):
        x, y = batch_for(args, step, dtype, device)
        io0, dn0, t0 = proc_io(), deepnvme_counters(), time.perf_counter()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        dt = time.perf_counter() - t0
        io1, dn1 = proc_io(), deepnvme_counters()
        value = float(loss.detach().float().item())
        rd, wr = io1["read_bytes"] - io0["read_bytes"], io1["write_bytes"] - io0["write_bytes"]
        line = f"step {step:3d}  loss {value!r:<22}  {dt * 1000:9.1f} ms  read {mib(rd)}  written {mib(wr)}"
        dn = None
        if dn0 is not None and dn1 is not None:
            dn = {k: (dn1[k] - dn0[k]) if dn1[k] is not None and dn0[k] is not None else None for k in dn1}
            line += "  deepnvme: " + ", ".join(f"{k} {round(v, 4) if isinstance(v, float) else v}"
                                               for k, v in dn.items())
        print(line, flush=True)
        result["losses"].append(value)
        result["step_seconds"].append(dt)
        result["read_bytes"].append(rd)
        result["write_bytes"].append(wr)
        result["deepnvme"].append(dn)
        if args.save_at == step:
            t0 = time.perf_counter()
            engine.save_checkpoint(args.ckpt_dir)
            print(f"saved checkpoint after step {step} to {args.ckpt_dir} "
                  f"({args.writer} writer, {time.perf_counter() - t0:.2f} s)", flush=True)
    if result["step_seconds"]:
        steady = result["step_seconds"][1:] or result["step_seconds"]
        n = len(result["read_bytes"])
        print(f"mean step {sum(steady) / len(steady) * 1000:.1f} ms (after the first); per step: read "
              f"{mib(sum(result['read_bytes']) / n)}, written {mib(sum(result['write_bytes']) / n)}", flush=True)
    engine.destroy()
    # What is left once the job lets go of everything: deepnvme frees a swap
    # buffer with its last reference, so any locked memory still held is
    # held through DeepSpeed (see release_deepspeed_references).
    our_modules = {id(m) for m in model.modules()}
    del engine, model, optimizer
    loss = x = y = None  # the last step's graph reaches the modules too
    gc.collect()
    locked_at_destroy = locked_memory()
    dropped = release_deepspeed_references(our_modules)
    gc.collect()
    result["locked_at_destroy"] = locked_at_destroy
    result["locked_after_release"] = locked_memory()
    if locked_at_destroy is not None and op_name.startswith("deepnvme"):
        after = result["locked_after_release"]
        print(f"deepnvme locked memory after engine.destroy() and gc: {locked_at_destroy[0]} regions, "
              f"{mib(locked_at_destroy[2]).strip()}; after dropping DeepSpeed's references "
              f"({', '.join(dropped) or 'none found'}): {after[0]} regions, {mib(after[2]).strip()}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def main(argv=None):
    args = parse_args(argv)
    train(args)


if __name__ == "__main__":
    main()
