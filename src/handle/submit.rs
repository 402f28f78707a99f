//! Submitting ops and waiting for them: the queue, the order of ops on
//! shared memory and file bytes, blocking calls and `wait()`. The
//! DeepSpeed-shaped entry points here (`submit`, `pread`/`pwrite`, the
//! polling `*_with` pair) are crate-internal: the Rust API (`api.rs`,
//! `scoped.rs`) is built on them, and `crate::deepspeed` exposes them.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::api::*;
use super::device::*;
use super::latch::*;
use super::windowed::*;
use super::workers::*;
use crate::buffer::{BufferDesc, Location};
use crate::error::{Direction, Error, Result};
use crate::file::FileTarget;
use crate::knobs;
use crate::op::checks::check_divisible;
use crate::op::window::{Windowed, WindowedOp};
use crate::op::work::{OpCompletion, OpFootprint, OpMeta, PreparedOp};
use crate::op::{CpuOp, Mode, OpRequest, Prepared};
use crate::stats;

impl IoHandle {
    /// Builds the op for a request: contiguous CUDA buffers on a GDS handle
    /// go through cuFile; everything else through the CPU path (bouncing
    /// what cannot be used directly).
    pub(super) fn prepare(&self, request: OpRequest<'_>, mode: Mode) -> Result<HandleOp> {
        match (&self.device_route, request.buffer.location()) {
            (DeviceRoute::Gds(gds), Location::Cuda(_)) if request.buffer.is_contiguous() => {
                crate::gds::op::prepare(&gds.driver, request, gds.parallelism, gds.block_size)
                    .map(HandleOp::Queued)
            }
            (DeviceRoute::GdsUnavailable(why), Location::Cuda(_)) => Err(crate::gds::unavailable(
                format!("this gds_handle has no GPUDirect Storage: {why}"),
            )),
            _ => {
                let parallelism = self.config.intra_op_parallelism;
                let b = &request.buffer;
                check_divisible(
                    request.direction,
                    b.len(),
                    request.file_offset,
                    &request.target,
                    parallelism,
                )?;
                Ok(
                    match CpuOp::prepare(
                        request,
                        parallelism,
                        self.config.aio_params(),
                        self.manager,
                        mode,
                    )? {
                        Prepared::Op(op) => HandleOp::Queued(op.into()),
                        Prepared::Windowed(op) => HandleOp::Windowed(op),
                    },
                )
            }
        }
    }

    /// Before an op on `request`'s memory is prepared: every pending op
    /// that shares that memory, where either fills it, has its effect on it
    /// now (see [`InFlight::settle`]), so that the new op's copies and I/O
    /// come after the earlier op's, in submission order.
    pub(super) fn settle_memory_conflicts(&self, request: &OpRequest<'_>) {
        let b = &request.buffer;
        let mine = OpFootprint::of_memory(
            b.ptr() as usize,
            b.len(),
            request.direction == Direction::Read,
        );
        for op in self.pending_matching(|fp| fp.memory_conflicts(&mine)) {
            op.settle();
        }
    }

    /// The pending ops whose footprint matches (a snapshot of the queue).
    pub(super) fn pending_matching(
        &self,
        matches: impl Fn(&OpFootprint) -> bool,
    ) -> Vec<Arc<InFlight>> {
        self.pending
            .lock()
            .iter()
            .filter(|op| op.meta.footprint.as_ref().is_some_and(&matches))
            .cloned()
            .collect()
    }

    /// `pread`/`pwrite`/`async_*`/`sync_*`: submits a parallel op. With
    /// `is_async` returns 0 at once; otherwise waits for every pending op and
    /// returns how many finished. The buffer's [`BufferDesc`] contract holds
    /// until the op is finished.
    pub(crate) fn submit(&self, request: OpRequest<'_>, is_async: bool) -> Result<usize> {
        self.submit_blocking_with(request, is_async, Duration::MAX, &mut || Ok(()))
    }

    /// Dispatches a prepared op: with `is_async` returns 0 at once;
    /// otherwise waits for every pending op and returns how many finished.
    /// Slice `i` runs on worker `i % workers`.
    #[cfg_attr(not(test), allow(dead_code))] // the internal tests run their own work
    pub(crate) fn dispatch_prepared(&self, op: PreparedOp, is_async: bool) -> Result<usize> {
        self.check_process()?;
        self.run_prepared(
            HandleOp::Queued(op),
            is_async,
            Duration::MAX,
            &mut || Ok(()),
        )
    }

