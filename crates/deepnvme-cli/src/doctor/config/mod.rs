//! The DeepSpeed config as the doctor reads it (`--config ds_config.json`):
//! the `aio` block, the NVMe offload blocks of `zero_optimization`, and from
//! them what a rank locks for its swap buffers and writes to `nvme_path`.
//!
//! Every default and formula is DeepSpeed 0.19.8's, read from its sources
//! (cited at each one); what depends on the model, which the config does
//! not describe, is said to be an estimate or a bound, and is exact only
//! with `--model-params`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::aio_rules;
use super::lax;
use crate::args::fmt_size_approx;

pub mod read;
use read::{Duplicate, How};

/// `deepspeed/runtime/swap_tensor/constants.py`: the `aio` block's defaults
/// (those of ZeRO-Infinity, not `aio_handle()`'s: queue depth 8, overlap on).
pub const AIO_BLOCK_SIZE_DEFAULT: usize = 1 << 20;
pub const AIO_QUEUE_DEPTH_DEFAULT: usize = 8;
pub const AIO_INTRA_OP_PARALLELISM_DEFAULT: usize = 1;
pub const AIO_SINGLE_SUBMIT_DEFAULT: bool = false;
pub const AIO_OVERLAP_EVENTS_DEFAULT: bool = true;

/// `deepspeed/runtime/swap_tensor/utils.py` `AIO_ALIGNED_BYTES`: swapped
/// tensors are padded to this many bytes times `intra_op_parallelism`.
pub const AIO_ALIGNED_BYTES: u64 = 1024;

/// `deepspeed/runtime/zero/offload_config.py`: `offload_param`'s
/// `buffer_count` (5) and `buffer_size` (1e8 elements), `offload_optimizer`'s
/// `buffer_count` (4).
pub const PARAM_BUFFER_COUNT_DEFAULT: u64 = 5;
pub const PARAM_BUFFER_SIZE_DEFAULT: u64 = 100_000_000;
pub const OPTIMIZER_BUFFER_COUNT_DEFAULT: u64 = 4;

/// `offload_param.max_in_cpu` (1e9 elements).
pub const MAX_IN_CPU_DEFAULT: u64 = 1_000_000_000;

/// `deepspeed/runtime/zero/config.py`: `sub_group_size` and
/// `stage3_max_reuse_distance` (1e9 elements each).
pub const SUB_GROUP_SIZE_DEFAULT: u64 = 1_000_000_000;
pub const MAX_REUSE_DISTANCE_DEFAULT: u64 = 1_000_000_000;

/// The `aio` block, with DeepSpeed's defaults for what it leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aio {
    pub block_size: usize,
    pub queue_depth: usize,
    pub intra_op_parallelism: usize,
    pub single_submit: bool,
    pub overlap_events: bool,
    pub use_gds: bool,
}

impl Default for Aio {
    fn default() -> Aio {
        Aio {
            block_size: AIO_BLOCK_SIZE_DEFAULT,
            queue_depth: AIO_QUEUE_DEPTH_DEFAULT,
            intra_op_parallelism: AIO_INTRA_OP_PARALLELISM_DEFAULT,
            single_submit: AIO_SINGLE_SUBMIT_DEFAULT,
            overlap_events: AIO_OVERLAP_EVENTS_DEFAULT,
            use_gds: false,
        }
    }
}

/// One `offload_param` / `offload_optimizer` block with `device: nvme`
/// (read as DeepSpeed reads it; a value DeepSpeed would refuse counts as its
/// default here, and the `config` section reports it).
#[derive(Clone, Debug, PartialEq)]
pub struct NvmeOffload {
    /// `zero_optimization.offload_param` or `zero_optimization.offload_optimizer`.
    pub block: &'static str,
    /// As DeepSpeed's `Optional[Path]` takes it: `""` is `.`.
    pub nvme_path: Option<PathBuf>,
    pub buffer_count: u64,
    /// Elements per buffer (`offload_param` only).
    pub buffer_size: u64,
    pub pin_memory: bool,
    /// `offload_param.max_in_cpu`: parameter elements kept in CPU memory.
    pub max_in_cpu: u64,
    /// `pipeline_read` / `pipeline_write` (`offload_optimizer` only): the
    /// pipelined swapper, with a second handle and overlapping sub-groups.
    pub pipeline_read: bool,
    pub pipeline_write: bool,
    /// `offload_optimizer.fast_init`.
    pub fast_init: bool,
}

impl NvmeOffload {
    pub fn pipeline(&self) -> bool {
        self.pipeline_read || self.pipeline_write
    }
    /// `zero_optimization.offload_param.nvme_path`.
    pub fn path_key(&self) -> String {
        format!("{}.nvme_path", self.block)
    }
}

