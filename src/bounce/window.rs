//! Blocking ops on bounced host memory, streamed through a few windows.
//!
//! A blocking `sync_pread`/`sync_pwrite` of a plain (unlocked) tensor needs
//! a bounce buffer, but not one as large as the tensor: the op is cut into
//! chunks of one window each (a few MiB), and enough windows to keep the
//! handle's queue full take turns. While the I/O of some chunks runs, the
//! calling thread copies the caller's bytes of another chunk into its
//! window (a write) or out of it (a read). So a 9 GiB tensor moves through
//! at most 256 MiB of bounce memory, the copies overlap the I/O, and every
//! copy is made by the calling thread under the ownership rule
//! (`caller.rs`), never by an I/O thread.
//!
//! A read keeps only as many windows in flight as its copy needs
//! (`read_ahead.rs`), so that a window's bytes are still in the CPU's cache
//! when they are copied; the free window it fills next is the one freed
//! last.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::op::caller::{bytes, bytes_mut, CallerMemory};
use crate::op::checks::{describe_op, report_validation};
use crate::op::plan::{IoSpan, OpPlan};
use super::read_ahead::{ReadAhead, ReadAheadMemory};
use crate::op::work::OpFootprint;
use crate::bounce::{BounceBuffer, Purpose};
use crate::buffer::Staging;
use crate::engine::AioParams;
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::OpenFile;
use crate::bounce::copy::parallel_copy;
use crate::knobs::{BOUNCE_WINDOWS_MAX, BOUNCE_WINDOWS_MAX_BYTES, BOUNCE_WINDOWS_MIN, BOUNCE_WINDOW_BYTES};
use crate::pinned::page_size;

/// One window's bytes for a handle's geometry: [`BOUNCE_WINDOW_BYTES`], or a
/// block per worker when that is more, in whole pages (so each chunk keeps
/// the op's alignment).
pub(crate) fn window_bytes(parallelism: usize, params: &AioParams) -> usize {
    let per_worker_block = parallelism.max(1).saturating_mul(params.block_size.max(1));
    let page = page_size();
    BOUNCE_WINDOW_BYTES.max(per_worker_block).div_ceil(page) * page
}

/// How many windows keep the handle's queue full with two more being
/// copied, within [`BOUNCE_WINDOWS_MIN`]..=[`BOUNCE_WINDOWS_MAX`] and
/// [`BOUNCE_WINDOWS_MAX_BYTES`] in all.
pub(crate) fn window_count(parallelism: usize, params: &AioParams, window: usize) -> usize {
    let queue = parallelism.max(1).saturating_mul(params.queue_depth.max(1)).saturating_mul(params.block_size.max(1));
    let most = (BOUNCE_WINDOWS_MAX_BYTES / window.max(1)).clamp(BOUNCE_WINDOWS_MIN, BOUNCE_WINDOWS_MAX);
    (queue.div_ceil(window.max(1)) + 2).clamp(BOUNCE_WINDOWS_MIN, most)
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
#[must_use = "a windowed op not run never moves its bytes"]
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
    params: AioParams,
    window: usize,
}

impl WindowedOp {
    pub(crate) fn new(
        direction: Direction,
        file: OpenFile,
        file_offset: u64,
        caller: CallerMemory,
        staging: Box<dyn Staging>,
        skew: usize,
        validate: bool,
    ) -> WindowedOp {
        let params = AioParams { block_size: 1, queue_depth: 1, single_submit: false, overlap_events: true };
        WindowedOp { direction, file, file_offset, caller, staging, skew, validate, parallelism: 1, params, window: 1 }
    }

    pub(crate) fn with_geometry(mut self, parallelism: usize, params: AioParams, window: usize) -> WindowedOp {
        (self.parallelism, self.params, self.window) = (parallelism, params, window);
        self
    }

    pub fn direction(&self) -> Direction {
        self.direction
    }
    pub fn len(&self) -> usize {
        self.caller.len
    }

