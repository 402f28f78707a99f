//! The DeepNVMe handle (`deepspeed_io_handle_t` without torch).
//!
//! A handle owns `intra_op_parallelism` worker threads, each with its own
//! engine (its own io_uring ring). A parallel op is cut into one slice per
//! worker; every worker gets its slice, and the op completes when all have
//! run. Ops are kept in submission order; `wait()` finishes them in that
//! order (validation, bounce copy-back, closing the files the handle opened)
//! and returns how many it finished — 0 when nothing was pending.
//!
//! **Order.** Ops on one handle take effect in submission order wherever
//! they share caller memory or file bytes and one of them writes there
//! (`op/caller.rs` states the rule): submitting an op first settles the
//! pending ops on the same memory (their slices end, a bounced read's bytes
//! are copied out, on the submitting thread), and an op's slices start only
//! once earlier ops on the same file bytes have run theirs (`after`). A
//! blocking op on bounced memory larger than a window first finishes every
//! pending op, then streams through the bounce windows (`op/window.rs`).
//!
//! A worker with an io_uring ring streams back-to-back ops (`QueuedRuns`):
//! the slices queued behind the one it runs start in the ring's slots as
//! they free up, instead of after the ring drains, except where a queued
//! slice shares bytes of a file with a started one and either writes.
//!
//! As in DeepSpeed, a blocking call (`sync_*`, `pread/pwrite(async=False)`)
//! submits and then waits for *every* pending op, and returns that count;
//! blocking calls and `wait()` are serialised per handle so that two threads
//! blocking on one handle each get their own count. A small blocking op
//! with nothing pending runs on the calling thread instead (no hand-off to
//! a worker and back): as plain pread/pwrite when it is one block, else on
//! the handle's calling-thread ring. Every ring is made before `new`
//! returns, so a handle holds the same descriptors from `new` to drop.
//!
//! Errors never abort: a failed slice fails its op, and `wait()` reports it
//! after finishing every other op. Dropping a handle finishes what is still
//! in flight (logging any failure), then stops and joins its workers.
//!
//! A handle belongs to the process that created it: in a child made by
//! fork() (which inherits the handle but none of its threads) every call
//! fails at once saying so, and dropping it leaks its parts instead of
//! waiting for threads that do not exist there.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex};

use crate::buffer::{BufferDesc, IoBuffer, Location, Staging};
use crate::config::HandleConfig;
use crate::engine::fixed::RetireListener;
use crate::engine::psync::PsyncEngine;
use crate::engine::{self, Engine, EngineKind, Submitter};
use crate::error::{panic_text, Direction, Error, Result};
use crate::file::FileTarget;
use crate::gds::{GdsDriver, GdsDriverGuard};
use crate::knobs;
use crate::op::checks::check_divisible;
use crate::op::window::{ChunkRunner, Suspended, Windowed, WindowedOp};
use crate::op::work::{Footprint, OpCompletion, OpFootprint, OpMeta, OpWork, PreparedOp};
use crate::op::{CpuOp, Mode, OpRequest, Prepared};
use crate::stats::{self, Counters, OpRecord, Stats};
use crate::pinned::PinnedMemoryManager;

/// Completions finished under the handle's `serial` lock, to be dropped
/// once it is let go (dropping one may release a tensor, which can take the GIL).
type Finished = Vec<Box<dyn OpCompletion>>;

/// An op in flight: the work the workers read, and the completion latch.
struct InFlight {
    work: Arc<dyn OpWork>,
    meta: OpMeta,
    started: Instant,
    state: Mutex<SliceTally>,
    done: Condvar,
    /// How the op finishes; taken by whoever finishes it.
    completion: Mutex<Option<Box<dyn OpCompletion>>>,
    /// Earlier ops on the same file bytes: this op's slices start only
    /// once theirs have all run (ops take effect in submission order). Weak:
    /// an op gone from every queue has run all its slices.
    after: Vec<Weak<InFlight>>,
}

struct SliceTally {
    remaining: usize,
    first_error: Option<Error>,
    /// `finish` has run (by whichever thread finished the op).
    finished: bool,
}

impl InFlight {
    fn new(work: Arc<dyn OpWork>, completion: Option<Box<dyn OpCompletion>>, meta: OpMeta, after: Vec<Weak<InFlight>>) -> Self {
        let remaining = work.slice_count();
        InFlight {
            work,
            meta,
            started: Instant::now(),
            state: Mutex::new(SliceTally { remaining, first_error: None, finished: false }),
            done: Condvar::new(),
            completion: Mutex::new(completion),
            after,
        }
    }

    fn slices_done(&self) -> bool {
        self.state.lock().remaining == 0
    }

    /// Blocks until every slice ran; true when none failed.
    fn until_slices_done(&self) -> bool {
        let mut st = self.state.lock();
        while st.remaining > 0 {
            self.done.wait(&mut st);
        }
        st.first_error.is_none()
    }

    /// Whether the ops this one must follow have run all their slices.
    fn predecessors_done(&self) -> bool {
        self.after.iter().all(|op| op.upgrade().is_none_or(|op| op.slices_done()))
    }

    /// Blocks until the ops this one must follow have run all their slices.
    fn until_predecessors_done(&self) {
        for op in self.after.iter().filter_map(Weak::upgrade) {
            op.until_slices_done();
        }
    }

