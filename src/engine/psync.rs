//! The fallback engine: blocking pread/pwrite on threads.
//!
//! Used where io_uring cannot be set up. Up to `queue_depth` pieces (capped
//! at [`MAX_THREADS`]) are in flight at once: the calling thread plus helper
//! threads, which the engine starts once and keeps for its lifetime (a run
//! of many small ops does not pay for thread creation each time). A run with
//! a single piece, or a depth of one, stays on the calling thread. The
//! `single_submit` and `overlap_events` knobs have no meaning here: every
//! piece is its own syscall, and each thread takes the next piece as soon as
//! it finishes one. Helpers (`deepnvme-psync-N`) are started through
//! `rt/threads.rs`; one that cannot be started is one fewer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::rt::sync::{Condvar, Mutex};

use super::contract::{AioParams, Engine, EngineKind};
use super::piece::{move_piece_blocking, pieces, Piece, Segment};
use crate::error::{Direction, TransferError};
use crate::rt::threads::{self, Role, StartedIn};

/// More threads than this per worker buys nothing on NVMe.
pub const MAX_THREADS: usize = 16;

/// One run's pieces, shared by the threads that move them.
struct RunState {
    direction: Direction,
    pieces: Vec<Piece>,
    next: AtomicUsize,
    failed: AtomicBool,
    first_error: Mutex<Option<TransferError>>,
    /// Helpers still working on this run.
    helpers_busy: Mutex<usize>,
    helpers_done: Condvar,
}

impl RunState {
    /// Moves pieces until none are left or one failed.
    fn work(&self) {
        while !self.failed.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(piece) = self.pieces.get(i) else { return };
            let mut piece = *piece;
            if let Err(e) = move_piece_blocking(self.direction, &mut piece) {
                self.failed.store(true, Ordering::Relaxed);
                self.first_error.lock().get_or_insert(e);
                return;
            }
            #[cfg(test)]
            super::fault::after_completion();
        }
    }

    fn helper_finished(&self) {
        let mut busy = self.helpers_busy.lock();
        *busy -= 1;
        if *busy == 0 {
            self.helpers_done.notify_all();
        }
    }
}

/// Helper threads that take runs from a shared queue.
struct Pool {
    runs: Option<mpsc::Sender<Arc<RunState>>>,
    threads: Vec<JoinHandle<()>>,
    started: StartedIn,
}

impl Pool {
    fn start(count: usize) -> Pool {
        let (tx, rx) = mpsc::channel::<Arc<RunState>>();
        // Idle helpers queue for the receiver on std's futex mutex, not on
        // parking_lot's: parking_lot keeps parked threads in a process-wide
        // table, and a child made by fork() inherits entries for these
        // threads, whose stacks glibc then hands to the child's new threads,
        // corrupting that table (lost wake-ups, a hung `wait()` in a child
        // that made a fresh handle).
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let threads = (0..count)
            .filter_map(|i| {
                let rx = rx.clone();
                // A helper that cannot be started is one fewer: runs go on
                // with the others (at worst on the calling thread alone).
                threads::spawn(Role::Psync, i, move || loop {
                    let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(run) = next else { return };
                    // Whatever happens, the run must hear that this helper is done.
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.work())).is_err() {
                        run.failed.store(true, Ordering::Relaxed);
                        run.first_error.lock().get_or_insert(TransferError {
                            direction: run.direction,
                            path: None,
                            fd: run.pieces.first().map(|p| p.fd).unwrap_or(-1),
                            file_offset: run.pieces.first().map(|p| p.file_offset).unwrap_or(0),
                            len: 0,
                            errno: libc::EIO,
                            detail: Some("internal error (panic) in a psync thread".into()),
                        });
                    }
                    run.helper_finished();
                }).ok()
            })
            .collect();
        Pool { runs: Some(tx), threads, started: StartedIn::here() }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.started.is_here() {
            // In a child of fork() (its thread's engine dropped at exit()):
            // the helpers exist only in the parent, and joining one that is
            // gone panics, which aborts inside a destructor; the channel's
            // lock may be held by a parent thread. Leave all of it.
            std::mem::forget(self.runs.take());
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
        self.runs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

pub struct PsyncEngine {
    max_threads: usize,
    pool: Option<Pool>,
    /// The run in progress, for `quiesce` after a panic.
    current: Option<Arc<RunState>>,
}

impl PsyncEngine {
    pub fn new(queue_depth: usize) -> Self {
        PsyncEngine { max_threads: queue_depth.clamp(1, MAX_THREADS), pool: None, current: None }
    }
}

impl Engine for PsyncEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Psync
    }

    fn quiesce(&mut self) {
        // The calling thread unwound; its helpers may still be moving pieces.
        if let Some(state) = self.current.take() {
            state.failed.store(true, Ordering::Relaxed);
            let mut busy = state.helpers_busy.lock();
            while *busy > 0 {
                state.helpers_done.wait(&mut busy);
            }
        }
    }

    fn run_with(
        &mut self,
        direction: Direction,
        segments: &[Segment],
        params: &AioParams,
        _memory: Option<&std::sync::Arc<super::fixed::RegistrableMemory>>,
    ) -> Result<(), TransferError> {
        let all: Vec<Piece> = pieces(segments, params.block_size).collect();
        let threads = self.max_threads.min(params.queue_depth.max(1)).min(all.len());
        if threads <= 1 {
            for mut p in all {
                move_piece_blocking(direction, &mut p)?;
            }
            return Ok(());
        }
        let pool = self.pool.get_or_insert_with(|| Pool::start(self.max_threads - 1));
        let state = Arc::new(RunState {
            direction,
            pieces: all,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
            helpers_busy: Mutex::new(0),
            helpers_done: Condvar::new(),
        });
        let helpers = (threads - 1).min(pool.threads.len());
        *state.helpers_busy.lock() = helpers;
        for _ in 0..helpers {
            let sent = pool.runs.as_ref().map(|tx| tx.send(state.clone()));
            if !matches!(sent, Some(Ok(()))) {
                state.helper_finished();
            }
        }
        // The calling thread moves pieces too, then waits for the helpers:
        // none may still touch the buffers when this returns.
        self.current = Some(state.clone());
        state.work();
        // (A fault armed on this thread that its own pieces did not reach.)
        #[cfg(test)]
        super::fault::at_run_end();
        self.current = None;
        let mut busy = state.helpers_busy.lock();
        while *busy > 0 {
            state.helpers_done.wait(&mut busy);
        }
        drop(busy);
        let error = state.first_error.lock().take();
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
