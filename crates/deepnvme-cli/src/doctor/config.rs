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

use crate::args::fmt_size_approx;

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

/// `deepspeed/runtime/zero/config.py`: `sub_group_size` (1e9 elements).
pub const SUB_GROUP_SIZE_DEFAULT: u64 = 1_000_000_000;

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

/// One `offload_param` / `offload_optimizer` block with `device: nvme`.
#[derive(Clone, Debug, PartialEq)]
pub struct NvmeOffload {
    pub nvme_path: Option<PathBuf>,
    pub buffer_count: u64,
    /// Elements per buffer (`offload_param` only).
    pub buffer_size: u64,
    pub pin_memory: bool,
    /// `pipeline_read` or `pipeline_write` (`offload_optimizer` only): the
    /// pipelined swapper, with a second handle.
    pub pipeline: bool,
}

/// What the doctor needs of a DeepSpeed config.
#[derive(Clone, Debug)]
pub struct DsConfig {
    pub path: PathBuf,
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
    pub optimizer_type: Option<String>,
    /// Things in the config DeepSpeed will not do as written.
    pub notes: Vec<String>,
}

/// The model's size, when the user gives it (`--model-params`, `--world-size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    pub params: u64,
    pub world_size: u64,
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

/// A number DeepSpeed accepts: an integer, or a float with no fraction
/// (configs write `1e8`). `"auto"` (the HF Trainer's placeholder) is `None`.
fn whole(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => {
            n.as_u64().or_else(|| n.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
        }
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64),
        _ => None,
    }
}

fn flag(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// `obj[key]` as a number, `default` when absent; a value that is present
/// but not a number is noted and replaced by the default.
fn number(obj: &Value, key: &str, default: u64, where_: &str, notes: &mut Vec<String>) -> u64 {
    match obj.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => whole(v).unwrap_or_else(|| {
            notes.push(format!("{where_}.{key} = {v} is not a whole number; DeepSpeed's default {default} assumed"));
            default
        }),
    }
}

fn boolean(obj: &Value, key: &str, default: bool, where_: &str, notes: &mut Vec<String>) -> bool {
    match obj.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => flag(v).unwrap_or_else(|| {
            notes.push(format!("{where_}.{key} = {v} is not true or false; DeepSpeed's default {default} assumed"));
            default
        }),
    }
}