    /// The caller's bytes and the file bytes the op moves.
    pub fn footprint(&self) -> OpFootprint {
        let mut fp = OpFootprint::of_memory(self.caller.addr, self.caller.len, self.direction == Direction::Read);
        fp.file = self.file.order_identity().map(|id| (id, self.file_offset, self.file_offset + self.caller.len as u64));
        fp
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
        let span = IoSpan { ptr: io_ptr, len: n, registrable: memory };
        crate::stripe::plan_op(self.direction, &mut self.file, file_offset, span, self.parallelism, self.params)
    }

    /// Starts the op with `runner` and runs it to its end, calling `between`
    /// before each chunk starts. An error (a chunk's or a copy's) stops it
    /// once the chunks in flight are done. An error from `between` suspends
    /// it ([`Windowed::Suspended`], its chunks in flight): the handle parks
    /// it there to run Python, and resumes it (`handle/windowed.rs`).
    pub fn start<R: ChunkRunner>(
        self,
        runner: R,
        read_ahead: ReadAheadMemory,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Windowed<R> {
        let len = self.caller.len;
        let chunks = len.div_ceil(self.window);
        let count = window_count(self.parallelism, &self.params, self.window).min(runner.depth().max(1)).min(chunks);
        let what = self.what();
        let mut windows = Vec::with_capacity(count);
        for _ in 0..count {
            match BounceBuffer::take(self.skew + self.window, Purpose::Window, &|| what.clone()) {
                Ok(w) => windows.push(w),
                Err(e) => return Windowed::Done(Err(e)),
            }
        }
        let mut run = WindowRun {
            op: self,
            ahead: ReadAhead::new(windows.len(), read_ahead),
            free: (0..windows.len()).rev().collect(),
            windows,
            runner,
            in_flight: VecDeque::new(),
            next: 0,
            chunks,
            first: None,
            done_bytes: 0,
        };
        match run.advance(between) {
            Some(_) => Windowed::Suspended(Box::new(Suspended { run })),
            None => Windowed::Done(run.finish()),
        }
    }

    /// An error that stopped the op, with how many of its bytes moved
    /// before it (transfer errors already name their file and offset).
    fn stopped_error(&self, e: Error, done_bytes: usize) -> Error {
        if done_bytes == 0 {
            return e;
        }
        crate::rt::log::info(&format!(
            "{}: stopped after {done_bytes} of {} bytes ({} chunks of {} bytes moved): {e}",
            self.what(),
            self.caller.len,
            done_bytes.div_ceil(self.window),
            self.window
        ));
        e
    }
}

/// What starting a windowed op gave.
pub(crate) enum Windowed<R: ChunkRunner> {
    /// It ran to its end.
    Done(Result<()>),
    /// Suspended midway (its `between` failed): resume it to finish it.
    Suspended(Box<Suspended<R>>),
}

/// A suspended windowed op, its chunks in flight, its windows held.
pub(crate) struct Suspended<R: ChunkRunner> {
    run: WindowRun<R>,
}

impl<R: ChunkRunner> Suspended<R> {
    /// Runs the rest of the op (not interruptible) and returns its outcome.
    pub fn resume(mut self) -> Result<()> {
        self.run.advance(&mut || Ok(()));
        self.run.finish()
    }

