//! What the handle runs: an op's work, cut into slices that workers run, and
//! its completion, which `wait()` finishes. CPU ops ([`super::CpuOp`]) and
//! GPUDirect ops (`crate::gds::op`) both take this shape, so one queue and
//! one `wait()` serve both, in submission order.

use std::sync::Arc;

use crate::engine::{Engine, StreamRun};
use crate::error::{Error, Result, TransferError};
use crate::file::FileIdentity;

/// The part of an op that workers run, one slice per job. CPU ops cut their
/// bytes into per-worker slices; a GPUDirect op is one slice that drives
/// cuFile (which has its own threads).
pub(crate) trait OpWork: Send + Sync {
    fn slice_count(&self) -> usize;
    /// Runs slice `index` on the worker's `engine`.
    fn run_slice(&self, index: usize, engine: &mut dyn Engine) -> Result<()>;
    /// Describes slice `index` for an error when it could not be run at all.
    fn slice_error(&self, index: usize, detail: String) -> Error;
    /// Slice `index` as one run of a worker ring's stream, when it can be
    /// one, with the file bytes it touches (see `handle.rs`, `QueuedRuns`).
    fn stream_run(&self, _index: usize) -> Option<(StreamRun, Footprint)> {
        None
    }
    /// The error of a streamed slice, as `run_slice` would have reported it.
    fn stream_error(&self, e: TransferError) -> Error {
        Error::from(e)
    }
}

/// The bytes of one file a streamed slice reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub file: FileIdentity,
    pub start: u64,
    pub end: u64,
    pub writes: bool,
}

impl Footprint {
    /// Whether the two must not be in flight together: they share bytes of
    /// one file and one of them writes them (a read after a write, or two
    /// writes, must see the order they were submitted in).
    pub fn conflicts_with(&self, other: &Footprint) -> bool {
        self.file == other.file && self.start < other.end && other.start < self.end && (self.writes || other.writes)
    }
}

/// How an op completes in `wait()` once all its slices ran: report the
/// first slice error, or validate and copy a bounced read back. Dropping it
/// releases the op's files and buffers.
pub(crate) trait OpCompletion: Send {
    /// Called once. The completion is dropped afterwards, outside the
    /// handle's locks: dropping it may release a torch tensor, which can
    /// take the GIL.
    fn finish(&mut self, outcome: Result<()>) -> Result<()>;
    /// The caller is now in a call on the op (a blocking call, or `wait()`):
    /// the op may copy into the caller's memory as its blocks complete.
    fn caller_entered(&self) {}
    /// The caller leaves the call with the op still in flight (an
    /// interrupted wait): from now on nothing may touch its memory.
    fn caller_left(&self) {}
}

/// What an op moves, for the handle's statistics.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpMeta {
    /// `None` for work that moves no file bytes of its own.
    pub direction: Option<crate::Direction>,
    pub bytes: u64,
    /// Bytes copied through a bounce buffer.
    pub bounced_bytes: u64,
    /// A blocking op of at most [`crate::knobs::INLINE_MAX_BYTES`] may run
    /// on the calling thread when nothing else is pending (CPU ops only:
    /// the hand-off to a worker and back costs more than a small transfer).
    pub may_run_inline: bool,
}

/// An op ready to be dispatched.
pub(crate) struct PreparedOp {
    pub work: Arc<dyn OpWork>,
    pub completion: Box<dyn OpCompletion>,
    pub meta: OpMeta,
}
