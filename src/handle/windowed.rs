//! Blocking ops streamed through bounce windows on the handle's workers,
//! run by their calling thread as driven ops (`latch.rs`), parked while it
//! runs Python.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::construction::IoHandle;
use super::latch::*;
use super::outcome::{combine, finish_panic};
use super::workers::*;
use crate::error::{Error, Result};
use crate::bounce::read_ahead::ReadAheadMemory;
use crate::bounce::window::{ChunkRunner, Suspended, Windowed, WindowedOp};
use crate::op::work::{OpCompletion, OpMeta, OpWork};

pub(super) fn windowed_meta(op: &WindowedOp) -> OpMeta {
    let bytes = op.len() as u64;
    OpMeta {
        direction: Some(op.direction()),
        bytes,
        bounced_bytes: bytes,
        may_run_inline: false,
        footprint: Some(op.footprint()),
    }
}

/// A windowed op's chunks on the handle's workers. Not queued: the call
/// that runs them waits for each (or, interrupted, queues the op itself as
/// a [`ResumeWindowed`], which owns its runner from then on).
pub(super) struct WorkerChunks {
    pub(super) workers: Vec<Arc<mpsc::Sender<WorkerMsg>>>,
    pub(super) in_flight: VecDeque<Arc<InFlight>>,
}

impl WorkerChunks {
    pub(super) fn new(workers: Vec<Arc<mpsc::Sender<WorkerMsg>>>) -> WorkerChunks {
        WorkerChunks {
            workers,
            in_flight: VecDeque::new(),
        }
    }
}

impl ChunkRunner for WorkerChunks {
    fn depth(&self) -> usize {
        usize::MAX // the op sizes its windows to the handle's queue
    }
    fn start(&mut self, plan: Arc<crate::op::plan::OpPlan>) -> Result<()> {
        let slices = plan.slice_count();
        let op = Arc::new(InFlight::new(plan, None, OpMeta::default(), Vec::new()));
        send_slices(&self.workers, &op, slices);
        self.in_flight.push_back(op);
        Ok(())
    }
    fn finish_oldest(&mut self) -> Result<()> {
        match self.in_flight.pop_front() {
            Some(op) => op.wait_slices(),
            None => Ok(()),
        }
    }
}

impl Drop for WorkerChunks {
    /// The windows must outlive their I/O, whatever ended the op.
    fn drop(&mut self) {
        for op in self.in_flight.drain(..) {
            op.until_slices_done();
        }
    }
}

/// A blocking windowed op, admitted as a driven op (`latch.rs`): the state
/// its calling thread runs it from, parked in its queue entry whenever that
/// thread runs Python, where anyone who must wait for it runs it instead.
pub(super) enum DrivenWindowed {
    NotStarted { op: Box<WindowedOp>, chunks: WorkerChunks, read_ahead: ReadAheadMemory },
    Running(Box<Suspended<WorkerChunks>>),
    Ended(Result<()>),
}

impl DrivenWindowed {
    pub(super) fn new(op: WindowedOp, chunks: WorkerChunks, read_ahead: ReadAheadMemory) -> DrivenWindowed {
        DrivenWindowed::NotStarted { op: Box::new(op), chunks, read_ahead }
    }

    /// Runs the op, calling `between` before each chunk; true once it ended
    /// (its outcome kept), false when `between` failed (suspended).
    pub(super) fn run(&mut self, between: &mut dyn FnMut() -> Result<()>) -> bool {
        let state = std::mem::replace(self, DrivenWindowed::Ended(Ok(())));
        if let DrivenWindowed::Ended(outcome) = state {
            *self = DrivenWindowed::Ended(outcome);
            return true;
        }
        // A panic ends the op with an error naming it (its windows' I/O is
        // waited for as the unwind drops them), never as a success.
        let step = catch_unwind(AssertUnwindSafe(|| match state {
            DrivenWindowed::NotStarted { op, chunks, read_ahead } => (*op).start(chunks, read_ahead, between),
            DrivenWindowed::Running(suspended) => suspended.resume_until(between),
            DrivenWindowed::Ended(_) => unreachable!("handled above"),
        }))
        .unwrap_or_else(|payload| Windowed::Done(Err(finish_panic(&*payload))));
        match step {
            Windowed::Done(outcome) => {
                *self = DrivenWindowed::Ended(outcome);
                true
            }
            Windowed::Suspended(suspended) => {
                *self = DrivenWindowed::Running(suspended);
                false
            }
        }
    }
}