/// What the doctor needs of a DeepSpeed config.
#[derive(Clone, Debug)]
pub struct DsConfig {
    pub path: PathBuf,
    /// The whole config, for the validation (each duplicated key's last value).
    pub raw: Value,
    /// How the file was read: JSON, JSON with comments, or by DeepSpeed's hjson.
    pub how: How,
    /// Keys given twice in one object: DeepSpeed refuses the file.
    pub duplicates: Vec<Duplicate>,
    pub stage: Option<u64>,
    pub aio: Aio,
    /// Whether the config has an `aio` block at all.
    pub aio_given: bool,
    pub param: Option<NvmeOffload>,
    pub optimizer: Option<NvmeOffload>,
    /// Bytes per element of the model's parameters: 2 with `fp16` or `bf16`
    /// enabled, else 4 (the dtype `partitioned_param_swapper.py` swaps in).
    pub model_dtype_bytes: u64,
    pub model_dtype: &'static str,
    pub sub_group_size: u64,
    /// `stage3_max_reuse_distance` (elements).
    pub max_reuse_distance: u64,
    pub optimizer_type: Option<String>,
    /// `checkpoint.writer.type` upper-cased, when there is a writer block
    /// (`FAST`, its default, writes checkpoints through aio: FastPersist).
    pub checkpoint_writer: Option<String>,
    /// Things DeepSpeed accepts but does not do as written (ignored keys,
    /// NVMe offload below stage 3).
    pub notes: Vec<String>,
}

/// The model's size, as far as the user gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    /// `--model-params`: all parameters.
    pub params: Option<u64>,
    /// `--largest-param`: elements of the largest single parameter.
    pub largest: Option<u64>,
    /// `--world-size`: data-parallel ranks on this machine.
    pub world_size: u64,
    /// `--nodes`: machines with `world_size` ranks each.
    pub nodes: u64,
}

impl Model {
    /// Ranks the parameters are partitioned over (ZeRO-3's data-parallel group).
    pub fn dp(&self) -> u64 {
        (self.world_size * self.nodes).max(1)
    }
}

/// One buffer (or file set) the estimate adds up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub what: String,
    pub bytes: u64,
    /// Fixed by the config alone; otherwise it depends on the model and
    /// `bytes` is an estimate (with `--model-params`) or an upper bound.
    pub exact: bool,
    pub formula: String,
}

/// A sum of [`Part`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    pub parts: Vec<Part>,
}

