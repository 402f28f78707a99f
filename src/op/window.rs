//! Blocking ops on bounced host memory, streamed through a few windows.
//!
//! A blocking `sync_pread`/`sync_pwrite` of a plain (unlocked) tensor needs
//! a bounce buffer, but not one as large as the tensor: the op is cut into
//! chunks of one window each, and [`crate::knobs::BOUNCE_WINDOWS`] windows
//! take turns. While the I/O of some chunks runs, the calling thread copies
//! the caller's bytes of another chunk into its window (a write) or out of
//! it (a read). So a 9 GiB tensor moves through a few hundred MiB of bounce
//! memory, the copies overlap the I/O, and every copy is made by the
//! calling thread under the ownership rule (`caller.rs`), never by an I/O
//! thread.

use std::collections::VecDeque;
use std::sync::Arc;

use super::caller::{bytes, bytes_mut, CallerMemory};
use super::checks::report_validation;
use super::plan::OpPlan;
use super::{describe_op, plan_op};
use crate::bounce::{BounceBuffer, Purpose};
use crate::buffer::Staging;
use crate::engine::Knobs;
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::OpenFile;
use crate::host_copy::parallel_copy;
use crate::knobs::{BOUNCE_WINDOWS, BOUNCE_WINDOW_MAX, BOUNCE_WINDOW_MIN};
use crate::pinned::page_size;

/// One window's bytes for a handle's geometry: enough to keep every
/// worker's queue full (parallelism x depth x block), within bounds, in
/// whole pages (so each chunk keeps the op's alignment).
pub(crate) fn window_bytes(parallelism: usize, knobs: &Knobs) -> usize {
    let queue = parallelism.max(1).saturating_mul(knobs.queue_depth.max(1)).saturating_mul(knobs.block_size.max(1));
    let page = page_size();
    queue.clamp(BOUNCE_WINDOW_MIN, BOUNCE_WINDOW_MAX) / page * page
}

/// Who moves a chunk's bytes: the handle's workers, or the calling thread.
pub(crate) trait ChunkRunner {
    /// How many chunks may be in flight at once (1: `start` runs it).
    fn depth(&self) -> usize;
    /// Starts (or runs) a chunk's I/O.
    fn start(&mut self, plan: Arc<OpPlan>) -> Result<()>;
    /// Waits for the oldest started chunk and returns its outcome.
    fn finish_oldest(&mut self) -> Result<()>;
}

/// A blocking op on bounced host memory, larger than one window.
pub(crate) struct WindowedOp {
    direction: Direction,
    file: OpenFile,
    file_offset: u64,
    caller: CallerMemory,
    staging: Box<dyn Staging>,
    /// Where the I/O starts in a window: the file offset's place in its page.
    skew: usize,
    validate: bool,
    parallelism: usize,
    knobs: Knobs,
    window: usize,
}

impl WindowedOp {
    pub(super) fn new(
        direction: Direction,
        file: OpenFile,
        file_offset: u64,
        caller: CallerMemory,
        staging: Box<dyn Staging>,
        skew: usize,
        validate: bool,
    ) -> WindowedOp {
        let knobs = Knobs { block_size: 1, queue_depth: 1, single_submit: false, overlap_events: true };
        WindowedOp { direction, file, file_offset, caller, staging, skew, validate, parallelism: 1, knobs, window: 1 }
    }

    pub(super) fn with_geometry(mut self, parallelism: usize, knobs: Knobs, window: usize) -> WindowedOp {
        (self.parallelism, self.knobs, self.window) = (parallelism, knobs, window);
        self
    }

    pub fn direction(&self) -> Direction {
        self.direction
    }
    pub fn len(&self) -> usize {
        self.caller.len
    }

    fn what(&self) -> String {
        describe_op(self.direction, self.caller.len, self.file_offset, &self.file)
    }

    /// Chunk `k`: its offset in the op, and its length.
    fn chunk(&self, k: usize) -> (usize, usize) {
        let off = k * self.window;
        (off, self.window.min(self.caller.len - off))
    }

    fn copy_in(&self, k: usize, window: &mut BounceBuffer) -> Result<()> {
        let (off, n) = self.chunk(k);
        let dst = &mut window.slice_mut(self.skew + n)[self.skew..];
        // SAFETY: the caller's bytes `off..off + n`, held still (caller.rs).
        self.caller.with_bytes(self.staging.as_ref(), off, n, &|| self.what(), |src| parallel_copy(dst, unsafe { bytes(src, n) }))
    }

    fn copy_out(&self, k: usize, window: &BounceBuffer) -> Result<()> {
        let (off, n) = self.chunk(k);
        let src = &window.slice(self.skew + n)[self.skew..];
        // SAFETY: as in `copy_in`.
        self.caller.with_bytes(self.staging.as_ref(), off, n, &|| self.what(), |dst| parallel_copy(unsafe { bytes_mut(dst, n) }, src))
    }

