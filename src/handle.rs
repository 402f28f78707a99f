//! The DeepNVMe handle (`deepspeed_io_handle_t` without torch).
//!
//! A handle owns `intra_op_parallelism` worker threads, each with its own
//! engine (its own io_uring ring). A parallel op is cut into one slice per
//! worker; every worker gets its slice, and the op completes when all have
//! run. Ops are kept in submission order; `wait()` finishes them in that
//! order (validation, bounce copy-back, closing the files the handle opened)
//! and returns how many it finished — 0 when nothing was pending.
//!
//! As in DeepSpeed, a blocking call (`sync_*`, `pread/pwrite(async=False)`)
//! submits and then waits for *every* pending op, and returns that count;
//! blocking calls and `wait()` are serialised per handle so that two threads
//! blocking on one handle each get their own count.
//!
//! Errors never abort: a failed slice fails its op, and `wait()` reports it
//! after finishing every other op. Dropping a handle finishes what is still
//! in flight (logging any failure), then stops and joins its workers.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::config::HandleConfig;
use crate::engine::{self, Engine, EngineKind};
use crate::error::{Direction, Error, Result};
use crate::file::FileTarget;
use crate::op::{BufferDesc, CpuOp, OpRequest};
use crate::pinned::PinnedMemoryManager;

/// The part of an op that workers run, one slice per job. CPU ops cut their
/// bytes into per-worker slices; a GPUDirect op is one slice that drives
/// cuFile (which has its own threads).
pub trait OpWork: Send + Sync {
    fn slice_count(&self) -> usize;
    /// Runs slice `index` on the worker's `engine`.
    fn run_slice(&self, index: usize, engine: &mut dyn Engine) -> Result<()>;
    /// Describes slice `index` for an error when it could not be run at all.
    fn slice_error(&self, index: usize, detail: String) -> Error;
}

/// How an op completes in `wait()` once all its slices ran: report the
/// first slice error, or validate and copy a bounced read back. Dropping it
/// releases the op's files and buffers.
pub trait OpCompletion: Send {
    /// Called once. The completion is dropped afterwards, outside the
    /// handle's locks: dropping it may release a torch tensor, which can
    /// take the GIL.
    fn finish(&mut self, outcome: Result<()>) -> Result<()>;
}

/// An op ready to be dispatched.
pub struct PreparedOp {
    pub work: Arc<dyn OpWork>,
    pub completion: Box<dyn OpCompletion>,
}

impl From<CpuOp> for PreparedOp {
    fn from(op: CpuOp) -> Self {
        PreparedOp { work: op.plan().clone(), completion: Box::new(op) }
    }
}

/// An op in flight: the work the workers read, and the completion latch.
struct InFlight {
    work: Arc<dyn OpWork>,
    state: Mutex<SliceTally>,
    done: Condvar,
    /// How the op finishes; taken by whoever finishes it.
    completion: Mutex<Option<Box<dyn OpCompletion>>>,
}

struct SliceTally {
    remaining: usize,
    first_error: Option<Error>,
}

