//! An op in flight: the work its slices run, the latch its waiters wait
//! on, its completion, the earlier ops it must follow, and its place in the
//! handle's order (`order.rs`).
//!
//! A *driven* op (a blocking windowed op, a calling-thread op) has no slices
//! on the workers: the thread that submitted it runs it, and one pseudo-slice
//! stands for the whole run. While that thread runs Python (signal handlers)
//! the op is *parked* in its completion slot, where anyone who must wait for
//! it (a handler calling the same handle, another thread's `wait()` or
//! conflicting submit) takes it and runs it to its end instead of waiting.

use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::op::work::{OpCompletion, OpMeta, OpWork};

/// Completions finished under the handle's `serial` lock, to be dropped
/// once it is let go (dropping one may release a tensor, which can take the GIL).
pub(super) type Finished = Vec<Box<dyn OpCompletion>>;

/// An op in flight: the work the workers read, and the completion latch.
pub(super) struct InFlight {
    pub(super) work: Arc<dyn OpWork>,
    pub(super) meta: OpMeta,
    pub(super) started: Instant,
    pub(super) state: Mutex<SliceTally>,
    pub(super) done: Condvar,
    /// How the op finishes; taken by whoever finishes it.
    pub(super) completion: Mutex<Option<Box<dyn OpCompletion>>>,
    /// Earlier ops on the same file bytes: this op's slices start only
    /// once theirs have all run (ops take effect in submission order). Weak:
    /// an op gone from every queue has run all its slices.
    pub(super) after: Vec<Weak<InFlight>>,
    /// Its place in the order the handle accepted ops (`order.rs`): set when
    /// it is admitted, increasing per handle.
    pub(super) seq: u64,
    /// For a driven op, the thread that runs it.
    pub(super) driver: Option<ThreadId>,
}

pub(super) struct SliceTally {
    pub(super) remaining: usize,
    pub(super) first_error: Option<Error>,
    /// `finish` has run (by whichever thread finished the op).
    pub(super) finished: bool,
}

impl InFlight {
    pub(super) fn new(
        work: Arc<dyn OpWork>,
        completion: Option<Box<dyn OpCompletion>>,
        meta: OpMeta,
        after: Vec<Weak<InFlight>>,
    ) -> Self {
        let remaining = work.slice_count();
        InFlight {
            work,
            meta,
            started: Instant::now(),
            state: Mutex::new(SliceTally {
                remaining,
                first_error: None,
                finished: false,
            }),
            done: Condvar::new(),
            completion: Mutex::new(completion),
            after,
            seq: 0,
            driver: None,
        }
    }

    /// A driven op admitted as `seq`: one pseudo-slice, ended by
    /// [`InFlight::end_driven`]. `parked`: its completion while nobody runs
    /// it (None while its driver does).
    pub(super) fn driven(meta: OpMeta, parked: Option<Box<dyn OpCompletion>>, after: Vec<Weak<InFlight>>) -> Self {
        let mut op = InFlight::new(Arc::new(OneRun), parked, meta, after);
        op.driver = Some(std::thread::current().id());
        op
    }

    /// The driven op's run has ended (once; later calls do nothing).
    pub(super) fn end_driven(&self) {
        let mut st = self.state.lock();
        if st.remaining > 0 {
            st.remaining = 0;
            self.done.notify_all();
        }
    }

    /// Whether this thread runs this driven op (and so cannot wait for it).
    pub(super) fn driven_here(&self) -> bool {
        self.driver == Some(std::thread::current().id())
    }

    /// Blocks until `finish` has run for the op (by whichever thread).
    pub(super) fn until_finished(&self) {
        let mut st = self.state.lock();
        while !st.finished {
            self.done.wait(&mut st);
        }
    }

    /// Whether `finish` has run, waiting until `deadline` at most.
    pub(super) fn finished_by(&self, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        while !st.finished {
            if self.done.wait_until(&mut st, deadline).timed_out() {
                return st.finished;
            }
        }
        true
    }

