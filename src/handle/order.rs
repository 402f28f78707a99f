//! The handle's one ordering point, and the waits built on its order.
//!
//! Every op a handle runs, from any thread, by any path (async or
//! blocking, queued, windowed or on the calling thread, GDS too) is
//! *admitted* by [`IoHandle::admit`] before any of its bytes move, under
//! the handle's admission lock. The rule it enforces is written in
//! `op/caller.rs` ("Order"); here is how:
//!
//! * admission gives the op the next sequence number: the order in which
//!   the handle accepted ops, one serial order for all threads, consistent
//!   with each thread's own;
//! * before the op is prepared (a bounced write copies the caller's bytes
//!   then), every earlier op that shares its memory, where either fills it,
//!   has had its effect there ([`InFlight::settle`]);
//! * an earlier op that shares file bytes and writes them is either waited
//!   for by the new op's slices (`after`: queued ops behind queued ops, on
//!   the workers' channels in order) or, when it is driven by its calling
//!   thread (a blocking windowed op, a calling-thread op), settled before the
//!   new op is queued, so that no worker ever waits on a thread's run;
//! * a read past the end of its file lets the earlier writes that grow
//!   the file run before its extent is checked (`settle_writes_growing`,
//!   called by `prepare` under the same turn);
//! * a blocking call returns once every op admitted up to its own is
//!   finished, and a `wait()` once every op admitted before it is. An op
//!   another thread submits meanwhile is admitted later, so it takes
//!   effect after the blocking op wherever they share bytes.
//!
//! No lock of the handle is held while Python code may run from here: the
//! waits run `between` (the front ends' signal check, which runs Python's
//! handlers) holding nothing, with a driven op parked (`latch.rs`), so a
//! handler may call any method of the same handle. The admission lock is
//! held only while an op is settled against, prepared and queued; a call
//! back into the handle from inside that (a copier's callback) is refused
//! with an error instead of waiting for itself.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::construction::*;
use super::latch::*;
use super::admission::AdmissionTurn;
use super::outcome::{finish_panic, Errors};
use crate::error::{Error, Result};
use crate::file::FileIdentity;
use crate::op::work::{OpCompletion, OpFootprint, PreparedOp};

