//! Blocking ops streamed through bounce windows on the handle's workers,
//! and the queued form of one interrupted midway.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;

use super::latch::*;
use super::workers::*;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::op::window::{ChunkRunner, Suspended, WindowedOp};
use crate::op::work::{OpCompletion, OpMeta, OpWork};

pub(super) fn windowed_meta(op: &WindowedOp) -> OpMeta {
    let bytes = op.len() as u64;
    OpMeta {
        direction: Some(op.direction()),
        bytes,
        bounced_bytes: bytes,
        may_run_inline: false,
        footprint: Some(op.footprint()),
        settle_on_conflict: false,
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

/// An interrupted windowed read, queued: the next `wait()` (or a later op
/// on the same memory or file bytes) resumes it to its end, on its thread.
pub(super) struct ResumeWindowed {
    pub(super) suspended: Option<Suspended<WorkerChunks>>,
    pub(super) outcome: Option<Result<()>>,
}

/// The queued form of a suspended op has no slices of its own: its chunks
/// are already with the workers, owned by its runner.
pub(super) struct NoSlices;

impl OpWork for NoSlices {
    fn slice_count(&self) -> usize {
        0
    }
    fn run_slice(&self, _index: usize, _engine: &mut dyn Engine) -> Result<()> {
        Ok(())
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        Error::Engine(format!("slice {index} of a resumed op: {detail}"))
    }
}

impl OpCompletion for ResumeWindowed {
    fn settle(&mut self, _slices_ok: bool) {
        if let Some(op) = self.suspended.take() {
            self.outcome = Some(op.resume());
        }
    }
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        self.settle(true);
        self.outcome.take().unwrap_or(Ok(()))
    }
}
