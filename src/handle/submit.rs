//! Submitting ops and waiting for them: the queue, the order of ops on
//! shared memory and file bytes, blocking calls and `wait()`. The
//! DeepSpeed-shaped entry points here (`submit`, `pread`/`pwrite`, the
//! polling `*_with` pair) are crate-internal: the Rust API (`borrowed.rs`, `owned.rs`,
//! `scoped.rs`) is built on them, and the front ends reach them through
//! `crate::deepspeed`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::construction::*;
use super::device::*;
use super::latch::*;
use super::admission::AdmissionTurn;
use super::order::*;
use super::outcome::{combine, finish_panic};
use super::windowed::*;
use super::workers::*;
use crate::buffer::Location;
use crate::error::{Direction, Result};
use crate::knobs;
use crate::op::checks::check_divisible;
use crate::bounce::window::WindowedOp;
use crate::op::work::{OpCompletion, OpFootprint, PreparedOp};
use crate::op::{CpuOp, Mode, OpRequest, Prepared};
use crate::stats;

impl IoHandle {
    /// Builds the op for a request: contiguous CUDA buffers on a GDS handle
    /// go through cuFile; everything else through the CPU path (bouncing
    /// what cannot be used directly).
    pub(super) fn prepare(&self, request: OpRequest<'_>, mode: Mode) -> Result<HandleOp> {
        let earlier_writes = &|file, end| self.settle_writes_growing(file, end);
        match (&self.device_route, request.buffer.location()) {
            (DeviceRoute::Gds(gds), Location::Cuda(_)) if request.buffer.is_contiguous() => {
                crate::gds::op::prepare(&gds.driver, request, gds.parallelism, gds.block_size, earlier_writes)
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
                        earlier_writes,
                    )? {
                        Prepared::Op(op) => HandleOp::Queued(op.into()),
                        Prepared::Windowed(op) => HandleOp::Windowed(op),
                    },
                )
            }
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
    /// `is_async` returns 0 at once; otherwise waits for every op admitted
    /// up to it and returns how many this call finished. The buffer's
    /// [`BufferDesc`] contract holds until the op is finished.
    pub(crate) fn submit(&self, request: OpRequest<'_>, is_async: bool) -> Result<usize> {
        self.submit_blocking_with(request, is_async, Duration::MAX, &mut || Ok(()))
    }

    /// Admits a prepared op: with `is_async` returns 0 at once; otherwise
    /// waits as a blocking call does. Slice `i` runs on worker `i % workers`.
    #[cfg_attr(not(test), allow(dead_code))] // the internal tests run their own work
    pub(crate) fn dispatch_prepared(&self, op: PreparedOp, is_async: bool) -> Result<usize> {
        self.check_process()?;
        let admitted = {
            let turn = self.admission.enter()?;
            if let Some(mine) = op.meta.footprint {
                self.settle_matching(|fp| fp.memory_conflicts(&mine))?;
            }
            self.admit_op(&turn, HandleOp::Queued(op), is_async)?
        };
        self.run_admitted(admitted, is_async, Duration::MAX, &mut || Ok(()))
    }

    /// [`IoHandle::submit`], waiting (when not `is_async`) in steps of
    /// `poll` and calling `between` between them, holding no lock of the
    /// handle (the Python front ends run pending signal handlers there, so
    /// Ctrl-C ends a long read at once, and a handler may use the handle).
    /// An error from `between` ends a read's wait with the op left pending,
    /// its buffer held; a later `wait()` finishes it. A write is never cut
    /// short: it writes all it was given, then returns the interruption.
    pub(crate) fn submit_blocking_with(
        &self,
        request: OpRequest<'_>,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        self.check_process()?;
        let mode = if is_async { Mode::Async } else { Mode::Blocking };
        let b = &request.buffer;
        let memory = OpFootprint::of_memory(b.ptr() as usize, b.len(), request.direction == Direction::Read);
        let admitted = {
            let turn = self.admission.enter()?;
            self.settle_matching(|fp| fp.memory_conflicts(&memory))?;
            let op = self.prepare(request, mode)?;
            self.admit_op(&turn, op, is_async)?
        };
        self.run_admitted(admitted, is_async, poll, between)
    }

    /// Admits a prepared op by how it runs: a small blocking op on the
    /// calling thread, a windowed one driven by it, anything else queued.
    fn admit_op(&self, turn: &AdmissionTurn<'_>, op: HandleOp, is_async: bool) -> Result<Admitted> {
        Ok(match op {
            HandleOp::Queued(op) if !is_async && self.may_run_inline(&op) => {
                let PreparedOp { work, completion, meta } = op;
                let entry = self.admit(turn, Admit::Driven { meta, parked: None }, false)?;
                Admitted { entry, inline: Some((work, completion)) }
            }
            HandleOp::Queued(op) => Admitted { entry: self.admit(turn, Admit::Queued(op), !is_async)?, inline: None },
            HandleOp::Windowed(op) => {
                let meta = windowed_meta(&op);
                let parked = DrivenWindowed::new(op, WorkerChunks::new(self.worker_senders()), self.read_ahead.clone());
                Admitted { entry: self.admit(turn, Admit::Driven { meta, parked: Some(Box::new(parked)) }, true)?, inline: None }
            }
        })
    }