impl DsConfig {
    /// Reads and interprets `path`. Errors name the file and what is wrong.
    pub fn load(path: &Path) -> Result<DsConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
        if !v.is_object() {
            return Err(format!("{} is not a JSON object", path.display()));
        }
        Ok(DsConfig::from_value(path, &v))
    }

    pub fn from_value(path: &Path, v: &Value) -> DsConfig {
        let mut notes = Vec::new();
        let null = Value::Null;
        let zero = v.get("zero_optimization").unwrap_or(&null);
        let stage = zero.get("stage").and_then(whole);

        let aio_block = v.get("aio").filter(|a| a.is_object());
        let mut aio = Aio::default();
        if let Some(a) = aio_block {
            let d = Aio::default();
            aio.block_size = number(a, "block_size", d.block_size as u64, "aio", &mut notes) as usize;
            aio.queue_depth = number(a, "queue_depth", d.queue_depth as u64, "aio", &mut notes) as usize;
            // aio_config.py reads only "intra_op_parallelism"; "thread_count"
            // is the name older DeepSpeed releases used.
            if a.get("thread_count").is_some() && a.get("intra_op_parallelism").is_none() {
                notes.push(
                    "aio.thread_count is ignored by DeepSpeed 0.19.8 (it reads aio.intra_op_parallelism); \
                     rename it"
                        .into(),
                );
            }
            aio.intra_op_parallelism =
                number(a, "intra_op_parallelism", d.intra_op_parallelism as u64, "aio", &mut notes) as usize;
            aio.single_submit = boolean(a, "single_submit", d.single_submit, "aio", &mut notes);
            aio.overlap_events = boolean(a, "overlap_events", d.overlap_events, "aio", &mut notes);
            aio.use_gds = boolean(a, "use_gds", false, "aio", &mut notes);
        }

        let offload = |key: &str, count_default: u64, notes: &mut Vec<String>| -> Option<NvmeOffload> {
            let o = zero.get(key)?;
            let device = o.get("device").and_then(Value::as_str).unwrap_or("none");
            if !device.eq_ignore_ascii_case("nvme") {
                return None;
            }
            let where_ = format!("zero_optimization.{key}");
            Some(NvmeOffload {
                nvme_path: o.get("nvme_path").and_then(Value::as_str).map(PathBuf::from),
                buffer_count: number(o, "buffer_count", count_default, &where_, notes),
                buffer_size: number(o, "buffer_size", PARAM_BUFFER_SIZE_DEFAULT, &where_, notes),
                pin_memory: boolean(o, "pin_memory", true, &where_, notes),
                pipeline: boolean(o, "pipeline_read", false, &where_, notes)
                    || boolean(o, "pipeline_write", false, &where_, notes),
            })
        };
        let param = offload("offload_param", PARAM_BUFFER_COUNT_DEFAULT, &mut notes);
        let optimizer = offload("offload_optimizer", OPTIMIZER_BUFFER_COUNT_DEFAULT, &mut notes);
        if (param.is_some() || optimizer.is_some()) && stage.is_some_and(|s| s != 3) {
            // stage_1_and_2.py has no NVMe swapper: device "nvme" there
            // only selects the CPU optimizer (engine.zero_use_cpu_optimizer).
            notes.push(format!(
                "zero_optimization.stage is {}: DeepSpeed swaps to NVMe only with ZeRO stage 3",
                stage.unwrap_or(0)
            ));
        }
        for (name, o) in [("offload_param", &param), ("offload_optimizer", &optimizer)] {
            if o.as_ref().is_some_and(|o| o.nvme_path.is_none()) {
                notes.push(format!("zero_optimization.{name} has device nvme but no nvme_path; DeepSpeed fails"));
            }
        }

        let enabled = |k: &str| v.get(k).and_then(|b| b.get("enabled")).and_then(flag).unwrap_or(false);
        let (model_dtype_bytes, model_dtype) = if enabled("bf16") {
            (2, "bf16")
        } else if enabled("fp16") {
            (2, "fp16")
        } else {
            (4, "fp32")
        };
        let sub_group_size = number(zero, "sub_group_size", SUB_GROUP_SIZE_DEFAULT, "zero_optimization", &mut notes);
        let optimizer_type = v.get("optimizer").and_then(|o| o.get("type")).and_then(Value::as_str).map(str::to_string);
        DsConfig {
            path: path.to_path_buf(),
            stage,
            aio,
            aio_given: aio_block.is_some(),
            param,
            optimizer,
            model_dtype_bytes,
            model_dtype,
            sub_group_size,
            optimizer_type,
            notes,
        }
    }

    /// The directory the swap files go to: `offload_param`'s `nvme_path`,
    /// else `offload_optimizer`'s.
    pub fn nvme_path(&self) -> Option<&Path> {
        [&self.param, &self.optimizer].into_iter().flatten().find_map(|o| o.nvme_path.as_deref())
    }

    /// Whether anything is swapped to NVMe.
    pub fn swaps(&self) -> bool {
        self.param.is_some() || self.optimizer.is_some()
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
    fn largest_sub_group(&self, model: Option<Model>) -> (u64, bool) {
        match model {
            Some(m) => (self.sub_group_size.min(m.params.div_ceil(m.world_size.max(1))), true),
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
    pub fn locked(&self, model: Option<Model>, page: u64) -> Estimate {
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
            // so about world_size times the rank's share of the sub-group.
            let full = match model {
                Some(m) => m.params.min(sub_group.saturating_mul(m.world_size.max(1))),
                None => sub_group,
            };
            let n = self.aligned_numel(full, e);
            let bound = if known { "estimate" } else { "bound: sub_group_size, times the world size" };
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

    /// Bytes the swap files take on `nvme_path`, for all `world_size` ranks
    /// (one machine assumed): the model's parameters in its dtype
    /// (`offload_param`), and for `offload_optimizer` 16 B per parameter,
    /// Adam's four fp32 tensors per parameter (parameter, gradient,
    /// momentum, variance: DeepSpeed's own count, in `offload_config.py`'s
    /// `buffer_count` documentation). Only known with `--model-params`.
    pub fn swap_files(&self, model: Model) -> Estimate {
        let mut parts = Vec::new();
        if self.param.is_some() {
            let e = self.model_dtype_bytes;
            parts.push(Part {
                what: "parameter swap files".into(),
                bytes: model.params * e,
                exact: false,
                formula: format!("({} parameters x {e} B {})", model.params, self.model_dtype),
            });
        }
        if self.optimizer.is_some() {
            let adam = self.optimizer_type.as_deref().is_none_or(|t| t.to_ascii_lowercase().contains("adam"));
            parts.push(Part {
                what: "optimizer swap files".into(),
                bytes: model.params * 16,
                exact: false,
                formula: format!(
                    "({} parameters x 4 fp32 tensors x 4 B{})",
                    model.params,
                    if adam { "" } else { "; Adam's count, assumed for this optimizer" }
                ),
            });
        }
        Estimate { parts }
    }

    /// Requests in flight on the device at once, per handle worker and in
    /// all: every swapper's handles (`partitioned_param_swapper.py` makes a
    /// read and a write handle; the optimizer swapper one, the pipelined one
    /// two), each with `intra_op_parallelism` workers of `queue_depth`.
    pub fn handles(&self) -> usize {
        let param = if self.param.is_some() { 2 } else { 0 };
        let optimizer = match &self.optimizer {
            Some(o) if o.pipeline => 2,
            Some(_) => 1,
            None => 0,
        };
        param + optimizer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Value) -> DsConfig {
        DsConfig::from_value(Path::new("ds.json"), &v)
    }

    #[test]
    fn defaults_are_deepspeeds() {
        let c =
            cfg(json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}));
        assert!(!c.aio_given);
        assert_eq!(c.aio, Aio::default());
        assert_eq!((c.aio.queue_depth, c.aio.overlap_events), (8, true));
        let p = c.param.as_ref().unwrap();
        assert_eq!((p.buffer_count, p.buffer_size, p.pin_memory), (5, 100_000_000, true));
        assert!(c.optimizer.is_none());
        assert_eq!(c.nvme_path(), Some(Path::new("/nvme")));
        assert_eq!((c.model_dtype_bytes, c.sub_group_size), (4, 1_000_000_000));
        assert!(c.notes.is_empty(), "{:?}", c.notes);
    }

    #[test]
    fn locked_bytes_follow_deepspeeds_swappers() {
        let c = cfg(json!({
            "bf16": {"enabled": true},
            "zero_optimization": {"stage": 3, "sub_group_size": 1e6,
                "offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 3, "buffer_size": 1e6},
                "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 4}},
            "aio": {"intra_op_parallelism": 2, "queue_depth": 16}
        }));
        assert_eq!(c.model_dtype_bytes, 2);
        // 2048-byte alignment: 1024 bf16 elements; 1e6 rounds up to 1000448.
        assert_eq!(c.aligned_numel(1_000_000, 2), 1_000_448);
        let l = c.locked(None, 4096);
        assert_eq!(l.parts.len(), 3);
        assert_eq!(l.parts[0].bytes, (3 * 1_000_448 * 2u64).div_ceil(4096) * 4096);
        assert!(l.parts[0].exact && !l.parts[1].exact && !l.parts[2].exact);
        // fp32: 512-element alignment; 1e6 rounds up to 1000448 too.
        assert_eq!(l.parts[2].bytes, 4 * (1_000_448u64 * 4).div_ceil(4096) * 4096);
        assert_eq!(l.exact(), l.parts[0].bytes);
        // A small model bounds the sub-group below sub_group_size.
        let m = Model { params: 10_000, world_size: 2 };
        let small = c.locked(Some(m), 4096);
        // The rank's partition is 5000 elements, padded to 5120 fp32: 20 KiB each.
        assert_eq!(small.parts[2].bytes, 4 * 20480);
        // The swap-out buffer holds the whole model here (10000 < 2 x 1e6), padded to 10240 bf16.
        assert_eq!(small.parts[1].bytes, 20480);
        assert_eq!(c.handles(), 3);
        // GDS puts the parameter buffers on the GPU.
        let g = cfg(json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/n"}},
                           "aio": {"use_gds": true}}));
        assert!(g.locked(None, 4096).parts.iter().all(|p| !p.exact));
    }

    #[test]
    fn swap_files_use_adams_sixteen_bytes() {
        let c = cfg(json!({"fp16": {"enabled": true}, "zero_optimization": {"stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": "/n"},
            "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}}}));
        let s = c.swap_files(Model { params: 1000, world_size: 1 });
        assert_eq!(s.total(), 1000 * 2 + 1000 * 16);
    }

    #[test]
    fn notes_name_what_deepspeed_ignores() {
        let c = cfg(
            json!({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "buffer_count": "auto"}},
                           "aio": {"thread_count": 4}}),
        );
        let notes = c.notes.join("\n");
        assert!(notes.contains("thread_count is ignored"), "{notes}");
        assert!(notes.contains("only with ZeRO stage 3"), "{notes}");
        assert!(notes.contains("no nvme_path"), "{notes}");
        assert!(notes.contains("buffer_count = \"auto\""), "{notes}");
        assert_eq!(c.optimizer.as_ref().unwrap().buffer_count, 4);
        assert_eq!(c.aio.intra_op_parallelism, 1);
        // "cpu" offload swaps nothing.
        let cpu = cfg(json!({"zero_optimization": {"offload_param": {"device": "cpu"}}}));
        assert!(!cpu.swaps());
    }
}
