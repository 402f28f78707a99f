//! The knobs of a DeepNVMe handle, with DeepSpeed's defaults and meanings.

use crate::engine::EngineKind;
use crate::error::{Error, Result};
use crate::knobs;


/// `aio_handle(block_size, queue_depth, single_submit, overlap_events,
/// intra_op_parallelism)` and how the bytes are moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleConfig {
    /// Bytes per I/O request.
    pub block_size: usize,
    /// Requests in flight per worker.
    pub queue_depth: usize,
    /// One submit syscall per request instead of one per batch.
    pub single_submit: bool,
    /// Keep the queue topped up instead of submit-batch-then-wait.
    pub overlap_events: bool,
    /// Worker threads; each op is split into this many slices.
    pub intra_op_parallelism: usize,
    /// Forces an engine for this handle; `None` takes the process default
    /// (`DEEPNVME_ENGINE`, else io_uring when it works, else psync).
    pub engine: Option<EngineKind>,
}

impl Default for HandleConfig {
    fn default() -> Self {
        HandleConfig {
            block_size: knobs::DEFAULT_BLOCK_SIZE,
            queue_depth: knobs::DEFAULT_QUEUE_DEPTH,
            single_submit: knobs::DEFAULT_SINGLE_SUBMIT,
            overlap_events: knobs::DEFAULT_OVERLAP_EVENTS,
            intra_op_parallelism: knobs::DEFAULT_INTRA_OP_PARALLELISM,
            engine: None,
        }
    }
}

/// DeepSpeed's handle knobs as `aio_handle(...)` and `gds_handle(...)`
/// take them (C `int`s, unchecked), passed whole from every front end (the
/// cxx bridge, the pyo3 module) to `deepspeed::Handle` and the one-shot
/// transfers; [`DeepSpeedKnobs::config`] checks them into a [`HandleConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeepSpeedKnobs {
    /// `block_size`.
    pub block_size: i64,
    /// `queue_depth`.
    pub queue_depth: i64,
    /// `single_submit`.
    pub single_submit: bool,
    /// `overlap_events`.
    pub overlap_events: bool,
    /// `intra_op_parallelism` (1 for the one-shot `aio_read`/`aio_write`).
    pub intra_op_parallelism: i64,
    /// A `gds_handle` (CUDA tensors go through cuFile) rather than an `aio_handle`.
    pub use_gds: bool,
}

impl Default for DeepSpeedKnobs {
    /// `aio_handle()`'s defaults.
    fn default() -> Self {
        DeepSpeedKnobs {
            block_size: knobs::DEFAULT_BLOCK_SIZE as i64,
            queue_depth: knobs::DEFAULT_QUEUE_DEPTH as i64,
            single_submit: knobs::DEFAULT_SINGLE_SUBMIT,
            overlap_events: knobs::DEFAULT_OVERLAP_EVENTS,
            intra_op_parallelism: knobs::DEFAULT_INTRA_OP_PARALLELISM as i64,
            use_gds: false,
        }
    }
}

impl DeepSpeedKnobs {
    /// The handle's config, refusing values that cannot work (not positive,
    /// above a limit) as an `InvalidArgument` now rather than a misbehaving
    /// handle later.
    pub fn config(&self) -> Result<HandleConfig> {
        let positive = |name: &str, v: i64| -> Result<usize> {
            if v <= 0 {
                Err(Error::InvalidArgument(format!("{name} must be positive, got {v}")))
            } else {
                Ok(v as usize)
            }
        };
        let cfg = HandleConfig {
            block_size: positive("block_size", self.block_size)?,
            queue_depth: positive("queue_depth", self.queue_depth)?,
            single_submit: self.single_submit,
            overlap_events: self.overlap_events,
            intra_op_parallelism: positive("intra_op_parallelism", self.intra_op_parallelism)?,
            engine: None,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl HandleConfig {
    /// Refuses knobs that cannot work (zero, above a limit), naming the knob.
    pub fn validate(&self) -> Result<()> {
        if self.block_size == 0 || self.queue_depth == 0 || self.intra_op_parallelism == 0 {
            return Err(Error::InvalidArgument(format!(
                "block_size, queue_depth and intra_op_parallelism must be positive: {self:?}"
            )));
        }
        if self.queue_depth > knobs::MAX_QUEUE_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "queue_depth {} is above io_uring's limit of {}",
                self.queue_depth,
                knobs::MAX_QUEUE_DEPTH
            )));
        }
        if self.intra_op_parallelism > knobs::MAX_INTRA_OP_PARALLELISM {
            return Err(Error::InvalidArgument(format!(
                "intra_op_parallelism {} is more threads than is sensible (max {})",
                self.intra_op_parallelism,
                knobs::MAX_INTRA_OP_PARALLELISM
            )));
        }
        Ok(())
    }

    /// `get_alignment()`: `intra_op_parallelism * 512`, as DeepSpeed reports it.
    pub fn alignment(&self) -> usize {
        self.intra_op_parallelism * knobs::DEEPSPEED_ALIGNMENT_UNIT
    }

    /// The knobs an engine run needs.
    pub fn aio_params(&self) -> crate::engine::AioParams {
        crate::engine::AioParams {
            block_size: self.block_size,
            queue_depth: self.queue_depth,
            single_submit: self.single_submit,
            overlap_events: self.overlap_events,
        }
    }
}

/// Fails naming every malformed `DEEPNVME_*` variable: a handle, a locked
/// tensor or a one-shot transfer is not made with settings the user did
/// not ask for.
pub(crate) fn check_settings() -> Result<()> {
    match knobs::malformed_settings() {
        Some(why) => Err(Error::InvalidArgument(why)),
        None => Ok(()),
    }
}