    pub(super) fn run_prepared(
        &self,
        op: HandleOp,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        let op = match op {
            HandleOp::Queued(op) if is_async => {
                // An async submit never waits behind another thread's
                // blocking call: DeepSpeed's bindings keep the GIL for async_*.
                self.dispatch(op);
                return Ok(0);
            }
            op => op,
        };
        let (result, finished) = self.waiting(|| -> Result<_> {
            let _serial = self.serial.lock();
            Ok(match op {
                HandleOp::Queued(op) => match self.run_inline(op) {
                    Ok(ran) => ran,
                    Err(op) => {
                        self.dispatch(op);
                        self.until_io_idle(poll, between)?;
                        self.wait_locked()
                    }
                },
                HandleOp::Windowed(op) => {
                    // Everything submitted before it takes effect first.
                    let (earlier, finished) = self.wait_locked();
                    let started = Instant::now();
                    let meta = windowed_meta(&op);
                    match op.start(WorkerChunks::new(self.worker_senders()), self.read_ahead.clone(), between) {
                        Windowed::Done(outcome) => {
                            self.record(meta, outcome.is_ok(), started);
                            (combine(earlier, outcome), finished)
                        }
                        Windowed::Suspended(mut suspended) => {
                            // Interrupted: the rest waits for the next wait().
                            let interruption = suspended.take_interruption();
                            let meta = OpMeta {
                                footprint: Some(suspended.footprint()),
                                settle_on_conflict: true,
                                ..meta
                            };
                            let resume = ResumeWindowed {
                                suspended: Some(*suspended),
                                outcome: None,
                            };
                            self.dispatch(PreparedOp {
                                work: Arc::new(NoSlices),
                                completion: Box::new(resume),
                                meta,
                            });
                            (Err(interruption), finished)
                        }
                    }
                }
            })
        })?;
        drop(finished);
        result
    }

    /// A small blocking CPU op with nothing else pending runs here, on the
    /// calling thread's turn, with the handle's inline engine (see
    /// [`knobs::INLINE_MAX_BYTES`]); returns its result (1 op finished).
    /// Anything else comes back to be dispatched. Called with `serial` held;
    /// the finished completion is returned to be dropped after it is let go.
    pub(super) fn run_inline(
        &self,
        op: PreparedOp,
    ) -> std::result::Result<(Result<usize>, Finished), PreparedOp> {
        if !op.meta.may_run_inline
            || op.meta.bytes > knobs::INLINE_MAX_BYTES as u64
            || !self.pending.lock().is_empty()
        {
            return Err(op);
        }
        let started = Instant::now();
        let PreparedOp {
            work,
            mut completion,
            meta,
        } = op;
        let outcome = self.run_on_inline_engine(work.as_ref(), meta.bytes);
        let result = completion.finish(outcome);
        self.record(meta, result.is_ok(), started);
        Ok((result.map(|()| 1), vec![completion]))
    }

    /// Waits, in steps of `poll`, until the I/O of every op submitted so
    /// far has ended (without finishing them), calling `between` after each
    /// step that ended with I/O still running. An error from `between` ends
    /// the wait early, the ops still pending.
    pub(super) fn until_io_idle(
        &self,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        loop {
            let deadline = Instant::now().checked_add(poll);
            // The first op still running, if any (no list copied per step).
            loop {
                let running = self
                    .pending
                    .lock()
                    .iter()
                    .find(|op| !op.slices_done())
                    .cloned();
                match (running, deadline) {
                    (None, _) => return Ok(()),
                    (Some(op), None) => {
                        op.until_slices_done();
                    }
                    (Some(op), Some(deadline)) if op.slices_done_by(deadline) => continue,
                    (Some(_), Some(_)) => break,
                }
            }
            between()?;
        }
    }

    /// [`IoHandle::submit`], waiting (when not `is_async`) in steps of
    /// `poll` and calling `between` between them (the Python front ends run
    /// pending signal handlers there, so Ctrl-C ends a long read at once).
    /// An error from `between` is returned with the queued ops left pending,
    /// their buffers held; a later `wait()` finishes them. A blocking op
    /// streaming through bounce windows stops at its next window instead
    /// (the error names how far it got). Blocking calls on one handle stay
    /// serialised.
    pub(crate) fn submit_blocking_with(
        &self,
        request: OpRequest<'_>,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        self.check_process()?;
        self.settle_memory_conflicts(&request);
        let mode = if is_async {
            Mode::Async
        } else {
            Mode::Blocking
        };
        let op = self.prepare(request, mode)?;
        self.run_prepared(op, is_async, poll, between)
    }

    /// [`IoHandle::wait`] in steps of `poll`, calling `between` between
    /// them; see [`IoHandle::submit_blocking_with`].
    pub(crate) fn wait_with(
        &self,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        self.check_process()?;
        let (result, finished) = self.waiting(|| -> Result<_> {
            let _serial = self.serial.lock();
            self.until_io_idle(poll, between)?;
            Ok(self.wait_locked())
        })?;
        drop(finished);
        result
    }

    /// `pread(buffer, target, file_offset, async)` with DeepSpeed's
    /// meaning: a parallel read, async (returns 0) or blocking (returns the
    /// ops finished). `buffer`'s contract ([`BufferDesc::from_raw_parts`])
    /// holds until the op is finished.
    pub(crate) fn pread(
        &self,
        buffer: BufferDesc,
        target: FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        self.submit(
            OpRequest::new(Direction::Read, target, file_offset, buffer),
            is_async,
        )
    }

