//! A handle's worker threads: the jobs they are sent, the engine each
//! owns, and the stream of queued slices an io_uring worker keeps in
//! flight (`QueuedRuns`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::latch::*;
use crate::engine::choice::{EngineRoute, Routed};
use crate::engine::fixed::RetireListener;
use crate::engine::{self, Engine, EngineKind, Submitter};
use crate::error::{panic_text, Result};
use crate::knobs;
use crate::op::work::Footprint;

/// One slice of one op, sent to a worker. A job dropped without running (a
/// worker that died, a queue torn down) fails its slice, so no `wait()` can
/// hang on it.
pub(super) struct Job {
    pub(super) op: Arc<InFlight>,
    pub(super) slice: usize,
    pub(super) ran: bool,
}

impl Job {
    /// Runs the slice; returns false when it panicked (the engine is then
    /// not to be trusted).
    pub(super) fn run(mut self, engine: &mut dyn Engine) -> bool {
        self.op.until_predecessors_done();
        let (outcome, clean) = match catch_unwind(AssertUnwindSafe(|| {
            self.op.work.run_slice(self.slice, engine)
        })) {
            Ok(outcome) => (outcome, true),
            Err(payload) => {
                // The kernel may still be moving bytes of this slice: the op
                // (and its buffers) may only finish once it has stopped.
                let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                let detail = format!(
                    "internal error (panic) in an I/O worker: {}",
                    panic_text(&*payload)
                );
                (Err(self.op.work.slice_error(self.slice, detail)), false)
            }
        };
        self.complete(outcome);
        clean
    }

    /// Completes the slice with the outcome of its streamed run.
    pub(super) fn complete_streamed(
        &mut self,
        outcome: std::result::Result<(), crate::error::TransferError>,
    ) {
        let outcome = outcome.map_err(|e| self.op.work.stream_error(e));
        self.complete(outcome);
    }

    /// Completes the slice once (a later call, or the drop, does nothing).
    pub(super) fn complete(&mut self, outcome: Result<()>) {
        if !self.ran {
            self.ran = true;
            self.op.complete_slice(outcome);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.ran {
            let e = self.op.work.slice_error(
                self.slice,
                "the I/O worker stopped before running this slice".into(),
            );
            self.op.complete_slice(Err(e));
        }
    }
}

/// What a worker is sent.
pub(super) enum WorkerMsg {
    Run(Job),
    /// Registered memory went away: unregister it (see `engine/fixed.rs`).
    ReleaseRetired,
}

impl RetireListener for mpsc::Sender<WorkerMsg> {
    fn memory_retired(&self) {
        let _ = self.send(WorkerMsg::ReleaseRetired);
    }
}

pub(super) struct Worker {
    /// Shared (as a `Weak`) with the fixed-buffer retire listeners; the
    /// worker ends when this is dropped.
    pub(super) jobs: Option<Arc<mpsc::Sender<WorkerMsg>>>,
    pub(super) thread: Option<JoinHandle<()>>,
}

/// Creates the engine a worker uses; when io_uring cannot be set up for this
/// worker (e.g. a ring hits RLIMIT_MEMLOCK on an old kernel), falls back to
/// psync and says so once. `route`: the engine per file, and the counters.
pub(super) fn worker_engine(
    kind: EngineKind,
    queue_depth: usize,
    submitter: Submitter,
    route: &EngineRoute,
) -> Box<dyn Engine> {
    let engine = match engine::create_for(kind, queue_depth, submitter) {
        Ok(e) => e,
        Err(err) => {
            crate::rt::log::info_once(
                "worker-engine-fallback",
                &format!("{err}; this worker uses the psync engine"),
            );
            Box::new(engine::psync::PsyncEngine::new(queue_depth))
        }
    };
    Box::new(Routed::new(engine, queue_depth, route))
}

/// How a handle's workers streamed ops (the tests read it).
#[derive(Default)]
pub(crate) struct StreamTally {
    /// Runs started while an earlier run of the same ring was unfinished.
    pub overlapped: AtomicU64,
    /// Queued slices that had to wait for the ring to drain because they
    /// share written bytes with a started run.
    pub held_for_order: AtomicU64,
}

pub(super) fn worker_loop(
    kind: EngineKind,
    route: EngineRoute,
    queue_depth: usize,
    jobs: mpsc::Receiver<WorkerMsg>,
    tally: Arc<StreamTally>,
    ready: mpsc::Sender<()>,
) {
    // The worker's engine is made on, and only ever used by, this thread;
    // the handle's constructor waits for it (see `IoHandle::build`).
    let mut engine = worker_engine(kind, queue_depth, Submitter::OneThread, &route);
    let _ = ready.send(());
    drop(ready);
    let stream = knobs::settings().op_stream;
    // A message a stream stopped at, to be taken before the queue's next.
    let mut held_back: Option<WorkerMsg> = None;
    loop {
        let msg = match held_back.take() {
            Some(msg) => msg,
            None => match jobs.recv() {
                Ok(msg) => msg,
                Err(_) => break,
            },
        };
        let job = match msg {
            WorkerMsg::Run(job) => job,
            WorkerMsg::ReleaseRetired => {
                engine.release_retired();
                continue;
            }
        };
        job.op.until_predecessors_done();
        let streamed = if stream && engine.streams_runs() {
            // (a panic here falls back to `run`, which contains it)
            catch_unwind(AssertUnwindSafe(|| job.op.work.stream_run(job.slice))).unwrap_or(None)
        } else {
            None
        };
        let clean = match streamed {
            Some(first) => {
                let mut queued = QueuedRuns::new(&jobs, &tally, (job, first));
                let clean = match catch_unwind(AssertUnwindSafe(|| engine.run_stream(&mut queued)))
                {
                    Ok(()) => true,
                    Err(payload) => {
                        // As for a panicking slice: nothing of the started
                        // runs may be in flight when their ops fail.
                        let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                        let detail = format!(
                            "internal error (panic) in an I/O worker: {}",
                            panic_text(&*payload)
                        );
                        queued.fail_started(&detail);
                        false
                    }
                };
                held_back = queued.held_back.take();
                clean
            }
            None => job.run(engine.as_mut()),
        };
        // A ring that failed (or a run that panicked midway) is not trusted
        // with the next op: start a fresh engine.
        if !clean || engine.is_broken() {
            engine = worker_engine(kind, queue_depth, Submitter::OneThread, &route);
        }
    }
}

/// A worker's queue as the source of its ring's stream: the slice the
/// worker took, then whichever slices are already queued behind it, each
/// started when the ring has room. A queued slice stops the stream (it runs
/// once the ring has drained) when it cannot stream, or when it shares bytes
/// of a file with a started run and one of them writes: ops on the same
/// bytes keep their submission order, as when each op drained the ring.
pub(super) struct QueuedRuns<'a> {
    pub(super) jobs: &'a mpsc::Receiver<WorkerMsg>,
    pub(super) first: Option<(Job, (engine::StreamRun, Footprint))>,
    /// Started and not yet done: (run number, job, what it touches).
    pub(super) started: Vec<(usize, Job, Footprint)>,
    pub(super) next_n: usize,
    pub(super) held_back: Option<WorkerMsg>,
    pub(super) tally: &'a StreamTally,
    /// Jobs whose slices are complete (see `run_done`).
    pub(super) finished: Vec<Job>,
}