    /// Runs a parked driven op to its end here (keeping its outcome for
    /// whoever finishes it). False when it is not parked: its driver runs it.
    pub(super) fn drive_if_parked(&self) -> bool {
        let mut slot = self.completion.lock();
        match slot.as_mut() {
            Some(parked) => {
                self.until_predecessors_done();
                parked.settle(true);
                drop(slot);
                self.end_driven();
                true
            }
            None => false,
        }
    }

    /// A later op must come after this driven op: it is run to its end here
    /// if parked, else waited for. Its own driver cannot wait for it (a copy
    /// callback calling back into the handle): that is an error.
    pub(super) fn settle_driven(&self) -> Result<()> {
        loop {
            if self.drive_if_parked() || self.slices_done() {
                return Ok(());
            }
            if self.driven_here() {
                return Err(Error::InvalidArgument(
                    "a call on this handle was made from inside one of its own blocking calls (a copy or callback \
                     it ran), on bytes that call is moving: it cannot wait for itself"
                        .into(),
                ));
            }
            // Its driver may park it at any time (to run signal handlers).
            if self.slices_done_by(Instant::now() + PARKED_RECHECK) {
                return Ok(());
            }
        }
    }

    pub(super) fn slices_done(&self) -> bool {
        self.state.lock().remaining == 0
    }

    /// Blocks until every slice ran; true when none failed.
    pub(super) fn until_slices_done(&self) -> bool {
        let mut st = self.state.lock();
        while st.remaining > 0 {
            self.done.wait(&mut st);
        }
        st.first_error.is_none()
    }

    /// Whether the ops this one must follow have run all their slices.
    pub(super) fn predecessors_done(&self) -> bool {
        self.after
            .iter()
            .all(|op| op.upgrade().is_none_or(|op| op.slices_done()))
    }

    /// Blocks until the ops this one must follow have run all their slices.
    pub(super) fn until_predecessors_done(&self) {
        for op in self.after.iter().filter_map(Weak::upgrade) {
            op.until_slices_done();
        }
    }

    /// Makes everything the op does to the caller's memory happen now: its
    /// slices have run and a bounced read's bytes are copied out (by this
    /// thread, under the ownership rule). Returns once that is so, also
    /// when another thread is finishing the op meanwhile.
    pub(super) fn settle(&self) {
        if self.driver.is_some() {
            // (Its own driver cannot settle it: then nothing is waited for.)
            let _ = self.settle_driven();
            return;
        }
        let ok = self.until_slices_done();
        let mut completion = self.completion.lock();
        match completion.as_mut() {
            Some(c) => c.settle(ok),
            None => {
                drop(completion);
                let mut st = self.state.lock();
                while !st.finished {
                    self.done.wait(&mut st);
                }
            }
        }
    }

    pub(super) fn mark_finished(&self) {
        self.state.lock().finished = true;
        self.done.notify_all();
    }

    pub(super) fn complete_slice(&self, outcome: Result<()>) {
        let mut st = self.state.lock();
        if let Err(e) = outcome {
            st.first_error.get_or_insert(e);
        }
        st.remaining -= 1;
        if st.remaining == 0 {
            self.done.notify_all();
        }
    }

    /// Whether every slice has run, waiting until `deadline` at most.
    pub(super) fn slices_done_by(&self, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        while st.remaining > 0 {
            if self.done.wait_until(&mut st, deadline).timed_out() {
                return st.remaining == 0;
            }
        }
        true
    }

    /// Blocks until every slice ran; returns the first slice error.
    pub(super) fn wait_slices(&self) -> Result<()> {
        let mut st = self.state.lock();
        while st.remaining > 0 {
            self.done.wait(&mut st);
        }
        match st.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How often a wait for a driven op looks whether its driver parked it.
const PARKED_RECHECK: Duration = Duration::from_millis(5);

/// The work of a driven op: its one pseudo-slice is never sent to a worker.
struct OneRun;

impl OpWork for OneRun {
    fn slice_count(&self) -> usize {
        1
    }
    fn run_slice(&self, _index: usize, _engine: &mut dyn crate::engine::Engine) -> Result<()> {
        Ok(())
    }
    fn slice_error(&self, _index: usize, detail: String) -> Error {
        Error::Engine(format!("an op run by its calling thread: {detail}"))
    }
}