    /// Runs more of the op, calling `between` before each chunk starts, as
    /// [`WindowedOp::start`] does.
    pub fn resume_until(mut self, between: &mut dyn FnMut() -> Result<()>) -> Windowed<R> {
        match self.run.advance(between) {
            Some(_) => Windowed::Suspended(Box::new(self)),
            None => Windowed::Done(self.run.finish()),
        }
    }
}

/// A windowed op in progress: its windows, the chunks in flight in order,
/// and how it is doing. Its `Drop` waits for the chunks in flight, whatever
/// ended the op, before any field (the windows) goes.
struct WindowRun<R: ChunkRunner> {
    op: WindowedOp,
    windows: Vec<BounceBuffer>,
    /// Windows not in flight, the one freed last on top.
    free: Vec<usize>,
    /// How many chunks may be in flight now.
    ahead: ReadAhead,
    runner: R,
    /// The chunks in flight, oldest first, with their windows.
    in_flight: VecDeque<(usize, usize)>,
    /// The next chunk to start, of `chunks`.
    next: usize,
    chunks: usize,
    first: Option<Error>,
    done_bytes: usize,
}

impl<R: ChunkRunner> Drop for WindowRun<R> {
    fn drop(&mut self) {
        while self.in_flight.pop_front().is_some() {
            let _ = self.runner.finish_oldest();
        }
    }
}

impl<R: ChunkRunner> WindowRun<R> {
    /// Starts chunks until all have started or the op failed, keeping at
    /// most one per window in flight. Returns the interruption of a read
    /// (the op then stops here, its chunks still in flight).
    fn advance(&mut self, between: &mut dyn FnMut() -> Result<()>) -> Option<Error> {
        while self.next < self.chunks && self.first.is_none() {
            // A read whose chunks are done drains them here; while the copy
            // is the one behind, each lowers its limit: a device faster than
            // the copy brings it to the least (measured as the best, read_ahead.rs).
            while !self.in_flight.is_empty() && (self.in_flight.len() >= self.in_flight_limit() || self.free.is_empty()) {
                self.finish_oldest();
                if self.first.is_some() {
                    break;
                }
            }
            if self.first.is_some() {
                break;
            }
            if let Err(e) = between() {
                return Some(e);
            }
            let Some(&w) = self.free.last() else {
                // Not reached: an op of at least one chunk takes a window or fails.
                self.first = Some(Error::InvalidArgument(format!("{}: no bounce window to stream through", self.op.what())));
                break;
            };
            let k = self.next;
            let started = (|| {
                if self.op.direction == Direction::Write {
                    self.op.copy_in(k, &mut self.windows[w])?;
                }
                let plan = self.op.plan_chunk(k, &self.windows[w])?;
                self.runner.start(plan)
            })();
            match started {
                Ok(()) => {
                    self.free.pop();
                    self.in_flight.push_back((k, w));
                    self.next += 1;
                }
                Err(e) => self.first = Some(e),
            }
        }
        None
    }

    /// How many chunks may be in flight before the next starts.
    fn in_flight_limit(&self) -> usize {
        match self.op.direction {
            Direction::Read => self.ahead.limit(),
            Direction::Write => self.windows.len(),
        }
    }

    /// Waits for the oldest chunk in flight; a read's bytes then go to the
    /// caller (unless the op already failed).
    fn finish_oldest(&mut self) {
        let Some((j, w)) = self.in_flight.pop_front() else { return };
        let waiting = Instant::now();
        let outcome = self.runner.finish_oldest();
        let waited = waiting.elapsed();
        // The window is free once its I/O is done; a read's copy below is
        // made before the next chunk can take it.
        self.free.push(w);
        if self.first.is_some() {
            return;
        }
        let outcome = outcome.and_then(|()| match self.op.direction {
            Direction::Read => {
                let copying = Instant::now();
                let copied = self.op.copy_out(j, &self.windows[w]);
                self.ahead.observe(waited, copying.elapsed());
                copied
            }
            Direction::Write => Ok(()),
        });
        match outcome {
            Ok(()) => self.done_bytes += self.op.chunk(j).1,
            Err(e) => self.first = Some(e),
        }
    }

    /// Waits for the chunks in flight, then validates and closes.
    fn finish(mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.finish_oldest();
        }
        if let Some(e) = self.first.take() {
            return Err(self.op.stopped_error(e, self.done_bytes));
        }
        let len = self.op.caller.len;
        if self.op.validate {
            let what = self.op.what();
            let (file, direction, offset) = (&self.op.file, self.op.direction, self.op.file_offset);
            self.op.caller.with_bytes(self.op.staging.as_ref(), 0, len, &|| what.clone(), |p| {
                // SAFETY: the caller's `len` bytes, held still (caller.rs).
                report_validation(direction, file, offset, unsafe { bytes(p, len) })
            })?;
        }
        if self.op.direction == Direction::Write {
            // A deferred write error (NFS, FUSE) only shows at close().
            if let Err(errno) = self.op.file.close_owned() {
                return Err(Error::Transfer(TransferError {
                    direction: self.op.direction,
                    path: self.op.file.path().map(|p| p.to_path_buf()),
                    fd: self.op.file.any_fd(),
                    file_offset: self.op.file_offset,
                    len,
                    errno,
                    detail: Some("close() reported a deferred write error".into()),
                }));
            }
        }
        Ok(())
    }
}
