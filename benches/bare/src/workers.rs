//! Runs ops one after another as a blocking `sync_pread`/`sync_pwrite`
//! does: every worker moves its slice of the op, and the op is done when
//! all are. The calling thread is worker 0 (no hand-off at parallelism 1);
//! the others are kept threads that start each op on a barrier and meet
//! again on it when their slice is done.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;

use crate::Mover;

/// The file offset every worker reads when the barrier lets it go; this
/// value tells them to stop.
const STOP: u64 = u64::MAX;

struct Shared {
    go: Barrier,
    done: Barrier,
    offset: AtomicU64,
    error: Mutex<Option<io::Error>>,
}

pub struct Workers {
    own: Box<dyn Mover>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// `make(i)` builds worker i's mover on the thread that will use it.
    /// Errors of any worker's set-up come back here.
    pub fn start<F>(parallelism: usize, make: F) -> io::Result<Workers>
    where
        F: Fn(usize) -> io::Result<Box<dyn Mover>> + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            go: Barrier::new(parallelism),
            done: Barrier::new(parallelism),
            offset: AtomicU64::new(0),
            error: Mutex::new(None),
        });
        let make = Arc::new(make);
        let mut threads = Vec::new();
        for i in 1..parallelism {
            let (shared, make) = (shared.clone(), make.clone());
            threads.push(std::thread::spawn(move || {
                let mover = make(i);
                let mut mover = match mover {
                    Ok(m) => Some(m),
                    Err(e) => {
                        shared.error.lock().unwrap().get_or_insert(e);
                        None
                    }
                };
                shared.done.wait(); // set-up done
                loop {
                    shared.go.wait();
                    let off = shared.offset.load(Ordering::Acquire);
                    if off == STOP {
                        return;
                    }
                    if let Some(m) = mover.as_mut() {
                        if let Err(e) = m.op(off) {
                            shared.error.lock().unwrap().get_or_insert(e);
                        }
                    }
                    shared.done.wait();
                }
            }));
        }
        let own = make(0);
        shared.done.wait();
        let others = shared.error.lock().unwrap().take();
        let stop = |shared: &Shared, threads: Vec<JoinHandle<()>>| {
            if !threads.is_empty() {
                shared.offset.store(STOP, Ordering::Release);
                shared.go.wait();
            }
            for t in threads {
                let _ = t.join();
            }
        };
        match (own, others) {
            (Ok(own), None) => Ok(Workers { own, shared, threads }),
            (Err(e), _) | (Ok(_), Some(e)) => {
                stop(&shared, threads);
                Err(e)
            }
        }
    }

    /// One op at `file_offset`, on every worker; returns when all are done.
    pub fn op(&mut self, file_offset: u64) -> io::Result<()> {
        self.shared.offset.store(file_offset, Ordering::Release);
        if !self.threads.is_empty() {
            self.shared.go.wait();
        }
        let mine = self.own.op(file_offset);
        if !self.threads.is_empty() {
            self.shared.done.wait();
        }
        mine?;
        match self.shared.error.lock().unwrap().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.shared.offset.store(STOP, Ordering::Release);
        self.shared.go.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}
