//! What a handle does with CUDA buffers: bounce them (an aio handle), or
//! move them through cuFile (a GDS handle).

use std::sync::Arc;

use crate::gds::GdsDriverGuard;

/// The GPUDirect half of a GDS handle.
pub(super) struct GdsHalf {
    pub(super) driver: Arc<GdsDriverGuard>,
    /// DeepSpeed's intra_op_parallelism, applied to cuFile transfers.
    pub(super) parallelism: usize,
    pub(super) block_size: usize,
}

/// What a handle does with CUDA buffers.
pub(super) enum DeviceRoute {
    /// An aio handle: CUDA buffers bounce through host memory.
    Bounce,
    /// A GDS handle: contiguous CUDA buffers go through cuFile.
    Gds(GdsHalf),
    /// A GDS handle made without GPUDirect Storage ([`knobs::GDS_CPU_ONLY_ENV`]):
    /// CUDA buffers are refused, naming why GDS is unavailable.
    GdsUnavailable(String),
}