impl InFlight {
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
        let (outcome, clean) = match catch_unwind(AssertUnwindSafe(|| self.op.work.run_slice(self.slice, engine))) {
            Ok(outcome) => (outcome, true),
            Err(payload) => {
                let detail = format!("internal error (panic) in an I/O worker: {}", panic_text(&*payload));
                (Err(self.op.work.slice_error(self.slice, detail)), false)
            }
        };
        self.ran = true;
        self.op.complete_slice(outcome);
        clean
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

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Creates the engine a worker uses; when io_uring cannot be set up for this
/// worker (e.g. a ring hits RLIMIT_MEMLOCK on an old kernel), falls back to
/// psync and says so once.
fn worker_engine(kind: EngineKind, queue_depth: usize) -> Box<dyn Engine> {
    match engine::create(kind, queue_depth) {
        Ok(e) => e,
        Err(err) => {
            crate::log::info_once("worker-engine-fallback", &format!("{err}; this worker uses the psync engine"));
            Box::new(engine::psync::PsyncEngine::new(queue_depth))
        }
    }
}

fn worker_loop(kind: EngineKind, queue_depth: usize, jobs: mpsc::Receiver<Job>) {
    let mut engine = worker_engine(kind, queue_depth);
    for job in jobs {
        let clean = job.run(engine.as_mut());
        // A ring that failed (or a run that panicked midway) is not trusted
        // with the next op: start a fresh engine.
        if !clean || engine.is_broken() {
            engine = worker_engine(kind, queue_depth);
        }
    }
}

/// A DeepNVMe I/O handle.
pub struct IoHandle {
    config: HandleConfig,
    engine_kind: EngineKind,
    workers: Vec<Worker>,
    pending: Mutex<VecDeque<Arc<InFlight>>>,
    /// Serialises blocking calls and `wait()` (DeepSpeed's handle mutex).
    serial: Mutex<()>,
    /// Engine for `read`/`write`, which run on the calling thread.
    inline_engine: Mutex<Option<Box<dyn Engine>>>,
    manager: &'static PinnedMemoryManager,
}

impl IoHandle {
    pub fn new(config: HandleConfig) -> Result<IoHandle> {
        config.validate()?;
        let engine_kind = match config.engine {
            Some(EngineKind::Uring) => {
                engine::io_uring_status().map_err(|why| Error::Engine(format!("io_uring is unavailable: {why}")))?;
                EngineKind::Uring
            }
            Some(k) => k,
            None => engine::default_kind()?,
        };
        let mut workers = Vec::with_capacity(config.intra_op_parallelism);
        for index in 0..config.intra_op_parallelism {
            let (tx, rx) = mpsc::channel::<Job>();
            let qd = config.queue_depth;
            let thread = std::thread::Builder::new()
                .name(format!("deepnvme-io-{index}"))
                .spawn(move || worker_loop(engine_kind, qd, rx))
                .map_err(|e| Error::Engine(format!("spawning I/O worker {index}: {e}")))?;
            workers.push(Worker { jobs: Some(tx), thread: Some(thread) });
        }
        Ok(IoHandle {
            config,
            engine_kind,
            workers,
            pending: Mutex::new(VecDeque::new()),
            serial: Mutex::new(()),
            inline_engine: Mutex::new(None),
            manager: PinnedMemoryManager::shared(),
        })
    }

    pub fn config(&self) -> &HandleConfig {
        &self.config
    }
    pub fn engine_kind(&self) -> EngineKind {
        self.engine_kind
    }
    pub fn manager(&self) -> &'static PinnedMemoryManager {
        self.manager
    }

    /// `handle.is_pinned(buffer)`: declared pinned, or inside a managed region.
    pub fn is_pinned(&self, ptr: *const u8, len: usize, declared_pinned: bool) -> bool {
        declared_pinned || self.manager.is_managed(ptr, len)
    }

    /// Number of ops submitted and not yet finished by `wait()`.
    pub fn pending_ops(&self) -> usize {
        self.pending.lock().len()
    }

    /// DeepSpeed requires a parallel op's bytes to divide evenly among the
    /// workers (it returns -1 otherwise); kept for compatibility.
    fn check_divisible(&self, request: &OpRequest<'_>) -> Result<()> {
        let p = self.config.intra_op_parallelism;
        if request.buffer.len % p != 0 {
            return Err(Error::InvalidArgument(format!(
                "parallel {} of {} bytes at offset {} of {} is not divisible by intra_op_parallelism = {p}",
                request.direction.verb(),
                request.buffer.len,
                request.file_offset,
                match request.target {
                    FileTarget::Path(path) => path.display().to_string(),
                    FileTarget::Fd(fd) => format!("fd {fd}"),
                }
            )));
        }
        Ok(())
    }

    /// `pread`/`pwrite`/`async_*`/`sync_*`: submits a parallel op. With
    /// `is_async` returns 0 at once; otherwise waits for every pending op and
    /// returns how many finished.
    pub fn submit(&self, request: OpRequest<'_>, is_async: bool) -> Result<usize> {
        self.check_divisible(&request)?;
        let op = CpuOp::prepare(request, self.config.intra_op_parallelism, self.config.transfer_knobs(), self.manager)?;
        self.submit_prepared(op.into(), is_async)
    }