#[cfg(any(test, feature = "test-support", feature = "python"))]
thread_local! {
    /// The sequence number of the op this thread had admitted last, for the
    /// model tests, which apply ops in the order the handle accepted them.
    pub(crate) static LAST_ADMITTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// An op to admit, by how it runs.
pub(super) enum Admit {
    /// Its slices go to the workers.
    Queued(PreparedOp),
    /// Its calling thread runs it; `parked`: its completion, when anyone
    /// waiting for it may run it (`latch.rs`), else None (the caller runs it).
    Driven { meta: crate::op::work::OpMeta, parked: Option<Box<dyn OpCompletion>> },
}

impl IoHandle {
    /// Settles every pending op whose footprint `matches` (see
    /// [`InFlight::settle`]); a driven op another thread runs is waited for.
    pub(super) fn settle_matching(&self, matches: impl Fn(&OpFootprint) -> bool) -> Result<()> {
        for op in self.pending_matching(matches) {
            if op.driver.is_some() {
                op.settle_driven()?;
            } else {
                op.settle();
            }
        }
        Ok(())
    }

    /// A read about to be admitted runs past the end of `file`, to `end`:
    /// the writes admitted before it to that file that reach `end` run
    /// first, so that its extent is checked against the file they leave
    /// (the order promises a read after a write of the same bytes sees
    /// them; stock DeepSpeed checks the size at submission only). Writes
    /// that end before `end` cannot make it fit; where they share bytes
    /// with it, the read's slices wait for them (`after`). Called from
    /// `prepare`, with the admission turn held (as memory conflicts are
    /// settled: other submissions on the handle wait meanwhile).
    pub(super) fn settle_writes_growing(&self, file: FileIdentity, end: u64) -> Result<()> {
        self.settle_matching(|fp| !fp.fills_memory && fp.file.is_some_and(|(id, _, e)| id == file && e >= end))
    }

    /// The ordering point: admits an op as the next in the handle's order.
    /// Called with the admission `turn`, after the op's memory conflicts were
    /// settled and the op prepared. Returns its entry in the queue; a queued
    /// op's slices are sent to the workers.
    pub(super) fn admit(&self, _turn: &AdmissionTurn<'_>, op: Admit, for_caller: bool) -> Result<Arc<InFlight>> {
        let meta = match &op {
            Admit::Queued(op) => op.meta,
            Admit::Driven { meta, .. } => *meta,
        };
        // A driven op on the same file bytes is settled now: the workers
        // never wait on a thread's run (its chunks could queue behind them).
        if let (Some(mine), true) = (meta.footprint, self.admission.any_driven()) {
            for op in self.pending_matching(|fp| fp.file_conflicts(&mine)) {
                if op.driver.is_some() {
                    op.settle_driven()?;
                }
            }
        }
        let mut pending = self.pending.lock();
        let after: Vec<Weak<InFlight>> = match &meta.footprint {
            Some(mine) => pending
                .iter()
                .filter(|op| {
                    op.driver.is_none()
                        && !op.slices_done()
                        && op.meta.footprint.as_ref().is_some_and(|fp| fp.file_conflicts(mine))
                })
                .map(Arc::downgrade)
                .collect(),
            None => Vec::new(),
        };
        let (mut entry, slices) = match op {
            Admit::Queued(op) => {
                let slices = op.work.slice_count();
                (InFlight::new(op.work, Some(op.completion), meta, after), Some(slices))
            }
            Admit::Driven { parked, .. } => (InFlight::driven(meta, parked, after), None),
        };
        entry.seq = self.admission.next_seq();
        // Before it is queued: whoever finishes it keeps its result for the call.
        entry.kept_for_caller.store(for_caller, std::sync::atomic::Ordering::Release);
        #[cfg(any(test, feature = "test-support", feature = "python"))]
        LAST_ADMITTED.with(|last| last.set(entry.seq));
        let entry = Arc::new(entry);
        if entry.driver.is_some() {
            self.admission.count_driven(true);
        }
        pending.push_back(entry.clone());
        if let Some(slices) = slices {
            // Under the queue's lock, so every worker sees ops in admission order.
            self.send_slices(&entry, slices);
        }
        Ok(entry)
    }

    /// Takes `op` out of the queue and marks it finished (its waiters wake).
    pub(super) fn retire(&self, op: &Arc<InFlight>) {
        {
            let mut pending = self.pending.lock();
            if let Some(i) = pending.iter().position(|p| Arc::ptr_eq(p, op)) {
                pending.remove(i);
                if op.driver.is_some() {
                    self.admission.count_driven(false);
                }
            }
        }
        op.mark_finished();
    }

    /// Waits, in steps of `poll`, until the I/O of every queued op admitted
    /// up to `last` has ended (without finishing them), calling `between`
    /// after each step that ended with I/O still running; an error from it
    /// ends the wait early, the ops still pending. Holds no lock meanwhile.
    pub(super) fn until_io_idle_through(
        &self,
        last: u64,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        loop {
            let deadline = Instant::now().checked_add(poll);
            loop {
                let running = self
                    .pending
                    .lock()
                    .iter()
                    .find(|op| op.seq <= last && op.driver.is_none() && !op.slices_done())
                    .cloned();
                match (running, deadline) {
                    (None, _) => return Ok(()),
                    (Some(op), None) => _ = op.until_slices_done(),
                    (Some(op), Some(deadline)) if op.slices_done_by(deadline) => continue,
                    (Some(_), Some(_)) => break,
                }
            }
            between()?;
        }
    }

    /// Finishes, in order, every op admitted up to `last` that no other
    /// thread is finishing, and waits for those that one is (a driven op
    /// another thread runs: see `latch.rs`). Returns how many this call
    /// finished (or the first error), with the finished completions, for the
    /// caller to drop once it holds nothing. `between` runs (holding nothing)
    /// between steps of `poll` of waiting for another thread's op.
    pub(super) fn finish_through(
        &self,
        last: u64,
        own: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(Result<usize>, Finished)> {
        let mut completed = 0usize;
        let mut errors = Errors::default();
        let mut finished: Finished = Vec::new();
        loop {
            let next = self.pending.lock().iter().find(|op| op.seq <= last).cloned();
            let Some(op) = next else { break };
            let taken = if op.driver.is_some() { op.take_to_run() } else { op.completion.lock().take() };
            let Some(mut completion) = taken else {
                // Another thread finishes it (or, driven, runs it).
                if op.driven_here() {
                    errors.log_dropped();
                    return Err(Error::InvalidArgument(
                        "a wait on this handle was made from inside one of its own blocking calls (a copy or \
                         callback it ran): it cannot wait for itself"
                            .into(),
                    ));
                }
                loop {
                    match Instant::now().checked_add(poll) {
                        None => op.until_finished(),
                        Some(d) if op.finished_by(d) => {}
                        Some(_) => {
                            if let Err(e) = between() {
                                errors.log_dropped();
                                return Err(e);
                            }
                            continue;
                        }
                    }
                    break;
                }
                continue;
            };
            let outcome = if op.driver.is_some() {
                op.until_predecessors_done();
                Ok(())
            } else {
                op.wait_slices()
            };
            let result = catch_unwind(AssertUnwindSafe(|| completion.finish(outcome)))
                .unwrap_or_else(|payload| Err(finish_panic(&*payload)));
            let result = if own && op.seq == last { Some(result) } else { op.keep_for_caller(result) };
            op.end_driven();
            finished.push(completion);
            self.retire(&op);
            self.record(op.meta, result.as_ref().is_none_or(|r| r.is_ok()), op.started);
            // A result kept for a blocking call is counted and reported there.
            if let Some(result) = result {
                completed += 1;
                if let Err(e) = result {
                    errors.add(e);
                }
            }
        }
        Ok((errors.into_result(completed), finished))
    }

    /// Waits for every op admitted up to `last`, finishes those no other
    /// thread finishes, and returns how many this call finished (`own`: the
    /// op numbered `last` is this blocking call's own).
    pub(super) fn wait_through(
        &self,
        last: u64,
        own: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        let (result, finished) = self.waiting(|| {
            self.until_io_idle_through(last, poll, between)?;
            self.finish_through(last, own, poll, between)
        })?;
        drop(finished);
        result
    }
}