    fn plan_chunk(&mut self, k: usize, window: &BounceBuffer) -> Result<Arc<OpPlan>> {
        let (off, n) = self.chunk(k);
        let io_ptr = window.as_ptr().wrapping_add(self.skew);
        let memory = window.registrable().cloned();
        let file_offset = self.file_offset + off as u64;
        plan_op(self.direction, &mut self.file, file_offset, io_ptr, n, self.parallelism, self.knobs, memory)
    }

    /// Runs the op to its end with `runner`, calling `between` before each
    /// chunk starts (the Python front ends check for Ctrl-C there). An error
    /// (a chunk's, a copy's, or a read's `between`) stops it once the chunks
    /// in flight are done: the caller's memory then holds what the chunks
    /// before the failure moved. A write interrupted by `between` writes
    /// all it was given first, then returns the interruption.
    pub fn run(mut self, runner: &mut dyn ChunkRunner, between: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let len = self.caller.len;
        let chunks = len.div_ceil(self.window);
        let count = BOUNCE_WINDOWS.min(runner.depth().max(1)).min(chunks);
        let what = self.what();
        let mut windows = Vec::with_capacity(count);
        for _ in 0..count {
            windows.push(BounceBuffer::take(self.skew + self.window, Purpose::Window, &|| what.clone())?);
        }
        // Declared after the windows, so dropped (and drained) before them.
        let mut interrupted: Option<Error> = None;
        let mut run = Progress { runner, in_flight: VecDeque::new(), first: None, done_bytes: 0 };
        for k in 0..chunks {
            if run.in_flight.len() == windows.len() {
                self.finish_oldest(&mut run, &windows);
            }
            if run.first.is_some() {
                break;
            }
            let w = k % windows.len();
            // A write is never cut short by an interruption (nothing the
            // caller wrote is lost): it is reported once the write is done.
            let asked_to_stop = match between() {
                Err(e) if self.direction == Direction::Write => {
                    interrupted.get_or_insert(e);
                    Ok(())
                }
                other => other,
            };
            let started = asked_to_stop.and_then(|()| {
                if self.direction == Direction::Write {
                    self.copy_in(k, &mut windows[w])?;
                }
                let plan = self.plan_chunk(k, &windows[w])?;
                run.runner.start(plan)
            });
            match started {
                Ok(()) => run.in_flight.push_back(k),
                Err(e) => {
                    run.first = Some(e);
                    break;
                }
            }
        }
        while !run.in_flight.is_empty() {
            self.finish_oldest(&mut run, &windows);
        }
        let (first, done_bytes) = (run.first.take(), run.done_bytes);
        drop(run);
        if let Some(e) = first {
            return Err(self.stopped_error(e, done_bytes));
        }
        if let Some(e) = interrupted {
            return Err(e);
        }
        if self.validate {
            let (file, direction, offset) = (&self.file, self.direction, self.file_offset);
            // SAFETY: the caller's bytes, held still (caller.rs).
            self.caller.with_bytes(self.staging.as_ref(), 0, len, &|| what.clone(), |p| {
                report_validation(direction, file, offset, unsafe { bytes(p, len) })
            })?;
        }
        if self.direction == Direction::Write {
            // A deferred write error (NFS, FUSE) only shows at close().
            if let Err(errno) = self.file.close_owned() {
                return Err(Error::Transfer(TransferError {
                    direction: self.direction,
                    path: self.file.path().map(|p| p.to_path_buf()),
                    fd: self.file.any_fd(),
                    file_offset: self.file_offset,
                    len,
                    errno,
                    detail: Some("close() reported a deferred write error".into()),
                }));
            }
        }
        Ok(())
    }

    /// An error that stopped the op, with how many of its bytes moved
    /// before it (transfer errors already name their file and offset).
    fn stopped_error(&self, e: Error, done_bytes: usize) -> Error {
        if done_bytes == 0 {
            return e;
        }
        crate::log::info(&format!(
            "{}: stopped after {done_bytes} of {} bytes ({} chunks of {} bytes moved): {e}",
            self.what(),
            self.caller.len,
            done_bytes.div_ceil(self.window),
            self.window
        ));
        e
    }
}

/// The chunks in flight, in order, and how the op is doing. Dropped with
/// chunks still in flight (a panic unwinding), it waits for them: their
/// windows must outlive their I/O.
struct Progress<'r> {
    runner: &'r mut dyn ChunkRunner,
    in_flight: VecDeque<usize>,
    first: Option<Error>,
    done_bytes: usize,
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        while self.in_flight.pop_front().is_some() {
            let _ = self.runner.finish_oldest();
        }
    }
}

impl WindowedOp {
    /// Waits for the oldest chunk in flight; a read's bytes then go to the
    /// caller (unless the op already failed).
    fn finish_oldest(&self, run: &mut Progress<'_>, windows: &[BounceBuffer]) {
        let Some(j) = run.in_flight.pop_front() else { return };
        let outcome = run.runner.finish_oldest();
        if run.first.is_some() {
            return;
        }
        let outcome = outcome.and_then(|()| match self.direction {
            Direction::Read => self.copy_out(j, &windows[j % windows.len()]),
            Direction::Write => Ok(()),
        });
        match outcome {
            Ok(()) => run.done_bytes += self.chunk(j).1,
            Err(e) => run.first = Some(e),
        }
    }
}