    /// Makes everything the op does to the caller's memory happen now: its
    /// slices have run and a bounced read's bytes are copied out (by this
    /// thread, under the ownership rule). Returns once that is so, also
    /// when another thread is finishing the op meanwhile.
    fn settle(&self) {
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

    fn mark_finished(&self) {
        self.state.lock().finished = true;
        self.done.notify_all();
    }

    fn complete_slice(&self, outcome: Result<()>) {
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
    fn slices_done_by(&self, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        while st.remaining > 0 {
            if self.done.wait_until(&mut st, deadline).timed_out() {
                return st.remaining == 0;
            }
        }
        true
    }

    /// Blocks until every slice ran; returns the first slice error.
    fn wait_slices(&self) -> Result<()> {
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

/// One slice of one op, sent to a worker. A job dropped without running (a
/// worker that died, a queue torn down) fails its slice, so no `wait()` can
/// hang on it.
struct Job {
    op: Arc<InFlight>,
    slice: usize,
    ran: bool,
}

impl Job {
    /// Runs the slice; returns false when it panicked (the engine is then
    /// not to be trusted).
    fn run(mut self, engine: &mut dyn Engine) -> bool {
        self.op.until_predecessors_done();
        let (outcome, clean) = match catch_unwind(AssertUnwindSafe(|| self.op.work.run_slice(self.slice, engine))) {
            Ok(outcome) => (outcome, true),
            Err(payload) => {
                // The kernel may still be moving bytes of this slice: the op
                // (and its buffers) may only finish once it has stopped.
                let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                let detail = format!("internal error (panic) in an I/O worker: {}", panic_text(&*payload));
                (Err(self.op.work.slice_error(self.slice, detail)), false)
            }
        };
        self.complete(outcome);
        clean
    }

    /// Completes the slice with the outcome of its streamed run.
    fn complete_streamed(&mut self, outcome: std::result::Result<(), crate::error::TransferError>) {
        let outcome = outcome.map_err(|e| self.op.work.stream_error(e));
        self.complete(outcome);
    }

    /// Completes the slice once (a later call, or the drop, does nothing).
    fn complete(&mut self, outcome: Result<()>) {
        if !self.ran {
            self.ran = true;
            self.op.complete_slice(outcome);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.ran {
            let e = self.op.work.slice_error(self.slice, "the I/O worker stopped before running this slice".into());
            self.op.complete_slice(Err(e));
        }
    }
}

/// What a worker is sent.
enum WorkerMsg {
    Run(Job),
    /// Registered memory went away: unregister it (see `engine/fixed.rs`).
    ReleaseRetired,
}

impl RetireListener for mpsc::Sender<WorkerMsg> {
    fn memory_retired(&self) {
        let _ = self.send(WorkerMsg::ReleaseRetired);
    }
}

struct Worker {
    /// Shared (as a `Weak`) with the fixed-buffer retire listeners; the
    /// worker ends when this is dropped.
    jobs: Option<Arc<mpsc::Sender<WorkerMsg>>>,
    thread: Option<JoinHandle<()>>,
}

/// Creates the engine a worker uses; when io_uring cannot be set up for this
/// worker (e.g. a ring hits RLIMIT_MEMLOCK on an old kernel), falls back to
/// psync and says so once.
fn worker_engine(kind: EngineKind, queue_depth: usize, submitter: Submitter) -> Box<dyn Engine> {
    match engine::create_for(kind, queue_depth, submitter) {
        Ok(e) => e,
        Err(err) => {
            crate::log::info_once("worker-engine-fallback", &format!("{err}; this worker uses the psync engine"));
            Box::new(engine::psync::PsyncEngine::new(queue_depth))
        }
    }
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

fn worker_loop(
    kind: EngineKind,
    queue_depth: usize,
    jobs: mpsc::Receiver<WorkerMsg>,
    tally: Arc<StreamTally>,
    ready: mpsc::Sender<()>,
) {
    // The worker's engine is made on, and only ever used by, this thread;
    // the handle's constructor waits for it (see `IoHandle::build`).
    let mut engine = worker_engine(kind, queue_depth, Submitter::OneThread);
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
                let clean = match catch_unwind(AssertUnwindSafe(|| engine.run_stream(&mut queued))) {
                    Ok(()) => true,
                    Err(payload) => {
                        // As for a panicking slice: nothing of the started
                        // runs may be in flight when their ops fail.
                        let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                        let detail = format!("internal error (panic) in an I/O worker: {}", panic_text(&*payload));
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
            engine = worker_engine(kind, queue_depth, Submitter::OneThread);
        }
    }
}

/// A worker's queue as the source of its ring's stream: the slice the
/// worker took, then whichever slices are already queued behind it, each
/// started when the ring has room. A queued slice stops the stream (it runs
/// once the ring has drained) when it cannot stream, or when it shares bytes
/// of a file with a started run and one of them writes: ops on the same
/// bytes keep their submission order, as when each op drained the ring.
struct QueuedRuns<'a> {
    jobs: &'a mpsc::Receiver<WorkerMsg>,
    first: Option<(Job, (engine::StreamRun, Footprint))>,
    /// Started and not yet done: (run number, job, what it touches).
    started: Vec<(usize, Job, Footprint)>,
    next_n: usize,
    held_back: Option<WorkerMsg>,
    tally: &'a StreamTally,
    /// Jobs whose slices are complete (see `run_done`).
    finished: Vec<Job>,
}

impl<'a> QueuedRuns<'a> {
    /// The stream that starts with `first`, the job the worker took.
    fn new(
        jobs: &'a mpsc::Receiver<WorkerMsg>,
        tally: &'a StreamTally,
        first: (Job, (engine::StreamRun, Footprint)),
    ) -> Self {
        let (started, finished) = (Vec::new(), Vec::new());
        QueuedRuns { jobs, first: Some(first), started, next_n: 0, held_back: None, tally, finished }
    }

    fn take_next(&mut self) -> Option<(Job, (engine::StreamRun, Footprint))> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        // A fork waits for this ring's table: start nothing more, so the
        // stream ends (and lets go of it) once its started runs complete.
        if self.held_back.is_some() || self.next_n >= knobs::MAX_STREAMED_OPS || engine::fixed::fork_pending() {
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
    fn fail_started(&mut self, detail: &str) {
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

    fn run_done(&mut self, n: usize, outcome: std::result::Result<(), crate::error::TransferError>) {
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

/// The GPUDirect half of a GDS handle.
struct GdsHalf {
    driver: Arc<GdsDriverGuard>,
    /// DeepSpeed's intra_op_parallelism, applied to cuFile transfers.
    parallelism: usize,
    block_size: usize,
}

/// What a handle does with CUDA buffers.
enum DeviceRoute {
    /// An aio handle: CUDA buffers bounce through host memory.
    Bounce,
    /// A GDS handle: contiguous CUDA buffers go through cuFile.
    Gds(GdsHalf),
    /// A GDS handle made without GPUDirect Storage ([`knobs::GDS_CPU_ONLY_ENV`]):
    /// CUDA buffers are refused, naming why GDS is unavailable.
    GdsUnavailable(String),
}

/// A DeepNVMe I/O handle: `deepspeed_io_handle_t`, or with
/// [`IoHandle::new_gds`], `deepspeed_gds_handle_t`.
///
/// ```
/// use deepnvme::{FileTarget, HandleConfig, IoHandle};
///
/// let dir = std::env::temp_dir().join(format!("deepnvme-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("handle.bin");
/// let handle = IoHandle::new(HandleConfig { intra_op_parallelism: 2, ..HandleConfig::default() })?;
///
/// let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
/// assert_eq!(handle.write_from(&data, FileTarget::Path(&path), 0)?, 1); // one op finished
///
/// let mut back = vec![0u8; data.len()];
/// handle.read_into(&mut back, FileTarget::Path(&path), 0)?;
/// assert_eq!(back, data);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct IoHandle {
    config: HandleConfig,
    engine_kind: EngineKind,
    workers: Vec<Worker>,
    pending: Mutex<VecDeque<Arc<InFlight>>>,
    /// Serialises blocking calls and `wait()` (DeepSpeed's handle mutex).
    serial: Mutex<()>,
    /// Engine of the ops that run on the calling thread (small blocking
    /// ops, `read`/`write`) with more than one request per slice; None only
    /// after it broke, until the next such op makes a new one.
    inline_engine: Mutex<Option<Box<dyn Engine>>>,
    /// Engine of the calling thread's ops of one request per slice: a
    /// pread/pwrite each (see [`IoHandle::run_on_inline_engine`]). Depth 1:
    /// it never starts a thread.
    one_request_engine: Mutex<PsyncEngine>,
    manager: &'static PinnedMemoryManager,
    device_route: DeviceRoute,
    /// What this handle did (the process-wide counters get the same records).
    counters: Counters,
    stream_tally: Arc<StreamTally>,
    /// The process that created the handle. A child made by fork() inherits
    /// the handle but not its worker threads (and shares its rings with the
    /// parent), so every entry point refuses to run in another process.
    creator_pid: u32,
}

/// An async op's buffer, handed back once the op is finished.
///
/// ```
/// use deepnvme::{FileTarget, IoHandle, HandleConfig, LockedBuffer};
///
/// # let dir = std::env::temp_dir().join(format!("deepnvme-doc-pending-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("pending.bin");
/// let handle = IoHandle::new(HandleConfig::default())?;
/// let mut buf = LockedBuffer::new(1 << 20)?;   // page-locked: no bounce copy
/// buf.fill(7);
/// let pending = handle.submit_write(buf, FileTarget::Path(&path), 0)?;
/// assert!(pending.take().is_none());            // in flight: the op owns it
/// assert_eq!(handle.wait()?, 1);
/// let buf = pending.take().expect("finished ops give their buffer back");
/// assert_eq!(buf[0], 7);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pending<B> {
    slot: Arc<Mutex<Option<B>>>,
}

impl<B> Pending<B> {
    /// The buffer, once `wait()` (or dropping the handle) finished its op;
    /// `None` before that, or when it was already taken.
    pub fn take(&self) -> Option<B> {
        self.slot.lock().take()
    }
}

/// The op's hold on an owned buffer: copies for a bounce, and on drop (when
/// the op is finished) hands the buffer to its [`Pending`].
struct OwnedStaging<B: IoBuffer> {
    buffer: Option<B>,
    desc: BufferDesc,
    slot: Arc<Mutex<Option<B>>>,
}

impl<B: IoBuffer> Staging for OwnedStaging<B> {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        let n = self.desc.len().min(bounce.len());
        // SAFETY: the op owns the buffer, whose memory `desc` describes.
        unsafe { std::ptr::copy_nonoverlapping(self.desc.ptr(), bounce.as_mut_ptr(), n) };
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        let n = self.desc.len().min(bounce.len());
        // SAFETY: as above; nothing else can reach the buffer now.
        unsafe { std::ptr::copy_nonoverlapping(bounce.as_ptr(), self.desc.ptr(), n) };
        Ok(())
    }
}

impl<B: IoBuffer> Drop for OwnedStaging<B> {
    fn drop(&mut self) {
        *self.slot.lock() = self.buffer.take();
    }
}

fn resolve_engine(config: &HandleConfig) -> Result<EngineKind> {
    match config.engine {
        Some(EngineKind::Uring) => {
            engine::io_uring_status().map_err(|why| Error::Engine(format!("io_uring is unavailable: {why}")))?;
            Ok(EngineKind::Uring)
        }
        Some(k) => Ok(k),
        None => engine::default_kind(),
    }
}

impl IoHandle {
    /// An aio handle: `intra_op_parallelism` workers, each with its engine.
    pub fn new(config: HandleConfig) -> Result<IoHandle> {
        Self::build(config, DeviceRoute::Bounce)
    }

    /// A GDS handle (`deepspeed_gds_handle_t`): contiguous CUDA buffers go
    /// through cuFile with `intra_op_parallelism` threads; everything else
    /// takes the CPU path on one worker, as in DeepSpeed. Without GPUDirect
    /// Storage this fails naming what is missing, unless
    /// [`knobs::GDS_CPU_ONLY_ENV`]`=1`, which makes a handle that serves
    /// CPU buffers only. May block (cuFile driver open).
    pub fn new_gds(config: HandleConfig) -> Result<IoHandle> {
        config.validate()?;
        let cpu_config = HandleConfig { intra_op_parallelism: 1, ..config.clone() };
        if let Err(why) = crate::gds::probe() {
            let why = why.to_string();
            if !knobs::settings().gds_cpu_only {
                return Err(crate::gds::unavailable(format!(
                    "gds_handle cannot be created: {why} (set {}=1 for a handle that serves CPU tensors only)",
                    knobs::GDS_CPU_ONLY_ENV
                )));
            }
            crate::log::info_once(
                "gds-cpu-only",
                &format!(
                    "gds_handle without GPUDirect Storage ({why}); {}=1, so it serves CPU tensors only",
                    knobs::GDS_CPU_ONLY_ENV
                ),
            );
            return Self::build(cpu_config, DeviceRoute::GdsUnavailable(why));
        }
        let driver = GdsDriver::acquire(config.queue_depth, config.intra_op_parallelism, config.block_size)?;
        let gds = GdsHalf {
            driver: Arc::new(driver),
            parallelism: config.intra_op_parallelism,
            block_size: config.block_size,
        };
        Self::build(cpu_config, DeviceRoute::Gds(gds))
    }

    fn build(config: HandleConfig, device_route: DeviceRoute) -> Result<IoHandle> {
        config.validate()?;
        stats::report_at_exit_if_asked();
        let engine_kind = resolve_engine(&config)?;
        let mut workers = Vec::with_capacity(config.intra_op_parallelism);
        let stream_tally = Arc::new(StreamTally::default());
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        for index in 0..config.intra_op_parallelism {
            let (tx, rx) = mpsc::channel::<WorkerMsg>();
            let qd = config.queue_depth;
            let tally = stream_tally.clone();
            let ready = ready_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("deepnvme-io-{index}"))
                .spawn(move || worker_loop(engine_kind, qd, rx, tally, ready))
                .map_err(|e| Error::Engine(format!("spawning I/O worker {index}: {e}")))?;
            let tx = Arc::new(tx);
            if engine_kind == EngineKind::Uring {
                let listener: Arc<dyn RetireListener> = tx.clone();
                crate::engine::fixed::add_retire_listener(Arc::downgrade(&listener));
            }
            workers.push(Worker { jobs: Some(tx), thread: Some(thread) });
        }
        // Every worker has made its engine (its ring, its fds) before the
        // handle is handed out: what a new handle holds is then fixed when
        // `new` returns, not some moment later (a caller that counts its
        // descriptors, or forks, sees all of them), and a ring that cannot
        // be made is logged here. A worker that died first drops its sender.
        drop(ready_tx);
        for index in 0..workers.len() {
            if ready_rx.recv().is_err() {
                return Err(Error::Engine(format!("I/O worker {index} of {} ended while starting", workers.len())));
            }
        }
        // Made now, like the workers' rings, so that a handle holds the same
        // descriptors from `new` to drop (not one more after its first
        // blocking op of more than one block).
        let inline_engine = worker_engine(engine_kind, config.queue_depth, Submitter::AnyThread);
        Ok(IoHandle {
            config,
            engine_kind,
            workers,
            pending: Mutex::new(VecDeque::new()),
            serial: Mutex::new(()),
            inline_engine: Mutex::new(Some(inline_engine)),
            one_request_engine: Mutex::new(PsyncEngine::new(1)),
            manager: PinnedMemoryManager::shared(),
            device_route,
            counters: Counters::new(),
            stream_tally,
            creator_pid: std::process::id(),
        })
    }

    /// True in a child made by fork() after the handle was created.
    fn forked(&self) -> bool {
        std::process::id() != self.creator_pid
    }

    /// Refuses at once in a process other than the one that made the handle:
    /// its workers do not exist there, so a call would wait forever.
    fn check_process(&self) -> Result<()> {
        if self.forked() {
            return Err(Error::Engine(format!(
                "this handle was created in process {} and cannot be used in process {} after fork(): \
                 its I/O threads do not exist in the child; create a new handle in the child",
                self.creator_pid,
                std::process::id()
            )));
        }
        Ok(())
    }

    /// The knobs the CPU path runs with (a GDS handle's CPU path has one worker).
    pub fn config(&self) -> &HandleConfig {
        &self.config
    }
    pub fn engine_kind(&self) -> EngineKind {
        self.engine_kind
    }

    /// The pinned-memory manager this handle recognises (the process's).
    pub fn manager(&self) -> &'static PinnedMemoryManager {
        self.manager
    }

    /// `handle.is_pinned(buffer)`: declared pinned, or inside a managed region.
    pub fn is_pinned(&self, buffer: &BufferDesc) -> bool {
        buffer.is_host() && (buffer.is_declared_pinned() || self.manager.is_managed(buffer.ptr(), buffer.len()))
    }

    /// Number of ops submitted and not yet finished by `wait()`.
    pub fn pending_ops(&self) -> usize {
        self.pending.lock().len()
    }

    /// Builds the op for a request: contiguous CUDA buffers on a GDS handle
    /// go through cuFile; everything else through the CPU path (bouncing
    /// what cannot be used directly).
    fn prepare(&self, request: OpRequest<'_>, mode: Mode) -> Result<HandleOp> {
        match (&self.device_route, request.buffer.location()) {
            (DeviceRoute::Gds(gds), Location::Cuda(_)) if request.buffer.is_contiguous() => {
                crate::gds::op::prepare(&gds.driver, request, gds.parallelism, gds.block_size).map(HandleOp::Queued)
            }
            (DeviceRoute::GdsUnavailable(why), Location::Cuda(_)) => {
                Err(crate::gds::unavailable(format!("this gds_handle has no GPUDirect Storage: {why}")))
            }
            _ => {
                let parallelism = self.config.intra_op_parallelism;
                let b = &request.buffer;
                check_divisible(request.direction, b.len(), request.file_offset, &request.target, parallelism)?;
                Ok(match CpuOp::prepare(request, parallelism, self.config.transfer_knobs(), self.manager, mode)? {
                    Prepared::Op(op) => HandleOp::Queued(op.into()),
                    Prepared::Windowed(op) => HandleOp::Windowed(op),
                })
            }
        }
    }

    /// Before an op on `request`'s memory is prepared: every pending op
    /// that shares that memory, where either fills it, has its effect on it
    /// now (see [`InFlight::settle`]), so that the new op's copies and I/O
    /// come after the earlier op's, in submission order.
    fn settle_memory_conflicts(&self, request: &OpRequest<'_>) {
        let b = &request.buffer;
        let mine = OpFootprint::of_memory(b.ptr() as usize, b.len(), request.direction == Direction::Read);
        for op in self.pending_matching(|fp| fp.memory_conflicts(&mine)) {
            op.settle();
        }
    }

    /// The pending ops whose footprint matches (a snapshot of the queue).
    fn pending_matching(&self, matches: impl Fn(&OpFootprint) -> bool) -> Vec<Arc<InFlight>> {
        self.pending.lock().iter().filter(|op| op.meta.footprint.as_ref().is_some_and(&matches)).cloned().collect()
    }

    /// `pread`/`pwrite`/`async_*`/`sync_*`: submits a parallel op. With
    /// `is_async` returns 0 at once; otherwise waits for every pending op and
    /// returns how many finished. The buffer's [`BufferDesc`] contract holds
    /// until the op is finished.
    pub fn submit(&self, request: OpRequest<'_>, is_async: bool) -> Result<usize> {
        self.submit_blocking_with(request, is_async, Duration::MAX, &mut || Ok(()))
    }

    /// Dispatches a prepared op: with `is_async` returns 0 at once;
    /// otherwise waits for every pending op and returns how many finished.
    /// Slice `i` runs on worker `i % workers`.
    #[cfg_attr(not(test), allow(dead_code))] // the internal tests run their own work
    pub(crate) fn dispatch_prepared(&self, op: PreparedOp, is_async: bool) -> Result<usize> {
        self.check_process()?;
        self.run_prepared(HandleOp::Queued(op), is_async, Duration::MAX, &mut || Ok(()))
    }

    fn run_prepared(
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
                    match op.start(WorkerChunks::new(self), between) {
                        Windowed::Done(outcome) => {
                            self.record(meta, outcome.is_ok(), started);
                            (combine(earlier, outcome), finished)
                        }
                        Windowed::Suspended(mut suspended) => {
                            // Interrupted: the rest waits for the next wait().
                            let interruption = suspended.take_interruption();
                            let meta = OpMeta { footprint: Some(suspended.footprint()), settle_on_conflict: true, ..meta };
                            let resume = ResumeWindowed { suspended: Some(suspended), outcome: None };
                            self.dispatch(PreparedOp { work: Arc::new(NoSlices), completion: Box::new(resume), meta });
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
    fn run_inline(&self, op: PreparedOp) -> std::result::Result<(Result<usize>, Finished), PreparedOp> {
        if !op.meta.may_run_inline || op.meta.bytes > knobs::INLINE_MAX_BYTES as u64 || !self.pending.lock().is_empty()
        {
            return Err(op);
        }
        let started = Instant::now();
        let PreparedOp { work, mut completion, meta } = op;
        let outcome = self.run_on_inline_engine(work.as_ref(), meta.bytes);
        let result = completion.finish(outcome);
        self.record(meta, result.is_ok(), started);
        Ok((result.map(|()| 1), vec![completion]))
    }

    /// Waits, in steps of `poll`, until the I/O of every op submitted so
    /// far has ended (without finishing them), calling `between` after each
    /// step that ended with I/O still running. An error from `between` ends
    /// the wait early, the ops still pending.
    fn until_io_idle(&self, poll: Duration, between: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        loop {
            let deadline = Instant::now().checked_add(poll);
            // The first op still running, if any (no list copied per step).
            loop {
                let running = self.pending.lock().iter().find(|op| !op.slices_done()).cloned();
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
    pub fn submit_blocking_with(
        &self,
        request: OpRequest<'_>,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        self.check_process()?;
        self.settle_memory_conflicts(&request);
        let mode = if is_async { Mode::Async } else { Mode::Blocking };
        let op = self.prepare(request, mode)?;
        self.run_prepared(op, is_async, poll, between)
    }

    /// [`IoHandle::wait`] in steps of `poll`, calling `between` between
    /// them; see [`IoHandle::submit_blocking_with`].
    pub fn wait_with(&self, poll: Duration, between: &mut dyn FnMut() -> Result<()>) -> Result<usize> {
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
    pub fn pread(&self, buffer: BufferDesc, target: FileTarget<'_>, file_offset: i64, is_async: bool) -> Result<usize> {
        self.submit(OpRequest::new(Direction::Read, target, file_offset, buffer), is_async)
    }

    /// `pwrite(buffer, target, file_offset, async)`: as [`IoHandle::pread`], writing.
    pub fn pwrite(&self, buffer: BufferDesc, target: FileTarget<'_>, file_offset: i64, is_async: bool) -> Result<usize> {
        self.submit(OpRequest::new(Direction::Write, target, file_offset, buffer), is_async)
    }

    /// A blocking parallel read of `buffer.len()` bytes at `file_offset`;
    /// returns how many ops finished (this one and any earlier async ones).
    pub fn read_into(&self, buffer: &mut [u8], target: FileTarget<'_>, file_offset: u64) -> Result<usize> {
        // SAFETY: the borrow outlives this blocking call, which returns only
        // after every pending op (this one included) has finished.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_mut_ptr(), buffer.len()) };
        self.submit(OpRequest::new(Direction::Read, target, offset_arg(file_offset)?, desc), false)
    }

    /// A blocking parallel write of `buffer` at `file_offset`; returns how
    /// many ops finished (this one and any earlier async ones).
    pub fn write_from(&self, buffer: &[u8], target: FileTarget<'_>, file_offset: u64) -> Result<usize> {
        // SAFETY: as in `read_into`; a write only reads the memory.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_ptr() as *mut u8, buffer.len()) };
        self.submit(OpRequest::new(Direction::Write, target, offset_arg(file_offset)?, desc), false)
    }

    /// An async parallel read into `buffer`, which the op owns until `wait()`
    /// finishes it; [`Pending::take`] then gives it back. On an error the
    /// buffer is dropped.
    pub fn submit_read<B: IoBuffer>(&self, buffer: B, target: FileTarget<'_>, file_offset: u64) -> Result<Pending<B>> {
        self.submit_owned(Direction::Read, buffer, target, file_offset)
    }

    /// An async parallel write of `buffer` (owned by the op until `wait()`
    /// finishes it, then given back by [`Pending::take`]).
    pub fn submit_write<B: IoBuffer>(&self, buffer: B, target: FileTarget<'_>, file_offset: u64) -> Result<Pending<B>> {
        self.submit_owned(Direction::Write, buffer, target, file_offset)
    }

    fn submit_owned<B: IoBuffer>(
        &self,
        direction: Direction,
        mut buffer: B,
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<Pending<B>> {
        let desc = buffer.io_desc();
        let slot = Arc::new(Mutex::new(None));
        let hold = OwnedStaging { buffer: Some(buffer), desc, slot: slot.clone() };
        let request = OpRequest {
            direction,
            target,
            file_offset: offset_arg(file_offset)?,
            buffer: desc,
            staging: Some(Box::new(hold)),
            validate: false,
        };
        self.submit(request, true)?;
        Ok(Pending { slot })
    }

    /// Queues an op and hands its slices to the workers. Its slices wait
    /// for those of earlier pending ops on the same file bytes.
    fn dispatch(&self, op: PreparedOp) {
        if let Some(mine) = &op.meta.footprint {
            for earlier in self.pending_matching(|fp| fp.conflicts(mine)) {
                if earlier.meta.settle_on_conflict {
                    earlier.settle();
                }
            }
        }
        let PreparedOp { work, completion, meta } = op;
        let slices = work.slice_count();
        // Queue and hand out under one lock, so every worker sees ops in the
        // order `wait()` finishes them.
        let mut pending = self.pending.lock();
        let after: Vec<Weak<InFlight>> = match &meta.footprint {
            Some(mine) => pending
                .iter()
                .filter(|op| !op.slices_done() && op.meta.footprint.as_ref().is_some_and(|fp| fp.conflicts(mine)))
                .map(Arc::downgrade)
                .collect(),
            None => Vec::new(),
        };
        let in_flight = Arc::new(InFlight::new(work, Some(completion), meta, after));
        pending.push_back(in_flight.clone());
        self.send_slices(&in_flight, slices);
    }

    /// Slice `i` to worker `i % workers`.
    fn send_slices(&self, op: &Arc<InFlight>, slices: usize) {
        let workers: Vec<Arc<mpsc::Sender<WorkerMsg>>> = self.workers.iter().filter_map(|w| w.jobs.clone()).collect();
        send_slices(&workers, op, slices);
    }

    /// Waits for every pending op, finishes each, and returns how many.
    pub fn wait(&self) -> Result<usize> {
        self.wait_with(Duration::MAX, &mut || Ok(()))
    }

    /// Runs a call that blocks for I/O, counting the time it took as time
    /// the caller waited (see `Stats::wait_time`).
    fn waiting<T>(&self, call: impl FnOnce() -> T) -> T {
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
    fn wait_locked(&self) -> (Result<usize>, Vec<Box<dyn OpCompletion>>) {
        let mut completed = 0usize;
        let mut errors = Errors::default();
        let mut finished = Vec::new();
        loop {
            // The op stays queued until it is finished: an op submitted
            // meanwhile on the same memory (from another thread) must see it
            // to settle after it (only this call, under `serial`, removes ops).
            let Some(op) = self.pending.lock().front().cloned() else { break };
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
            debug_assert!(removed.is_some_and(|r| Arc::ptr_eq(&r, &op)), "ops leave the queue in order");
            completed += 1;
            self.record(op.meta, result.is_ok(), op.started);
            if let Err(e) = result {
                errors.add(e);
            }
        }
        (errors.into_result(completed), finished)
    }

    /// `read`/`write`: one synchronous, unsplit transfer on the calling
    /// thread (always through the CPU path, bouncing device memory). It
    /// takes effect after the pending ops it shares memory or file bytes with.
    pub fn transfer_inline(&self, request: OpRequest<'_>) -> Result<()> {
        self.check_process()?;
        self.waiting(|| {
            self.settle_memory_conflicts(&request);
            let started = Instant::now();
            match CpuOp::prepare(request, 1, self.config.transfer_knobs(), self.manager, Mode::Blocking)? {
                Prepared::Op(mut op) => {
                    let meta = op.meta();
                    if let Some(mine) = meta.footprint {
                        for earlier in self.pending_matching(|fp| fp.conflicts(&mine)) {
                            match earlier.meta.settle_on_conflict {
                                true => earlier.settle(),
                                false => _ = earlier.until_slices_done(),
                            }
                        }
                    }
                    let plan = op.plan().clone();
                    let outcome = self.run_on_inline_engine(plan.as_ref(), meta.bytes);
                    let result = op.finish(outcome);
                    self.record(meta, result.is_ok(), started);
                    result
                }
                Prepared::Windowed(op) => {
                    let meta = windowed_meta(&op);
                    let mine = op.footprint();
                    for earlier in self.pending_matching(|fp| fp.conflicts(&mine)) {
                        match earlier.meta.settle_on_conflict {
                            true => earlier.settle(),
                            false => _ = earlier.until_slices_done(),
                        }
                    }
                    let mut slot = self.inline_engine.lock();
                    let engine = slot
                        .get_or_insert_with(|| worker_engine(self.engine_kind, self.config.queue_depth, Submitter::AnyThread));
                    let outcome = run_windowed_inline(op, engine.as_mut());
                    if engine.is_broken() {
                        *slot = None;
                    }
                    self.record(meta, outcome.is_ok(), started);
                    outcome
                }
            }
        })
    }

    /// Runs every slice of `work` (an op of `bytes`) on the calling thread.
    /// An op of at most one block has one request per slice: a
    /// pread/pwrite is one syscall that sleeps until the data is there,
    /// where an io_uring round trip adds a completion wake-up and a reap.
    /// Larger ops use the handle's inline engine (made in `new`, replaced
    /// once it cannot be trusted).
    fn run_on_inline_engine(&self, work: &dyn OpWork, bytes: u64) -> Result<()> {
        if bytes <= self.config.block_size as u64 {
            return run_guarded(work, &mut *self.one_request_engine.lock());
        }
        let mut slot = self.inline_engine.lock();
        let engine =
            slot.get_or_insert_with(|| worker_engine(self.engine_kind, self.config.queue_depth, Submitter::AnyThread));
        let outcome = run_guarded(work, engine.as_mut());
        if engine.is_broken() {
            *slot = None;
        }
        outcome
    }

    /// One unsplit synchronous transfer on the calling thread with `config`'s
    /// knobs, without a handle (DeepSpeed's `aio_read`/`aio_write`): no
    /// worker threads are started; the engine is kept per calling thread and
    /// reused by its next call.
    pub fn transfer_once(config: &HandleConfig, request: OpRequest<'_>) -> Result<()> {
        config.validate()?;
        let kind = resolve_engine(config)?;
        let started = Instant::now();
        let manager = PinnedMemoryManager::shared();
        let (meta, result) = match CpuOp::prepare(request, 1, config.transfer_knobs(), manager, Mode::Blocking)? {
            Prepared::Op(mut op) => {
                let meta = op.meta();
                let plan = op.plan().clone();
                let outcome = with_thread_engine(kind, config.queue_depth, |engine| run_guarded(plan.as_ref(), engine));
                (meta, op.finish(outcome))
            }
            Prepared::Windowed(op) => {
                let meta = windowed_meta(&op);
                let outcome = with_thread_engine(kind, config.queue_depth, |engine| run_windowed_inline(op, engine));
                (meta, outcome)
            }
        };
        stats::process_counters().record_wait(started.elapsed());
        stats::process_counters().record(&OpRecord {
            direction: meta.direction,
            bytes: meta.bytes,
            bounced_bytes: meta.bounced_bytes,
            ok: result.is_ok(),
            latency: started.elapsed(),
        });
        result
    }

    fn record(&self, meta: OpMeta, ok: bool, started: Instant) {
        let record = OpRecord {
            direction: meta.direction,
            bytes: meta.bytes,
            bounced_bytes: meta.bounced_bytes,
            ok,
            latency: started.elapsed(),
        };
        self.counters.record(&record);
        stats::process_counters().record(&record);
    }

    /// How its workers streamed ops: (runs started while an earlier one was
    /// unfinished, slices held back to keep the order of ops on the same
    /// bytes).
    #[cfg_attr(not(test), allow(dead_code))] // read by the internal tests
    pub(crate) fn stream_counts(&self) -> (u64, u64) {
        (self.stream_tally.overlapped.load(Ordering::Relaxed), self.stream_tally.held_for_order.load(Ordering::Relaxed))
    }

    /// What this handle did so far: ops, bytes, bounced bytes, failures,
    /// latency (see [`crate::stats`]).
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// GDS handles: registers a CUDA buffer with cuFile
    /// (`pin_device_tensor`), so transfers into any part of it avoid
    /// cuFile's bounce buffers. May block.
    pub fn register_device_buffer(&self, buffer: &BufferDesc) -> Result<()> {
        self.check_process()?;
        let gds = self.gds_half()?;
        if !matches!(buffer.location(), Location::Cuda(_)) || buffer.ptr().is_null() {
            return Err(Error::InvalidArgument("pin_device_tensor takes a CUDA tensor".into()));
        }
        gds.driver.register_device_buffer(buffer.ptr() as u64, buffer.len())
    }

    /// GDS handles: deregisters the region based at `base`
    /// (`unpin_device_tensor`); `Ok(false)` when none was registered there.
    pub fn deregister_device_buffer(&self, base: *const u8) -> Result<bool> {
        self.check_process()?;
        let gds = self.gds_half()?;
        if base.is_null() {
            return Ok(false);
        }
        gds.driver.deregister_device_buffer(base as u64)
    }

    fn gds_half(&self) -> Result<&GdsHalf> {
        match &self.device_route {
            DeviceRoute::Gds(g) => Ok(g),
            DeviceRoute::GdsUnavailable(why) => {
                Err(crate::gds::unavailable(format!("this gds_handle has no GPUDirect Storage: {why}")))
            }
            DeviceRoute::Bounce => {
                Err(crate::gds::unavailable("device tensors can only be registered through a gds_handle".into()))
            }
        }
    }
}

/// What the handle runs for a request.
enum HandleOp {
    /// An op for the queue (or, small and blocking, the calling thread).
    Queued(PreparedOp),
    /// A blocking op on bounced memory, streamed through bounce windows.
    Windowed(WindowedOp),
}

fn windowed_meta(op: &WindowedOp) -> OpMeta {
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
struct WorkerChunks {
    workers: Vec<Arc<mpsc::Sender<WorkerMsg>>>,
    in_flight: VecDeque<Arc<InFlight>>,
}

impl WorkerChunks {
    fn new(handle: &IoHandle) -> WorkerChunks {
        WorkerChunks { workers: handle.workers.iter().filter_map(|w| w.jobs.clone()).collect(), in_flight: VecDeque::new() }
    }
}

impl ChunkRunner for WorkerChunks {
    fn depth(&self) -> usize {
        knobs::BOUNCE_WINDOWS
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

/// Slice `i` of `op` to worker `i % workers`. A send to a worker that is
/// gone drops the job, which fails its slice rather than leave the op
/// waiting forever (as does a handle with no worker left).
fn send_slices(workers: &[Arc<mpsc::Sender<WorkerMsg>>], op: &Arc<InFlight>, slices: usize) {
    for slice in 0..slices {
        let job = Job { op: op.clone(), slice, ran: false };
        if let Some(tx) = workers.get(slice % workers.len().max(1)) {
            let _ = tx.send(WorkerMsg::Run(job));
        }
    }
}

/// An interrupted windowed read, queued: the next `wait()` (or a later op
/// on the same memory or file bytes) resumes it to its end, on its thread.
struct ResumeWindowed {
    suspended: Option<Suspended<WorkerChunks>>,
    outcome: Option<Result<()>>,
}

/// The queued form of a suspended op has no slices of its own: its chunks
/// are already with the workers, owned by its runner.
struct NoSlices;

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

/// A windowed op's chunks on the calling thread's engine, one at a time.
struct InlineChunks<'a> {
    engine: &'a mut dyn Engine,
    last: Option<Result<()>>,
}

impl ChunkRunner for InlineChunks<'_> {
    fn depth(&self) -> usize {
        1
    }
    fn start(&mut self, plan: Arc<crate::op::plan::OpPlan>) -> Result<()> {
        self.last = Some(run_guarded(plan.as_ref(), self.engine));
        Ok(())
    }
    fn finish_oldest(&mut self) -> Result<()> {
        self.last.take().unwrap_or(Ok(()))
    }
}

/// Runs a windowed op on the calling thread's engine (never interrupted).
fn run_windowed_inline(op: WindowedOp, engine: &mut dyn Engine) -> Result<()> {
    match op.start(InlineChunks { engine, last: None }, &mut || Ok(())) {
        Windowed::Done(outcome) => outcome,
        Windowed::Suspended(suspended) => suspended.resume(),
    }
}

/// The errors of the ops one call finished: the first, and how many more.
#[derive(Default)]
struct Errors {
    first: Option<Error>,
    more: usize,
}

impl Errors {
    fn add(&mut self, e: Error) {
        if self.first.is_none() {
            self.first = Some(e);
        } else {
            self.more += 1;
        }
    }
    fn into_result(self, completed: usize) -> Result<usize> {
        match self.first {
            None => Ok(completed),
            Some(e) if self.more == 0 => Err(e),
            Some(e) => Err(Error::Many { first: Box::new(e), more: self.more }),
        }
    }
}

/// What a blocking windowed call returns: the earlier ops finished first,
/// and the windowed op itself.
fn combine(earlier: Result<usize>, this: Result<()>) -> Result<usize> {
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

/// Runs an op's slices in order on the calling thread, stopping at the
/// first error. A panic fails the op, after the engine has stopped moving
/// its bytes (a ring is then marked broken, and replaced by its owner).
fn run_guarded(work: &dyn OpWork, engine: &mut dyn Engine) -> Result<()> {
    for slice in 0..work.slice_count() {
        match catch_unwind(AssertUnwindSafe(|| work.run_slice(slice, engine))) {
            Ok(outcome) => outcome?,
            Err(payload) => {
                let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                return Err(Error::Engine(format!("internal error (panic) in a transfer: {}", panic_text(&*payload))));
            }
        }
    }
    Ok(())
}

/// The calling thread's engine for one-shot transfers: (process, kind, queue
/// depth, engine). A different kind or depth replaces it; so does a fork
/// (the child's thread would share the parent's ring: it is leaked, never
/// used, never torn down in the child).
type ThreadEngine = Option<(u32, EngineKind, usize, Box<dyn Engine>)>;

thread_local! {
    static THREAD_ENGINE: std::cell::RefCell<ThreadEngine> = const { std::cell::RefCell::new(None) };
}

fn with_thread_engine<T>(kind: EngineKind, queue_depth: usize, f: impl FnOnce(&mut dyn Engine) -> T) -> T {
    let pid = std::process::id();
    THREAD_ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let reusable = matches!(&*slot, Some((p, k, q, e)) if *p == pid && *k == kind && *q == queue_depth && !e.is_broken());
        if !reusable {
            if let Some((p, _, _, engine)) = slot.take() {
                if p != pid {
                    std::mem::forget(engine);
                }
            }
            *slot = Some((pid, kind, queue_depth, worker_engine(kind, queue_depth, Submitter::AnyThread)));
        }
        let (_, _, _, engine) = slot.as_mut().expect("thread engine");
        f(engine.as_mut())
    })
}

/// File offsets are `i64` in DeepSpeed's API; the safe calls take `u64`.
fn offset_arg(file_offset: u64) -> Result<i64> {
    i64::try_from(file_offset)
        .map_err(|_| Error::InvalidArgument(format!("file_offset {file_offset} is beyond the largest file offset")))
}

impl Drop for IoHandle {
    fn drop(&mut self) {
        if self.forked() {
            // A child of fork(): the workers are threads of the parent, so
            // joining them would wait forever, and the rings, the pending
            // ops and the GDS driver belong to the parent. Leak all of it
            // (memory only); the parent's handle is untouched.
            std::mem::forget(std::mem::take(&mut self.workers));
            std::mem::forget(std::mem::take(self.pending.get_mut()));
            std::mem::forget(self.inline_engine.get_mut().take());
            std::mem::forget(std::mem::replace(&mut self.device_route, DeviceRoute::Bounce));
            return;
        }
        // Finish what is in flight: the kernel may still be using the buffers.
        if self.pending_ops() > 0 {
            if let Err(e) = self.wait() {
                crate::log::error(&format!("handle dropped with ops in flight; finishing them failed: {e}"));
            }
        }
        for w in &mut self.workers {
            w.jobs.take();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}