impl OpCompletion for DrivenWindowed {
    /// Runs it to its end here, keeping the outcome.
    fn settle(&mut self, _slices_ok: bool) {
        self.run(&mut || Ok(()));
    }
    fn run_steps(&mut self, between: &mut dyn FnMut() -> Result<()>) -> bool {
        self.run(between)
    }
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        self.run(&mut || Ok(()));
        match std::mem::replace(self, DrivenWindowed::Ended(Ok(()))) {
            DrivenWindowed::Ended(outcome) => outcome,
            _ => Ok(()),
        }
    }
}

/// The `between` of a windowed run on its calling thread: fails (to park
/// the op) once `poll` has passed since the run last parked.
struct YieldEvery {
    poll: Duration,
    since: Instant,
}

impl YieldEvery {
    fn check(&mut self) -> Result<()> {
        if self.since.elapsed() >= self.poll {
            return Err(Error::Interrupted("time to park".into()));
        }
        Ok(())
    }
}

impl IoHandle {
    /// Runs an admitted blocking windowed op on this thread: every op
    /// admitted before it finishes first (a blocking call waits for them,
    /// as DeepSpeed's does), then its windows stream. Every `poll` it parks
    /// the op and runs `between` holding nothing. An error from `between`
    /// ends the call: a read stays parked (the next `wait()` finishes it),
    /// a write runs to its end first (nothing the caller wrote is lost).
    pub(super) fn drive_windowed(
        &self,
        entry: &Arc<InFlight>,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        let writes = entry.meta.direction == Some(crate::Direction::Write);
        let mut interruption: Option<Error> = None;
        let earlier = match self.wait_through(entry.seq - 1, false, poll, between) {
            Err(e @ Error::Interrupted(_)) if writes => {
                interruption = Some(e);
                Ok(0)
            }
            Err(e @ Error::Interrupted(_)) => return Err(e),
            other => other,
        };
        // Whatever ended that wait, the earlier ops on the same file bytes
        // run their slices before this op's chunks start.
        entry.until_predecessors_done();
        loop {
            let Some(mut parked) = entry.take_to_run() else {
                // Someone waiting for it ran it to its end and finished it.
                let outcome = self.until_kept(entry, poll, between, &mut interruption, writes)?;
                return match interruption {
                    Some(e) => Err(e),
                    None => combine(earlier, outcome),
                };
            };
            let mut yielding = YieldEvery { poll, since: Instant::now() };
            let ended = if interruption.is_some() || poll == Duration::MAX {
                parked.run_steps(&mut || Ok(()))
            } else {
                parked.run_steps(&mut || yielding.check())
            };
            if ended {
                let outcome = catch_unwind(AssertUnwindSafe(|| parked.finish(Ok(()))))
                    .unwrap_or_else(|payload| Err(finish_panic(&*payload)));
                entry.end_driven();
                self.retire(entry);
                self.record(entry.meta, outcome.is_ok(), entry.started);
                drop(parked);
                if let Some(e) = interruption {
                    if let Err(failed) = &outcome {
                        crate::rt::log::error(&failed.to_string());
                    }
                    return Err(e);
                }
                return combine(earlier, outcome);
            }
            // Parked: Python may run now, and may use this handle.
            entry.park(parked);
            if let Err(e) = between() {
                if !writes {
                    // A read stays parked: the next wait() finishes it.
                    entry.release_from_caller();
                    return Err(e);
                }
                interruption = Some(e);
            }
        }
    }

    /// The outcome another thread kept for this call when it finished the
    /// op, waited for in steps of `poll` with `between` between them (a read
    /// interrupted meanwhile is left to its finisher).
    fn until_kept(
        &self,
        entry: &Arc<InFlight>,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
        interruption: &mut Option<Error>,
        writes: bool,
    ) -> Result<Result<()>> {
        loop {
            let finished = match Instant::now().checked_add(poll) {
                Some(deadline) => entry.finished_by(deadline),
                None => {
                    entry.until_finished();
                    true
                }
            };
            if finished {
                return Ok(entry.release_from_caller().unwrap_or(Ok(())));
            }
            if interruption.is_none() {
                if let Err(e) = between() {
                    if !writes {
                        if let Some(Err(kept)) = entry.release_from_caller() {
                            crate::rt::log::error(&kept.to_string());
                        }
                        return Err(e);
                    }
                    *interruption = Some(e);
                }
            }
        }
    }
}