impl<'a> QueuedRuns<'a> {
    /// The stream that starts with `first`, the job the worker took.
    pub(super) fn new(
        jobs: &'a mpsc::Receiver<WorkerMsg>,
        tally: &'a StreamTally,
        first: (Job, (engine::StreamRun, Footprint)),
    ) -> Self {
        let (started, finished) = (Vec::new(), Vec::new());
        QueuedRuns {
            jobs,
            first: Some(first),
            started,
            next_n: 0,
            held_back: None,
            tally,
            finished,
        }
    }

    pub(super) fn take_next(&mut self) -> Option<(Job, (engine::StreamRun, Footprint))> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        // A fork waits for this ring's table: start nothing more, so the
        // stream ends (and lets go of it) once its started runs complete.
        if self.held_back.is_some()
            || self.next_n >= knobs::MAX_STREAMED_OPS
            || engine::fixed::fork_pending()
        {
            return None;
        }
        let job = match self.jobs.try_recv() {
            Ok(WorkerMsg::Run(job)) => job,
            Ok(other) => {
                self.held_back = Some(other);
                return None;
            }
            Err(_) => return None,
        };
        if !job.op.predecessors_done() {
            self.tally.held_for_order.fetch_add(1, Ordering::Relaxed);
            self.held_back = Some(WorkerMsg::Run(job));
            return None;
        }
        let run = job.op.work.stream_run(job.slice);
        let conflicts = |fp: &Footprint| self.started.iter().any(|(_, _, s)| s.conflicts_with(fp));
        let blocked = match &run {
            None => true,
            Some((_, fp)) if conflicts(fp) => {
                self.tally.held_for_order.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(_) => false,
        };
        if blocked {
            self.held_back = Some(WorkerMsg::Run(job));
            return None;
        }
        run.map(|run| (job, run))
    }

    /// Fails every started run (after a panic, once the engine is quiet).
    pub(super) fn fail_started(&mut self, detail: &str) {
        for (_, mut job, _) in self.started.drain(..) {
            let e = job.op.work.slice_error(job.slice, detail.to_string());
            job.complete(Err(e));
        }
    }
}

impl engine::StreamSource for QueuedRuns<'_> {
    fn next_run(&mut self) -> Option<engine::StreamRun> {
        let (job, (run, footprint)) = self.take_next()?;
        if !self.started.is_empty() {
            self.tally.overlapped.fetch_add(1, Ordering::Relaxed);
        }
        self.started.push((self.next_n, job, footprint));
        self.next_n += 1;
        Some(run)
    }

    fn run_done(
        &mut self,
        n: usize,
        outcome: std::result::Result<(), crate::error::TransferError>,
    ) {
        if let Some(i) = self.started.iter().position(|(k, _, _)| *k == n) {
            let (_, mut job, _) = self.started.remove(i);
            job.complete_streamed(outcome);
            // Dropped once the stream has ended: the op's last reference to
            // registered memory may go with it, which must not happen while
            // the stream holds its ring's fixed-buffer table.
            self.finished.push(job);
        }
    }
}

/// Slice `i` of `op` to worker `i % workers`. A send to a worker that is
/// gone drops the job, which fails its slice rather than leave the op
/// waiting forever (as does a handle with no worker left).
pub(super) fn send_slices(
    workers: &[Arc<mpsc::Sender<WorkerMsg>>],
    op: &Arc<InFlight>,
    slices: usize,
) {
    for slice in 0..slices {
        let job = Job {
            op: op.clone(),
            slice,
            ran: false,
        };
        if let Some(tx) = workers.get(slice % workers.len().max(1)) {
            let _ = tx.send(WorkerMsg::Run(job));
        }
    }
}