    /// Dispatches an op prepared elsewhere (a GPUDirect op): with `is_async`
    /// returns 0 at once; otherwise waits for every pending op and returns
    /// how many finished. Slice `i` runs on worker `i % workers`.
    pub fn submit_prepared(&self, op: PreparedOp, is_async: bool) -> Result<usize> {
        if is_async {
            // An async submit never waits behind another thread's blocking
            // call: DeepSpeed's bindings keep the GIL for async_*.
            self.dispatch(op);
            return Ok(0);
        }
        let (result, finished) = {
            let _serial = self.serial.lock();
            self.dispatch(op);
            self.wait_locked()
        };
        drop(finished);
        result
    }

    fn dispatch(&self, op: PreparedOp) {
        let PreparedOp { work, completion } = op;
        let slices = work.slice_count();
        let in_flight = Arc::new(InFlight {
            work,
            state: Mutex::new(SliceTally { remaining: slices, first_error: None }),
            done: Condvar::new(),
            completion: Mutex::new(Some(completion)),
        });
        // Queue and hand out under one lock, so every worker sees ops in the
        // order `wait()` finishes them.
        let mut pending = self.pending.lock();
        pending.push_back(in_flight.clone());
        for slice in 0..slices {
            let worker = &self.workers[slice % self.workers.len()];
            let job = Job { op: in_flight.clone(), slice, ran: false };
            if let Some(tx) = worker.jobs.as_ref() {
                // A send to a worker that is gone drops the job, which fails
                // its slice rather than leave the op waiting forever.
                let _ = tx.send(job);
            }
        }
    }

    /// Waits for every pending op, finishes each, and returns how many.
    pub fn wait(&self) -> Result<usize> {
        let (result, finished) = {
            let _serial = self.serial.lock();
            self.wait_locked()
        };
        drop(finished);
        result
    }

    /// Finishes every pending op in order. Returns the count (or the first
    /// error) and the finished completions, for the caller to drop once it
    /// has let go of `serial`.
    fn wait_locked(&self) -> (Result<usize>, Vec<Box<dyn OpCompletion>>) {
        let mut completed = 0usize;
        let mut first: Option<Error> = None;
        let mut more = 0usize;
        let mut finished = Vec::new();
        loop {
            let Some(op) = self.pending.lock().pop_front() else { break };
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
            completed += 1;
            if let Err(e) = result {
                if first.is_none() {
                    first = Some(e);
                } else {
                    more += 1;
                }
            }
        }
        let result = match first {
            None => Ok(completed),
            Some(e) if more == 0 => Err(e),
            Some(e) => Err(Error::Many { first: Box::new(e), more }),
        };
        (result, finished)
    }

    /// `read`/`write`: one synchronous, unsplit transfer on the calling thread.
    pub fn transfer_inline(&self, request: OpRequest<'_>) -> Result<()> {
        let op = CpuOp::prepare(request, 1, self.config.transfer_knobs(), self.manager)?;
        let plan = op.plan().clone();
        let outcome = {
            let mut slot = self.inline_engine.lock();
            if slot.is_none() {
                *slot = Some(worker_engine(self.engine_kind, self.config.queue_depth));
            }
            let engine = slot.as_mut().expect("inline engine");
            let outcome = catch_unwind(AssertUnwindSafe(|| plan.run_slice(0, engine.as_mut()).map_err(Error::from)))
                .unwrap_or_else(|p| Err(Error::Engine(format!("internal error (panic) in a transfer: {}", panic_text(&*p)))));
            if engine.is_broken() {
                *slot = None;
            }
            outcome
        };
        let mut op = op;
        op.finish(outcome)
    }

    /// Convenience for Rust callers: a parallel read into `buffer`.
    pub fn pread(&self, buffer: BufferDesc, target: FileTarget<'_>, file_offset: i64, is_async: bool) -> Result<usize> {
        self.submit(
            OpRequest { direction: Direction::Read, target, file_offset, buffer, staging: None, validate: false },
            is_async,
        )
    }

    /// Convenience for Rust callers: a parallel write from `buffer`.
    pub fn pwrite(&self, buffer: BufferDesc, target: FileTarget<'_>, file_offset: i64, is_async: bool) -> Result<usize> {
        self.submit(
            OpRequest { direction: Direction::Write, target, file_offset, buffer, staging: None, validate: false },
            is_async,
        )
    }
}

impl Drop for IoHandle {
    fn drop(&mut self) {
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