impl Estimate {
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }
    /// The parts the config alone decides.
    pub fn exact(&self) -> u64 {
        self.parts.iter().filter(|p| p.exact).map(|p| p.bytes).sum()
    }
    pub fn is_exact(&self) -> bool {
        self.parts.iter().all(|p| p.exact)
    }
    /// "a (formula) + b (formula)".
    pub fn describe(&self) -> String {
        self.parts
            .iter()
            .map(|p| format!("{} {} = {}", p.what, p.formula, fmt_size_approx(p.bytes)))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// `obj[key]` as DeepSpeed's model reads it: absent, `"auto"` or refused
/// gives the default (a refused value is the `config` section's finding).
fn int_field(obj: &Value, key: &str, default: u64) -> u64 {
    obj.get(key)
        .filter(|v| !lax::is_auto(v))
        .and_then(|v| lax::lax_int(v).ok())
        .and_then(|i| u64::try_from(i).ok())
        .unwrap_or(default)
}

fn bool_field(obj: &Value, key: &str, default: bool) -> bool {
    obj.get(key).filter(|v| !lax::is_auto(v)).and_then(|v| lax::lax_bool(v).ok()).unwrap_or(default)
}

/// A stage-3 key that also has a `stage3_` alias.
fn aliased_int(zero: &Value, name: &str, default: u64) -> u64 {
    let alias = format!("stage3_{name}");
    if zero.get(&alias).is_some() {
        int_field(zero, &alias, default)
    } else {
        int_field(zero, name, default)
    }
}

impl DsConfig {
    /// Reads `path` as DeepSpeed reads it (`read`: JSON, JSON with comments,
    /// else DeepSpeed's hjson reader in `python`) and interprets it. Errors
    /// name the file and what is wrong.
    pub fn load(path: &Path, python: &Path) -> Result<DsConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let r = read::read(path, &text, || super::frontend::read_config(python, path))?;
        if !r.value.is_object() {
            return Err(format!("{} is not a JSON object", path.display()));
        }
        Ok(DsConfig { how: r.how, duplicates: r.duplicates, ..DsConfig::from_value(path, &r.value) })
    }

    pub fn from_value(path: &Path, v: &Value) -> DsConfig {
        let mut notes = Vec::new();
        let null = Value::Null;
        let zero = v.get("zero_optimization").filter(|z| z.is_object()).unwrap_or(&null);
        let stage = zero
            .get("stage")
            .filter(|s| !lax::is_auto(s))
            .map_or(Some(0), |s| lax::lax_int(s).ok().and_then(|i| u64::try_from(i).ok()));

        // get_aio_config reads the block raw; aio_handle converts the values
        // (pybind11), so a value it refuses counts as the default here.
        let aio_block = v.get("aio").filter(|a| a.is_object());
        let mut aio = Aio::default();
        if let Some(a) = aio_block {
            let int = |key: &str, default: usize| {
                a.get(key).and_then(|x| aio_rules::aio_value(key, x).ok()).map_or(default, |i| i.max(0) as usize)
            };
            let flag = |key: &str, default: bool| {
                a.get(key).and_then(|x| aio_rules::aio_value(key, x).ok()).map_or(default, |i| i != 0)
            };
            let d = Aio::default();
            aio.block_size = int("block_size", d.block_size);
            aio.queue_depth = int("queue_depth", d.queue_depth);
            aio.intra_op_parallelism = int("intra_op_parallelism", d.intra_op_parallelism);
            aio.single_submit = flag("single_submit", d.single_submit);
            aio.overlap_events = flag("overlap_events", d.overlap_events);
            aio.use_gds = flag("use_gds", false);
            // aio_config.py reads only "intra_op_parallelism"; "thread_count"
            // is the name older DeepSpeed releases used.
            if a.get("thread_count").is_some() && a.get("intra_op_parallelism").is_none() {
                notes.push(
                    "aio.thread_count is ignored by DeepSpeed 0.19.8 (it reads aio.intra_op_parallelism, so it \
                     uses 1 worker); rename it"
                        .into(),
                );
            }
        }

        let offload = |key: &'static str, count_default: u64| -> Option<NvmeOffload> {
            let o = zero.get(key).filter(|o| o.is_object())?;
            // "NVMe" or "nvme " is refused (the config section says so);
            // the folder it names is still the one to check.
            let device = o.get("device").and_then(Value::as_str).unwrap_or("none");
            if !device.trim().eq_ignore_ascii_case("nvme") {
                return None;
            }
            Some(NvmeOffload {
                block: if key == "offload_param" {
                    "zero_optimization.offload_param"
                } else {
                    "zero_optimization.offload_optimizer"
                },
                nvme_path: o
                    .get("nvme_path")
                    .and_then(Value::as_str)
                    .filter(|p| *p != "auto")
                    .map(|p| PathBuf::from(if p.is_empty() { "." } else { p })),
                buffer_count: int_field(o, "buffer_count", count_default),
                buffer_size: int_field(o, "buffer_size", PARAM_BUFFER_SIZE_DEFAULT),
                pin_memory: bool_field(o, "pin_memory", true),
                max_in_cpu: int_field(o, "max_in_cpu", MAX_IN_CPU_DEFAULT),
                pipeline_read: bool_field(o, "pipeline_read", false),
                pipeline_write: bool_field(o, "pipeline_write", false),
                fast_init: bool_field(o, "fast_init", false),
            })
        };
        let param = offload("offload_param", PARAM_BUFFER_COUNT_DEFAULT);
        let optimizer = offload("offload_optimizer", OPTIMIZER_BUFFER_COUNT_DEFAULT);
        if let Some(s) = stage.filter(|s| *s != 3) {
            // stage_1_and_2.py has no NVMe swapper: device "nvme" there
            // only selects the CPU optimizer (engine.zero_use_cpu_optimizer);
            // offload_param is read by zero.Init, stage 3's only.
            if param.is_some() || optimizer.is_some() {
                notes.push(format!(
                    "zero_optimization.stage is {s}: DeepSpeed swaps to NVMe only with ZeRO stage 3 (below it \
                     offload_optimizer \"nvme\" keeps the optimizer state in CPU memory, and offload_param is \
                     ignored)"
                ));
            }
        }

        let enabled = |k: &str| v.get(k).and_then(|b| b.get("enabled")).is_some_and(lax::truthy);
        let (model_dtype_bytes, model_dtype) = if enabled("bf16") {
            (2, "bf16")
        } else if enabled("fp16") {
            (2, "fp16")
        } else {
            (4, "fp32")
        };
        let optimizer_type = v.get("optimizer").and_then(|o| o.get("type")).and_then(Value::as_str).map(str::to_string);
        // model_checkpointing/config.py: a writer block's type defaults to
        // FAST and is upper-cased; a null type is no writer DeepSpeed builds.
        let checkpoint_writer =
            v.get("checkpoint").and_then(|c| c.get("writer")).filter(|w| w.is_object()).and_then(|w| {
                match w.get("type") {
                    None => Some("FAST".to_string()),
                    Some(Value::String(t)) => Some(t.to_uppercase()),
                    Some(_) => None,
                }
            });
        DsConfig {
            path: path.to_path_buf(),
            raw: v.clone(),
            how: How::Json,
            duplicates: Vec::new(),
            stage,
            aio,
            aio_given: aio_block.is_some(),
            param,
            optimizer,
            model_dtype_bytes,
            model_dtype,
            sub_group_size: int_field(zero, "sub_group_size", SUB_GROUP_SIZE_DEFAULT),
            max_reuse_distance: aliased_int(zero, "max_reuse_distance", MAX_REUSE_DISTANCE_DEFAULT),
            optimizer_type,
            checkpoint_writer,
            notes,
        }
    }

    /// The NVMe offload blocks, parameters first.
    pub fn offloads(&self) -> impl Iterator<Item = &NvmeOffload> {
        [&self.param, &self.optimizer].into_iter().flatten()
    }

    /// Every folder the config gives DeepSpeed's I/O, with the keys that
    /// give it (one folder may serve both blocks).
    pub fn paths(&self) -> Vec<(PathBuf, Vec<String>)> {
        let mut out: Vec<(PathBuf, Vec<String>)> = Vec::new();
        for o in self.offloads() {
            let Some(p) = &o.nvme_path else { continue };
            match out.iter_mut().find(|(q, _)| q == p) {
                Some((_, keys)) => keys.push(o.path_key()),
                None => out.push((p.clone(), vec![o.path_key()])),
            }
        }
        out
    }

    /// Whether anything is swapped to NVMe.
    pub fn swaps(&self) -> bool {
        self.param.is_some() || self.optimizer.is_some()
    }

    /// Whether checkpoints are written by FastPersist (`checkpoint.writer`
    /// type `fast`), which builds its own aio_handle from the `aio` block
    /// at `deepspeed.initialize` (`CheckpointWriterFactory._setup_for_aio`).
    pub fn fast_writer(&self) -> bool {
        self.checkpoint_writer.as_deref() == Some("FAST")
    }

    /// What builds an `aio_handle` from the `aio` block, in words: ZeRO-3's
    /// NVMe swappers and FastPersist's writer (as the config means them,
    /// even where DeepSpeed refuses their spelling). Empty when nothing does.
    pub fn aio_handle_users(&self) -> Vec<&'static str> {
        let mut users = Vec::new();
        if self.swaps() && self.stage == Some(3) {
            users.push("ZeRO-3's NVMe swappers");
        }
        if self.fast_writer() {
            users.push("FastPersist's checkpoint writer (checkpoint.writer type fast)");
        }
        users
    }

    /// Elements a swapped tensor of `numel` elements of `elem` bytes is
    /// padded to: `_io_aligned_numel` in `partitioned_param_swapper.py` and
    /// `optimizer_utils.py` (a multiple of `AIO_ALIGNED_BYTES *
    /// intra_op_parallelism` bytes).
    pub fn aligned_numel(&self, numel: u64, elem: u64) -> u64 {
        let align = (AIO_ALIGNED_BYTES * self.aio.intra_op_parallelism.max(1) as u64 / elem).max(1);
        numel.div_ceil(align) * align
    }

    /// The largest optimizer sub-group one rank swaps (elements):
    /// `stage3.py` builds sub-groups of the rank's partition until each
    /// reaches `sub_group_size` (the last parameter may overshoot it), and
    /// sizes the optimizer's buffers by the largest. Without the model only
    /// `sub_group_size` bounds it.
    pub fn largest_sub_group(&self, model: &Model) -> (u64, bool) {
        match model.params {
            Some(n) => (self.sub_group_size.min(n.div_ceil(model.dp())), true),
            None => (self.sub_group_size, false),
        }
    }

    /// Bytes one rank locks (page-locked host memory) for its swap buffers.
    ///
    /// * `offload_param` (`partitioned_param_swapper.py`, `__init__`): one
    ///   `new_cpu_locked_tensor` of `buffer_count * aligned(buffer_size)`
    ///   elements of the model's dtype; with `use_gds` it is GPU memory
    ///   (`pin_device_tensor`) and locks nothing on the host.
    /// * `offload_param` (`stage3.py` calling `reserve_partitioned_swap_space`):
    ///   a locked buffer of the model dtype for the parameters of the
    ///   largest sub-group, at their full sizes (`ds_numel`).
    /// * `offload_optimizer` (`optimizer_utils.py`, `SwapBufferManager`):
    ///   `buffer_count` locked buffers of aligned(largest sub-group) fp32
    ///   elements (the master weights' dtype).
    ///
    /// deepnvme's pinned manager rounds each buffer up to whole pages. The
    /// `pin_memory` flag does not change these: the NVMe swappers lock their
    /// buffers whatever it says (it governs CPU offload's pinned tensors,
    /// which CUDA pins outside RLIMIT_MEMLOCK).
    pub fn locked(&self, model: &Model, page: u64) -> Estimate {
        let round = |b: u64| b.div_ceil(page) * page;
        let mut parts = Vec::new();
        let e = self.model_dtype_bytes;
        let (sub_group, known) = self.largest_sub_group(model);
        let bound = if known { "estimate" } else { "upper bound: sub_group_size" };
        if let Some(p) = &self.param {
            if !self.aio.use_gds {
                let n = self.aligned_numel(p.buffer_size, e);
                parts.push(Part {
                    what: "parameter swap buffers".into(),
                    bytes: round(p.buffer_count * n * e),
                    exact: true,
                    formula: format!("(buffer_count {} x {n} elements x {e} B {})", p.buffer_count, self.model_dtype),
                });
            }
            // It holds the sub-group's parameters at full size (`ds_numel`),
            // so about the data-parallel size times the rank's share.
            let full = match model.params {
                Some(n) => n.min(sub_group.saturating_mul(model.dp())),
                None => sub_group,
            };
            let n = self.aligned_numel(full, e);
            let bound = if known { "estimate" } else { "bound: sub_group_size, times the data-parallel size" };
            parts.push(Part {
                what: "parameter swap-out buffer".into(),
                bytes: round(n * e),
                exact: false,
                formula: format!("({n} elements x {e} B, the largest sub-group's parameters; {bound})"),
            });
        }
        if let Some(o) = &self.optimizer {
            let n = self.aligned_numel(sub_group, 4);
            parts.push(Part {
                what: "optimizer swap buffers".into(),
                bytes: o.buffer_count * round(n * 4),
                exact: false,
                formula: format!("(buffer_count {} x {n} elements x 4 B fp32; {bound})", o.buffer_count),
            });
        }
        Estimate { parts }
    }

    /// Bytes the swap files take on this machine's `nvme_path`s, for its
    /// `world_size` ranks (each holds its 1/dp share): the parameters in the
    /// model's dtype (`offload_param`), and for `offload_optimizer` 16 B per
    /// parameter, Adam's four fp32 tensors per parameter (parameter,
    /// gradient, momentum, variance: DeepSpeed's own count, in
    /// `offload_config.py`'s `buffer_count` documentation). `None` without
    /// `--model-params`. `which` picks one block's files.
    pub fn swap_files(&self, model: &Model, which: Option<&str>) -> Option<Estimate> {
        let params = model.params?;
        let here = params / model.nodes.max(1);
        let wanted = |block: &str| which.is_none_or(|w| w == block);
        let mut parts = Vec::new();
        if self.param.as_ref().is_some_and(|p| wanted(p.block)) {
            let e = self.model_dtype_bytes;
            parts.push(Part {
                what: "parameter swap files".into(),
                bytes: here * e,
                exact: false,
                formula: format!("({here} parameters on this machine x {e} B {})", self.model_dtype),
            });
        }
        if self.optimizer.as_ref().is_some_and(|o| wanted(o.block)) {
            let adam = self.optimizer_type.as_deref().is_none_or(|t| t.to_ascii_lowercase().contains("adam"));
            parts.push(Part {
                what: "optimizer swap files".into(),
                bytes: here * 16,
                exact: false,
                formula: format!(
                    "({here} parameters on this machine x 4 fp32 tensors x 4 B{})",
                    if adam { "" } else { "; Adam's count, assumed for this optimizer" }
                ),
            });
        }
        Some(Estimate { parts })
    }

    /// Requests in flight on the device at once, per handle worker and in
    /// all: every swapper's handles (`partitioned_param_swapper.py` makes a
    /// read and a write handle; the optimizer swapper one, the pipelined one
    /// two), each with `intra_op_parallelism` workers of `queue_depth`.
    pub fn handles(&self) -> usize {
        let param = if self.param.is_some() { 2 } else { 0 };
        let optimizer = match &self.optimizer {
            Some(o) if o.pipeline() => 2,
            Some(_) => 1,
            None => 0,
        };
        param + optimizer
    }
}

#[cfg(test)]
mod tests;
