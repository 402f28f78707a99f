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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::rt::sync::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::op::work::{OpCompletion, OpMeta, OpWork};

/// Completions a call finished, to be dropped
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
    /// For a driven op, the thread that submitted it (and runs it, unless
    /// someone takes it over while it is parked).
    pub(super) driver: Option<ThreadId>,
    /// The thread running the driven op now ([`thread_token`]; 0: parked or done).
    pub(super) runner: AtomicU64,
    /// A blocking call waits for this op: whoever finishes it keeps its
    /// result here for that call, which counts and reports it.
    pub(super) kept_for_caller: AtomicBool,
    pub(super) kept_result: Mutex<Option<Result<()>>>,
}

/// A number for this thread, never 0.
pub(super) fn thread_token() -> u64 {
    static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);
    thread_local! { static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed); }
    TOKEN.with(|t| *t)
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
            runner: AtomicU64::new(0),
            kept_for_caller: AtomicBool::new(false),
            kept_result: Mutex::new(None),
        }
    }

    /// A driven op admitted as `seq`: one pseudo-slice, ended by
    /// [`InFlight::end_driven`]. `parked`: its completion while nobody runs
    /// it (None while its driver does).
    pub(super) fn driven(meta: OpMeta, parked: Option<Box<dyn OpCompletion>>, after: Vec<Weak<InFlight>>) -> Self {
        let runs_here = parked.is_none();
        let mut op = InFlight::new(Arc::new(OneRun), parked, meta, after);
        op.driver = Some(std::thread::current().id());
        if runs_here {
            op.runner.store(thread_token(), Ordering::Release);
        }
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

    /// Whether this thread is running this driven op now (and so cannot
    /// wait for it: a call back into the handle from inside its run).
    pub(super) fn driven_here(&self) -> bool {
        self.runner.load(Ordering::Acquire) == thread_token()
    }

    /// Takes a parked driven op out of its slot to run it on this thread.
    pub(super) fn take_to_run(&self) -> Option<Box<dyn OpCompletion>> {
        let taken = self.completion.lock().take();
        if taken.is_some() {
            self.runner.store(thread_token(), Ordering::Release);
        }
        taken
    }

    /// Parks a driven op again (its runner is about to run Python).
    pub(super) fn park(&self, op: Box<dyn OpCompletion>) {
        self.runner.store(0, Ordering::Release);
        *self.completion.lock() = Some(op);
    }

    /// Whoever finishes an op a blocking call waits for keeps its result for
    /// that call: Some(result) when it was kept, None when the result is the
    /// finisher's to report.
    pub(super) fn keep_for_caller(&self, result: Result<()>) -> Option<Result<()>> {
        if self.kept_for_caller.load(Ordering::Acquire) {
            *self.kept_result.lock() = Some(result);
            None
        } else {
            Some(result)
        }
    }

    /// The blocking call this op was kept for stops waiting for it: a result
    /// already kept is handed back (to be reported), and later ones go to
    /// whoever finishes it.
    pub(super) fn release_from_caller(&self) -> Option<Result<()>> {
        self.kept_for_caller.store(false, Ordering::Release);
        self.kept_result.lock().take()
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
        self.runner.store(0, Ordering::Release);
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
