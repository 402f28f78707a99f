//! The threads that move the pieces of GPUDirect transfers, kept from one
//! transfer to the next: a transfer used to start and join one thread per
//! piece, which costs more than a small transfer's I/O.
//!
//! The pool grows to the largest number of pieces in flight at once (a
//! transfer's pieces all run at the same time: each is one blocking
//! `cuFileRead`/`cuFileWrite`), up to
//! [`crate::knobs::GDS_MAX_PIECE_THREADS`]; past that, pieces wait for a
//! thread. A forked child gets a fresh pool (the parent's threads do
//! not exist in it: the pool records where it started them, `rt/threads.rs`'s
//! `StartedIn`). When no thread can be started, a piece runs on the
//! calling thread. Threads are started (and named `deepnvme-gds-N`) by
//! `rt/threads.rs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use crate::rt::sync::Mutex;

use crate::error::panic_text;
use crate::rt::threads::{self, Role, StartedIn};


type Task = Box<dyn FnOnce() + Send + 'static>;

struct Pool {
    started_in: StartedIn,
    tasks: mpsc::Sender<Task>,
    queue: Arc<Mutex<mpsc::Receiver<Task>>>,
    threads: usize,
    /// Tasks handed out and not yet finished.
    busy: Arc<AtomicUsize>,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

impl Pool {
    fn new() -> Pool {
        let (tasks, queue) = mpsc::channel();
        Pool { started_in: StartedIn::here(), tasks, queue: Arc::new(Mutex::new(queue)), threads: 0, busy: Arc::default() }
    }

    /// Starts threads until `wanted` tasks can run at once (within the cap);
    /// returns false when none could be started and none exist.
    fn grow_to(&mut self, wanted: usize) -> bool {
        while self.threads < wanted.min(crate::knobs::GDS_MAX_PIECE_THREADS) {
            let (queue, busy) = (self.queue.clone(), self.busy.clone());
            let spawned = threads::spawn(Role::GdsPiece, self.threads, move || loop {
                let task = queue.lock().recv();
                let Ok(task) = task else { return };
                // Tasks catch their own panics; this only keeps the thread.
                let _ = catch_unwind(AssertUnwindSafe(task));
                busy.fetch_sub(1, Ordering::AcqRel);
            });
            if spawned.is_err() {
                break;
            }
            self.threads += 1;
        }
        self.threads > 0
    }
}

/// Runs every task at once, on pool threads, and returns their results in
/// order: `Err` with the panic's text for a task that panicked.
/// One piece's work.
pub(crate) type PieceTask<T> = Box<dyn FnOnce() -> T + Send + 'static>;

pub(crate) fn run_all<T: Send + 'static>(tasks: Vec<PieceTask<T>>) -> Vec<Result<T, String>> {
    let n = tasks.len();
    let (results_tx, results_rx) = mpsc::channel::<(usize, Result<T, String>)>();
    let mut inline = Vec::new();
    {
        let mut slot = POOL.lock();
        if slot.as_ref().is_none_or(|p| !p.started_in.is_here()) {
            // First use, or a forked child: the old pool's threads are not here.
            *slot = Some(Pool::new());
        }
        let pool = slot.as_mut().expect("just set");
        let wanted = pool.busy.load(Ordering::Acquire) + n;
        let have_threads = pool.grow_to(wanted);
        for (i, task) in tasks.into_iter().enumerate() {
            let tx = results_tx.clone();
            let wrapped: Task = Box::new(move || {
                let result = catch_unwind(AssertUnwindSafe(task)).map_err(|p| panic_text(&*p));
                let _ = tx.send((i, result));
            });
            if !have_threads {
                inline.push(wrapped);
                continue;
            }
            // Counted before it is sent: a thread may finish it at once.
            pool.busy.fetch_add(1, Ordering::AcqRel);
            if let Err(mpsc::SendError(task)) = pool.tasks.send(wrapped) {
                pool.busy.fetch_sub(1, Ordering::AcqRel);
                inline.push(task);
            }
        }
    }
    for task in inline {
        task();
    }
    drop(results_tx);
    let mut results: Vec<Option<Result<T, String>>> = (0..n).map(|_| None).collect();
    for (i, result) in results_rx.iter().take(n) {
        results[i] = Some(result);
    }
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("a GDS piece thread stopped".into()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// All of a transfer's pieces run at the same time (each waits at a
    /// barrier for all the others), on threads that are kept for the next
    /// transfer; a panicking piece is an error, not a lost result.
    #[test]
    fn pieces_run_at_once_on_threads_kept_across_transfers() {
        let mut seen = std::collections::BTreeSet::new();
        for round in 0..3 {
            let barrier = Arc::new(Barrier::new(4));
            let tasks: Vec<Box<dyn FnOnce() -> (usize, String) + Send>> = (0..4usize)
                .map(|i| {
                    let barrier = barrier.clone();
                    Box::new(move || {
                        barrier.wait();
                        (i, std::thread::current().name().unwrap_or_default().to_string())
                    }) as Box<dyn FnOnce() -> (usize, String) + Send>
                })
                .collect();
            let results = run_all(tasks);
            for (i, r) in results.into_iter().enumerate() {
                let (index, thread) = r.unwrap();
                assert_eq!(index, i, "results in order");
                assert!(thread.starts_with("deepnvme-gds-"), "ran on a pool thread, not {thread:?}");
                seen.insert(thread);
            }
            assert!(seen.len() <= 8, "round {round}: threads are reused ({} seen)", seen.len());
        }
        let tasks: Vec<Box<dyn FnOnce() -> u8 + Send>> = vec![Box::new(|| 1), Box::new(|| panic!("piece 2 broke"))];
        let results = run_all(tasks);
        assert_eq!(results[0], Ok(1));
        assert!(results[1].as_ref().unwrap_err().contains("piece 2 broke"));
    }
}
