//! An op in flight: the work its slices run, the latch its waiters wait
//! on, its completion, and the earlier ops it must follow.

use std::sync::{Arc, Weak};
use std::time::Instant;

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
