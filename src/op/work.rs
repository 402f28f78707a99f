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

/// What a streamed slice touches: bytes of one file, and the memory they
/// move to or from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub file: FileIdentity,
    pub start: u64,
    pub end: u64,
    /// The memory's address range `[memory.0, memory.1)`.
    pub memory: (usize, usize),
    pub writes: bool,
}

impl Footprint {
    /// Whether the two must not be in flight together, because the later
    /// one must see what the earlier one did (or must not be seen by it):
    /// * they share bytes of one file and one of them writes the file (a
    ///   read after a write, two writes). Block devices are compared as one:
    ///   a partition and its disk, or a device-mapper volume and what it
    ///   maps, share bytes under other names and offsets;
    /// * they share memory and one of them reads into it (a write from a
    ///   buffer after a read into it, two reads into it).
    pub fn conflicts_with(&self, other: &Footprint) -> bool {
        let either_writes_file = self.writes || other.writes;
        let same_file_bytes = if self.file.block_device && other.file.block_device {
            true
        } else {
            self.file == other.file && self.start < other.end && other.start < self.end
        };
        let either_fills_memory = !self.writes || !other.writes;
        let same_memory = self.memory.0 < other.memory.1 && other.memory.0 < self.memory.1;
        (same_file_bytes && either_writes_file) || (same_memory && either_fills_memory)
    }
}

/// What an op touches, for its handle's ordering of ops (see `handle.rs`):
/// the caller's memory it fills or reads, and the file bytes it writes or
/// reads. Ops take effect in submission order wherever two of them share
/// memory or file bytes and one of them writes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpFootprint {
    /// The caller's bytes `[memory.0, memory.1)`.
    pub memory: (usize, usize),
    /// A read: the op writes the caller's memory.
    pub fills_memory: bool,
    /// The file and its bytes `[start, end)`, when known.
    pub file: Option<(FileIdentity, u64, u64)>,
}

impl OpFootprint {
    /// The caller's memory alone (before the file is open).
    pub fn of_memory(ptr: usize, len: usize, fills_memory: bool) -> OpFootprint {
        OpFootprint { memory: (ptr, ptr.saturating_add(len)), fills_memory, file: None }
    }

    /// Both use some of the same caller bytes and one of them fills them.
    pub fn memory_conflicts(&self, other: &OpFootprint) -> bool {
        let (a, b) = (self.memory, other.memory);
        let shared = a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1;
        shared && (self.fills_memory || other.fills_memory)
    }

    /// Both move some of the same file bytes and one of them writes them.
    /// Two block devices always conflict (a partition and its disk share
    /// bytes under other names).
    pub fn file_conflicts(&self, other: &OpFootprint) -> bool {
        let (Some((fa, sa, ea)), Some((fb, sb, eb))) = (self.file, other.file) else { return false };
        let shared = if fa.block_device && fb.block_device { true } else { fa == fb && sa < eb && sb < ea };
        // A read fills memory, so it writes no file bytes.
        shared && (!self.fills_memory || !other.fills_memory)
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
    /// Every slice has run (`slices_ok`: none failed): a later op on the
    /// same caller memory is about to be submitted, so whatever the op
    /// still does to that memory (a bounced read's copy-out) is done now, in
    /// submission order. `finish` then reports its outcome.
    fn settle(&mut self, _slices_ok: bool) {}
    /// A driven op's run (`handle/latch.rs`): runs it, calling `between`
    /// between its steps, until it ends (true) or `between` fails (false,
    /// suspended, to be run again). Ops without steps run to their end.
    fn run_steps(&mut self, _between: &mut dyn FnMut() -> Result<()>) -> bool {
        self.settle(true);
        true
    }
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
    /// What the op touches (None: it is ordered by nothing).
    pub footprint: Option<OpFootprint>,
}

/// An op ready to be dispatched.
#[must_use = "an op prepared but not dispatched never runs"]
pub(crate) struct PreparedOp {
    pub work: Arc<dyn OpWork>,
    pub completion: Box<dyn OpCompletion>,
    pub meta: OpMeta,
}