    /// Runs (or, async, leaves to the workers) an admitted op, and for a
    /// blocking call waits as [`IoHandle::submit_blocking_with`] says.
    fn run_admitted(
        &self,
        admitted: Admitted,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        let Admitted { entry, inline } = admitted;
        if let Some((work, completion)) = inline {
            return self.run_inline(&entry, work, completion);
        }
        if entry.driver.is_some() {
            return self.drive_windowed(&entry, poll, between);
        }
        if is_async {
            return Ok(0);
        }
        let waited = self.wait_through(entry.seq, true, poll, between);
        // A write is never cut short: the caller may reuse its memory once
        // the call returns, so a wait that ended early (Ctrl-C) still waits
        // for this op's own I/O, without running handlers meanwhile. Its
        // finishing, and earlier ops', are left to the next wait(), as an
        // interrupted read is (and as `drive_windowed` does for writes).
        if waited.is_err() && entry.meta.direction == Some(Direction::Write) {
            entry.until_slices_done();
        }
        // Finished by another call (a wait() in a signal handler, another
        // thread's), its result was kept for this one.
        match entry.release_from_caller() {
            Some(kept) => combine(waited, kept),
            None => waited,
        }
    }

    /// A small blocking CPU op with nothing else pending runs on the
    /// calling thread, with the handle's inline engine (see
    /// [`knobs::INLINE_MAX_BYTES`]): no hand-off to a worker and back.
    fn may_run_inline(&self, op: &PreparedOp) -> bool {
        op.meta.may_run_inline && op.meta.bytes <= knobs::INLINE_MAX_BYTES as u64 && self.pending.lock().is_empty()
    }

    /// Runs an admitted inline op here; returns its result (1 op finished).
    fn run_inline(
        &self,
        entry: &Arc<InFlight>,
        work: Arc<dyn crate::op::work::OpWork>,
        mut completion: Box<dyn OpCompletion>,
    ) -> Result<usize> {
        let outcome = self.run_on_inline_engine(work.as_ref(), entry.meta.bytes);
        let result = catch_unwind(AssertUnwindSafe(|| completion.finish(outcome)))
            .unwrap_or_else(|payload| Err(finish_panic(&*payload)));
        entry.end_driven();
        self.retire(entry);
        self.record(entry.meta, result.is_ok(), entry.started);
        drop(completion);
        result.map(|()| 1)
    }

    /// [`IoHandle::wait`] in steps of `poll`, calling `between` between
    /// them; see [`IoHandle::submit_blocking_with`]. Finishes every op
    /// admitted before the call.
    pub(crate) fn wait_with(
        &self,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        self.check_process()?;
        self.wait_through(self.admission.last_seq(), false, poll, between)
    }

    /// `pread(buffer, target, file_offset, async)` with DeepSpeed's
    /// meaning: a parallel read, async (returns 0) or blocking (returns the
    /// ops finished). `buffer`'s contract ([`crate::BufferDesc::from_raw_parts`])
    /// holds until the op is finished. The tests' shorthand; the front ends
    /// build an [`OpRequest`] and call [`IoHandle::submit`].
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn pread(
        &self,
        buffer: crate::BufferDesc,
        target: crate::FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        self.submit(OpRequest::new(Direction::Read, target, file_offset, buffer), is_async)
    }

    /// `pwrite(buffer, target, file_offset, async)`: as [`IoHandle::pread`], writing.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn pwrite(
        &self,
        buffer: crate::BufferDesc,
        target: crate::FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        self.submit(OpRequest::new(Direction::Write, target, file_offset, buffer), is_async)
    }

    /// Slice `i` to worker `i % workers`.
    pub(super) fn send_slices(&self, op: &Arc<InFlight>, slices: usize) {
        send_slices(&self.worker_senders(), op, slices);
    }

    /// Waits for every op submitted before the call (from any thread),
    /// finishes those no other call is finishing, and returns how many it finished.
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

}

/// An admitted op, and for one that runs inline, its work and completion.
struct Admitted {
    entry: Arc<InFlight>,
    inline: Option<(Arc<dyn crate::op::work::OpWork>, Box<dyn OpCompletion>)>,
}

/// What the handle runs for a request.
#[must_use = "an op the handle does not run never moves its bytes"]
pub(super) enum HandleOp {
    /// An op for the queue (or, small and blocking, the calling thread).
    Queued(PreparedOp),
    /// A blocking op on bounced memory, streamed through bounce windows.
    Windowed(WindowedOp),
}