    /// `pwrite(buffer, target, file_offset, async)`: as [`IoHandle::pread`], writing.
    pub(crate) fn pwrite(
        &self,
        buffer: BufferDesc,
        target: FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        self.submit(
            OpRequest::new(Direction::Write, target, file_offset, buffer),
            is_async,
        )
    }

    /// Queues an op and hands its slices to the workers. Its slices wait
    /// for those of earlier pending ops on the same file bytes.
    pub(super) fn dispatch(&self, op: PreparedOp) {
        if let Some(mine) = &op.meta.footprint {
            for earlier in self.pending_matching(|fp| fp.conflicts(mine)) {
                if earlier.meta.settle_on_conflict {
                    earlier.settle();
                }
            }
        }
        let PreparedOp {
            work,
            completion,
            meta,
        } = op;
        let slices = work.slice_count();
        // Queue and hand out under one lock, so every worker sees ops in the
        // order `wait()` finishes them.
        let mut pending = self.pending.lock();
        let after: Vec<Weak<InFlight>> = match &meta.footprint {
            Some(mine) => pending
                .iter()
                .filter(|op| {
                    !op.slices_done()
                        && op
                            .meta
                            .footprint
                            .as_ref()
                            .is_some_and(|fp| fp.conflicts(mine))
                })
                .map(Arc::downgrade)
                .collect(),
            None => Vec::new(),
        };
        let in_flight = Arc::new(InFlight::new(work, Some(completion), meta, after));
        pending.push_back(in_flight.clone());
        self.send_slices(&in_flight, slices);
    }

    /// Slice `i` to worker `i % workers`.
    pub(super) fn send_slices(&self, op: &Arc<InFlight>, slices: usize) {
        send_slices(&self.worker_senders(), op, slices);
    }

    /// Waits for every pending op, finishes each, and returns how many.
    pub fn wait(&self) -> Result<usize> {
        self.wait_with(Duration::MAX, &mut || Ok(()))
    }

    /// Runs a call that blocks for I/O, counting the time it took as time
    /// the caller waited (see `Stats::wait_time`).
    pub(super) fn waiting<T>(&self, call: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = call();
        let waited = started.elapsed();
        self.counters.record_wait(waited);
        stats::process_counters().record_wait(waited);
        out
    }

    /// Finishes every pending op in order. Returns the count (or the first
    /// error) and the finished completions, for the caller to drop once it
    /// has let go of `serial`.
    pub(super) fn wait_locked(&self) -> (Result<usize>, Vec<Box<dyn OpCompletion>>) {
        let mut completed = 0usize;
        let mut errors = Errors::default();
        let mut finished = Vec::new();
        loop {
            // The op stays queued until it is finished: an op submitted
            // meanwhile on the same memory (from another thread) must see it
            // to settle after it (only this call, under `serial`, removes ops).
            let Some(op) = self.pending.lock().front().cloned() else {
                break;
            };
            let outcome = op.wait_slices();
            let taken = op.completion.lock().take();
            let result = match taken {
                Some(mut completion) => {
                    let r = completion.finish(outcome);
                    finished.push(completion);
                    r
                }
                None => outcome,
            };
            op.mark_finished();
            let removed = self.pending.lock().pop_front();
            debug_assert!(
                removed.is_some_and(|r| Arc::ptr_eq(&r, &op)),
                "ops leave the queue in order"
            );
            completed += 1;
            self.record(op.meta, result.is_ok(), op.started);
            if let Err(e) = result {
                errors.add(e);
            }
        }
        (errors.into_result(completed), finished)
    }
}

/// What the handle runs for a request.
pub(super) enum HandleOp {
    /// An op for the queue (or, small and blocking, the calling thread).
    Queued(PreparedOp),
    /// A blocking op on bounced memory, streamed through bounce windows.
    Windowed(WindowedOp),
}

/// The errors of the ops one call finished: the first, and how many more.
#[derive(Default)]
pub(super) struct Errors {
    pub(super) first: Option<Error>,
    pub(super) more: usize,
}

impl Errors {
    pub(super) fn add(&mut self, e: Error) {
        if self.first.is_none() {
            self.first = Some(e);
        } else {
            self.more += 1;
        }
    }
    pub(super) fn into_result(self, completed: usize) -> Result<usize> {
        match self.first {
            None => Ok(completed),
            Some(e) if self.more == 0 => Err(e),
            Some(e) => Err(Error::Many {
                first: Box::new(e),
                more: self.more,
            }),
        }
    }
}

/// What a blocking windowed call returns: the earlier ops finished first,
/// and the windowed op itself.
pub(super) fn combine(earlier: Result<usize>, this: Result<()>) -> Result<usize> {
    let mut errors = Errors::default();
    let completed = match earlier {
        Ok(n) => n,
        Err(Error::Many { first, more }) => {
            errors.first = Some(*first);
            errors.more = more;
            0
        }
        Err(e) => {
            errors.add(e);
            0
        }
    };
    if let Err(e) = this {
        errors.add(e);
    }
    errors.into_result(completed + 1)
}
