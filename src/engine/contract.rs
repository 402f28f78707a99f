//! The engine contract: the [`Engine`] trait, its kinds, the parameters
//! of a run, and what feeds a stream of runs.

use std::sync::Arc;

use crate::error::{Direction, TransferError};
use crate::knobs::{self, EngineChoice};

use super::filesystem::PuntingFs;
use super::fixed::RegistrableMemory;
use super::piece::Segment;

/// How to move the bytes: DeepSpeed's aio parameters, from the handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AioParams {
    pub block_size: usize,
    pub queue_depth: usize,
    pub single_submit: bool,
    pub overlap_events: bool,
}

/// Which engine a handle uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// io_uring: one ring per worker.
    Uring,
    /// pread/pwrite on the workers' threads.
    Psync,
}

impl EngineKind {
    /// The name `DEEPNVME_ENGINE` takes (`uring`, `psync`).
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "io_uring",
            EngineKind::Psync => "psync",
        }
    }
    /// `uring`/`io_uring` or `psync`, as [`crate::diag::ENGINE_ENV`] takes them.
    pub fn parse(s: &str) -> Option<EngineKind> {
        match knobs::parse_engine(s)? {
            EngineChoice::Uring => Some(EngineKind::Uring),
            EngineChoice::Psync => Some(EngineKind::Psync),
            EngineChoice::Auto => None,
        }
    }
}

/// Moves bytes. One engine belongs to one thread at a time.
pub trait Engine: Send {
    #[cfg_attr(not(test), allow(dead_code))] // the engine tests check which one they got
    fn kind(&self) -> EngineKind;
    /// Moves every segment; returns only when nothing is in flight.
    #[cfg_attr(not(test), allow(dead_code))] // the core runs `run_with`; the engine tests `run`
    fn run(&mut self, direction: Direction, segments: &[Segment], params: &AioParams) -> std::result::Result<(), TransferError> {
        self.run_with(direction, segments, params, None)
    }
    /// As `run`; `memory`: the registrable memory every segment lies in,
    /// if any (see `fixed.rs`). Engines touch only the segments' memory:
    /// copies to and from the caller's memory are the op's (`op/mod.rs`).
    fn run_with(
        &mut self,
        direction: Direction,
        segments: &[Segment],
        params: &AioParams,
        memory: Option<&Arc<RegistrableMemory>>,
    ) -> std::result::Result<(), TransferError>;
    /// Runs what `source` gives, one run after another: each run's outcome
    /// goes to `source.run_done` as soon as it is known. An engine that can
    /// keep several runs in flight at once (io_uring) starts the next run's
    /// requests in the slots the last one frees instead of draining first.
    fn run_stream(&mut self, source: &mut dyn StreamSource) {
        let mut n = 0;
        while let Some(run) = source.next_run() {
            let outcome = self.run_with(run.direction, &run.segments, &run.params, run.memory.as_ref());
            source.run_done(n, outcome);
            n += 1;
        }
    }
    /// Whether `run_stream` overlaps runs (else the worker need not use it).
    fn streams_runs(&self) -> bool {
        false
    }
    /// Between runs: lets go of registered memory that was freed.
    fn release_retired(&mut self) {}
    /// After a panic unwound out of `run_with`: returns only once nothing
    /// the engine handed to the kernel or to its threads is still moving
    /// bytes, so that the op's buffers may be freed. The engine is not used
    /// again afterwards.
    fn quiesce(&mut self) {}
    /// True once the engine cannot be trusted with another run (its ring
    /// failed); the owner replaces it.
    fn is_broken(&self) -> bool {
        false
    }
    /// The engine for files on `fs`, when not this one (see `choice.rs`).
    fn for_file_system(&mut self, _fs: PuntingFs) -> Option<&mut dyn Engine> {
        None
    }
}

/// One op's slice as a worker ring streams it (see [`Engine::run_stream`]):
/// direct segments only, no copy between blocks, DeepSpeed's overlap mode
/// (`overlap_events` on, `single_submit` off).
pub(crate) struct StreamRun {
    pub direction: Direction,
    pub segments: Vec<Segment>,
    pub params: AioParams,
    pub memory: Option<Arc<RegistrableMemory>>,
}

/// What feeds [`Engine::run_stream`]: a worker's queue of slices.
pub(crate) trait StreamSource {
    /// The next run to start, asked whenever the ring has a free slot and
    /// no started run has requests left to send. `None`: nothing now (asked
    /// again after the next completions; the stream ends when it says
    /// `None` with nothing of it left in flight).
    fn next_run(&mut self) -> Option<StreamRun>;
    /// Run number `n` (counting from 0 in the order `next_run` gave them)
    /// has completed: every request done, or its first error once nothing
    /// of it is in flight.
    fn run_done(&mut self, n: usize, outcome: std::result::Result<(), TransferError>);
}

/// Which threads submit to an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitter {
    /// Only the thread that creates the engine (a handle's worker): its
    /// io_uring ring is set up `COOP_TASKRUN` (and `SINGLE_ISSUER` without
    /// fixed buffers) where the kernel has them, which saves the kernel
    /// interrupts (and locking), and registers fixed buffers.
    OneThread,
    /// Any thread, one at a time (the engine of a handle's blocking
    /// `read`/`write`, which run on the caller's thread).
    AnyThread,
}
