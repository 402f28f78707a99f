//! DeepSpeed 0.19.8's `zero_optimization` models as data: each field's
//! name, alias, type, bounds and deprecation (`DeepSpeedZeroConfig` and its
//! nested models), and the keys DeepSpeed removed with its refusal text.
//! `ds_rules.rs` walks a config against it.

use super::lax::{Bounds, GE0, GT0, NONE, OPEN_UNIT, UNIT};

#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Bool,
    Int(Bounds),
    Float(Bounds),
    StrEnum(&'static [&'static str]),
    IntEnum(&'static [i64]),
    Path,
    Str,
    StrOrInt,
    StrList,
    Model(&'static Model),
}

#[derive(Debug)]
pub(super) struct Field {
    pub(super) name: &'static str,
    pub(super) alias: Option<&'static str>,
    pub(super) kind: Kind,
    pub(super) optional: bool,
    /// A deprecated field that sets this one (DeepSpeed asserts both are
    /// not given together).
    pub(super) replaced_by: Option<&'static str>,
}

const fn f(name: &'static str, kind: Kind) -> Field {
    Field { name, alias: None, kind, optional: false, replaced_by: None }
}
const fn opt(name: &'static str, kind: Kind) -> Field {
    Field { name, alias: None, kind, optional: true, replaced_by: None }
}
const fn aliased(name: &'static str, alias: &'static str, kind: Kind) -> Field {
    Field { name, alias: Some(alias), kind, optional: false, replaced_by: None }
}
const fn deprecated(name: &'static str, replaced_by: &'static str, optional: bool) -> Field {
    Field { name, alias: None, kind: Kind::Bool, optional, replaced_by: Some(replaced_by) }
}

#[derive(Debug)]
pub(super) struct Model {
    /// DeepSpeed's class name, as pydantic's messages give it.
    pub(super) class: &'static str,
    pub(super) fields: &'static [Field],
}

pub(super) const DEVICES: &[&str] = &["none", "cpu", "nvme"];

pub(super) static OFFLOAD_PARAM: Model = Model {
    class: "DeepSpeedZeroOffloadParamConfig",
    fields: &[
        f("device", Kind::StrEnum(DEVICES)),
        opt("nvme_path", Kind::Path),
        f("buffer_count", Kind::Int(GE0)),
        f("buffer_size", Kind::Int(GE0)),
        f("max_in_cpu", Kind::Int(GE0)),
        f("pin_memory", Kind::Bool),
    ],
};

pub(super) static OFFLOAD_OPTIMIZER: Model = Model {
    class: "DeepSpeedZeroOffloadOptimizerConfig",
    fields: &[
        f("device", Kind::StrEnum(DEVICES)),
        opt("nvme_path", Kind::Path),
        f("buffer_count", Kind::Int(GE0)),
        f("pin_memory", Kind::Bool),
        f("pipeline_read", Kind::Bool),
        f("pipeline_write", Kind::Bool),
        f("fast_init", Kind::Bool),
        f("ratio", Kind::Float(UNIT)),
        f("super_offload", Kind::Bool),
        f("cpuadam_cores_perc", Kind::Float(UNIT)),
    ],
};

pub(super) static ZENFLOW: Model = Model {
    class: "ZenFlowConfig",
    fields: &[
        f("topk_ratio", Kind::Float(OPEN_UNIT)),
        f("select_strategy", Kind::Str),
        f("select_interval", Kind::StrOrInt),
        f("update_interval", Kind::StrOrInt),
        f("overlap_step", Kind::Bool),
        f("offload", Kind::Bool),
        f("auto_ratio", Kind::Float(UNIT)),
        f("full_warm_up_rounds", Kind::Int(NONE)),
        f("pt_reserved_cores_perc", Kind::Float(UNIT)),
        opt("steps_per_epoch", Kind::Int(NONE)),
    ],
};

pub(super) static LEAF_MODULE: Model = Model {
    class: "DeepSpeedZeroLeafModuleConfig",
    fields: &[f("classes", Kind::StrList), f("names", Kind::StrList), f("name_suffixes", Kind::StrList)],
};

pub(super) static ZERO: Model = Model {
    class: "DeepSpeedZeroConfig",
    fields: &[
        f("stage", Kind::IntEnum(&[0, 1, 2, 3])),
        f("contiguous_gradients", Kind::Bool),
        f("reduce_scatter", Kind::Bool),
        f("reduce_bucket_size", Kind::Int(GT0)),
        f("use_multi_rank_bucket_allreduce", Kind::Bool),
        f("allgather_partitions", Kind::Bool),
        f("allgather_bucket_size", Kind::Int(GE0)),
        opt("overlap_comm", Kind::Bool),
        f("compute_grad_norm", Kind::Bool),
        f("load_from_fp32_weights", Kind::Bool),
        f("elastic_checkpoint", Kind::Bool),
        opt("offload_param", Kind::Model(&OFFLOAD_PARAM)),
        opt("offload_optimizer", Kind::Model(&OFFLOAD_OPTIMIZER)),
        opt("zenflow", Kind::Model(&ZENFLOW)),
        f("sub_group_size", Kind::Int(GE0)),
        deprecated("cpu_offload_param", "offload_param", true),
        opt("cpu_offload_use_pin_memory", Kind::Bool),
        deprecated("cpu_offload", "offload_optimizer", true),
        aliased("prefetch_bucket_size", "stage3_prefetch_bucket_size", Kind::Int(GE0)),
        aliased("param_persistence_threshold", "stage3_param_persistence_threshold", Kind::Int(GE0)),
        aliased("model_persistence_threshold", "stage3_model_persistence_threshold", Kind::Int(GE0)),
        aliased("max_live_parameters", "stage3_max_live_parameters", Kind::Int(GE0)),
        aliased("max_reuse_distance", "stage3_max_reuse_distance", Kind::Int(GE0)),
        aliased("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save", Kind::Bool),
        aliased("module_granularity_threshold", "stage3_module_granularity_threshold", Kind::Int(NONE)),
        aliased("use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params", Kind::Bool),
        aliased("allgather_sequential", "stage3_allgather_sequential", Kind::Bool),
        deprecated("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save", false),
        f("ignore_unused_parameters", Kind::Bool),
        f("legacy_stage1", Kind::Bool),
        f("round_robin_gradients", Kind::Bool),
        f("parameter_alignment", Kind::Bool),
        f("zero_hpz_partition_size", Kind::Int(GE0)),
        f("zero_quantized_weights", Kind::Bool),
        f("zero_quantized_nontrainable_weights", Kind::Bool),
        f("zero_quantized_gradients", Kind::Bool),
        f("memory_efficient_linear", Kind::Bool),
        f("pipeline_loading_checkpoint", Kind::Bool),
        f("override_module_apply", Kind::Bool),
        f("log_trace_cache_warnings", Kind::Bool),
        f("enable_sanity_checks", Kind::Bool),
        f("save_muon_momentum_buffer_in_memory", Kind::Bool),
        f("leaf_module", Kind::Model(&LEAF_MODULE)),
    ],
};

/// DeepSpeed's message for a removed feature, with the issue it links.
macro_rules! removed {
    ($msg:literal) => {
        concat!($msg, " See https://github.com/deepspeedai/DeepSpeed/issues/8489.")
    };
}

/// Top-level keys DeepSpeed 0.19.8 removed, in the order `DeepSpeedConfig`
/// checks them (`_REMOVED_TOP_LEVEL_CONFIG_KEYS`, `_reject_removed_config_keys`):
/// it refuses the first it finds before reading anything else, with this text.
pub(super) const REMOVED_TOP_KEYS: &[(&str, &str)] = &[
    (
        "nebula",
        removed!(
            "Nebula checkpointing has been removed. A leftover 'nebula' block would be ignored and checkpoints \
             would silently fall back to local torch.save."
        ),
    ),
    (
        "compression_training",
        removed!(
            "The DeepSpeed compression library has been removed. A leftover 'compression_training' block would be \
             ignored and the model would train unquantized."
        ),
    ),
    (
        "amp",
        removed!(
            "NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' \
             instead."
        ),
    ),
    ("quantize_training", removed!("Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed.")),
    (
        "sparse_gradients",
        removed!(
            "Sparse compression of dense torch.nn.Embedding gradients has been removed. A leftover \
             'sparse_gradients' flag would be ignored and those gradients would be reduced dense. Gradients from \
             an embedding constructed with sparse=True are still reduced sparsely and need no config flag."
        ),
    ),
    (
        "eigenvalue",
        removed!(
            "Eigenvalue-based Mixture-of-Quantization (MoQ) has been removed; the standalone 'eigenvalue' \
             configuration block is no longer supported."
        ),
    ),
    (
        "sparse_attention",
        removed!(
            "DeepSpeed Sparse Attention has been removed; the 'sparse_attention' configuration block is no longer \
             supported."
        ),
    ),
    // DeepSpeed's one message without the link.
    (
        "elasticity",
        "Elastic training has been removed; the 'elasticity' configuration block is no longer supported. Set \
         train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps directly. ",
    ),
    (
        "graph_harvesting",
        removed!(
            "Graph harvesting has been removed; the 'graph_harvesting' configuration option is no longer supported."
        ),
    ),
    (
        "curriculum_learning",
        removed!(
            "Legacy top-level 'curriculum_learning' has been removed. Use \
             'data_efficiency.data_sampling.curriculum_learning' instead."
        ),
    ),
    (
        "progressive_layer_drop",
        removed!(
            "Progressive Layer Dropping has been removed; the 'progressive_layer_drop' configuration block is no \
             longer supported."
        ),
    ),
];

/// `zero_optimization` keys DeepSpeed 0.19.8 removed, checked right after
/// the top-level ones (`_REMOVED_ZERO_CONFIG_KEYS`).
pub(super) const REMOVED_ZERO_KEYS: &[(&str, &str)] = &[
    (
        "mics_shard_size",
        removed!("MiCS ZeRO-3 sharding has been removed; 'zero_optimization.mics_shard_size' is no longer supported."),
    ),
    (
        "mics_hierarchical_params_gather",
        removed!(
            "MiCS ZeRO-3 sharding has been removed; 'zero_optimization.mics_hierarchical_params_gather' is no \
             longer supported."
        ),
    ),
    (
        "zeropp_loco_param",
        removed!(
            "LoCo-Zero++ has been removed; 'zero_optimization.zeropp_loco_param' is no longer supported. Remove \
             this key to use standard ZeRO++ quantized gradients without LoCo error feedback."
        ),
    ),
];

