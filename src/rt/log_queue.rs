//! Informational lines handed to Python's `logging` (the `deepnvme`
//! logger, through `deepnvme/_log.py`) when the core runs inside Python,
//! so that a Python user can filter them like any library's.
//!
//! A line may be made anywhere: on an I/O worker, under a handle's or a
//! ring's lock, with or without the GIL. Calling Python there could
//! deadlock (a thread waiting for the GIL while holding a lock that the
//! GIL's holder waits for), so [`offer`] only pushes the line onto a
//! lock-free list (nothing for `fork()` to leave held) and wakes one
//! dedicated thread, which takes the GIL with no lock of the core held and
//! logs the lines in order. At interpreter exit an `atexit` callback
//! ([`flush_log`]) delivers what is left, and later lines (the at-exit
//! stats report) go to the caller's fallback, stderr. So do lines when no interpreter is
//! running, without the `python` feature, or when the thread cannot start.
//!
//! No other file of the crate is named here (a leaf): the caller passes
//! the fallback writer.

/// Hands `line` to Python's logging, or returns false (the caller prints
/// it). `fallback` prints a line the logging thread could not deliver.
#[cfg(not(feature = "python"))]
pub(crate) fn offer(_line: &str, _fallback: fn(&str)) -> bool {
    false
}

#[cfg(feature = "python")]
pub(crate) use with_python::{flush_log, offer};

#[cfg(feature = "python")]
mod with_python {
    use std::ptr;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};

    use pyo3::prelude::*;

    /// The Python module whose `emit(line)` logs one line.
    const SINK_MODULE: &str = "deepnvme._log";

    /// A line and the writer that prints it when logging cannot take it.
    type Line = (String, fn(&str));

    struct Node {
        line: String,
        fallback: fn(&str),
        next: *mut Node,
    }

    /// The lines not yet delivered, newest first (a Treiber stack: pushed
    /// with compare-and-swap, taken whole with a swap).
    static PENDING: AtomicPtr<Node> = AtomicPtr::new(ptr::null_mut());
    /// The process whose logging thread is running (0: none yet). A child
    /// of `fork()` has no such thread and starts its own.
    static THREAD_PID: AtomicI32 = AtomicI32::new(0);
    /// That thread, to wake (leaked: one per process).
    static THREAD: AtomicPtr<std::thread::Thread> = AtomicPtr::new(ptr::null_mut());
    /// Set by the `atexit` callback: Python's logging is going away, lines
    /// go to their fallback from then on.
    static CLOSED: AtomicBool = AtomicBool::new(false);
    /// The logging thread is attaching to Python or delivering. Set before
    /// it reads `CLOSED`; the exit callback sets `CLOSED` before it reads
    /// this (both SeqCst): so either the thread sees `CLOSED` and stays out,
    /// or the callback sees it busy and lets it finish. A thread still
    /// waiting for the GIL when finalization starts would be ended inside
    /// CPython (pthread_exit through Rust frames).
    static BUSY: AtomicBool = AtomicBool::new(false);
    /// How long the exit callback waits for a delivery in progress.
    const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

    fn python_running() -> bool {
        // SAFETY: callable at any time, from any thread, GIL or not.
        unsafe { pyo3::ffi::Py_IsInitialized() != 0 }
    }

    pub(crate) fn offer(line: &str, fallback: fn(&str)) -> bool {
        if CLOSED.load(Ordering::Acquire) || !python_running() || !ensure_thread() {
            return false;
        }
        let node = Box::into_raw(Box::new(Node { line: line.to_string(), fallback, next: ptr::null_mut() }));
        let mut head = PENDING.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is ours until the exchange publishes it.
            unsafe { (*node).next = head };
            match PENDING.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        let thread = THREAD.load(Ordering::Acquire);
        if !thread.is_null() {
            // SAFETY: a published thread handle is leaked, never freed.
            unsafe { (*thread).unpark() };
        }
        true
    }

    /// Every pending line, oldest first.
    fn take_all() -> Vec<Line> {
        let mut node = PENDING.swap(ptr::null_mut(), Ordering::AcqRel);
        let mut lines = Vec::new();
        while !node.is_null() {
            // SAFETY: the swap made this list ours alone; each node was
            // made by Box::into_raw in `offer`.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.next;
            lines.push((boxed.line, boxed.fallback));
        }
        lines.reverse();
        lines
    }

    /// Starts this process's logging thread unless it runs; false when it
    /// cannot be started.
    fn ensure_thread() -> bool {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let running = THREAD_PID.load(Ordering::Acquire);
        if running == pid {
            return true;
        }
        if THREAD_PID.compare_exchange(running, pid, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Another thread of this process is starting it.
            return true;
        }
        if running != 0 {
            // A child of fork(): the parent's undelivered lines are the
            // parent's to log, not this process's.
            let _ = take_all();
        }
        match std::thread::Builder::new().name("deepnvme-log".into()).spawn(run) {
            Ok(handle) => {
                let thread = Box::into_raw(Box::new(handle.thread().clone()));
                THREAD.store(thread, Ordering::Release);
                // A line pushed before the store found no thread to wake:
                // this wakes it (a park after an unpark returns at once).
                handle.thread().unpark();
                true
            }
            Err(_) => {
                THREAD_PID.store(0, Ordering::Release);
                false
            }
        }
    }

    fn run() {
        loop {
            if !PENDING.load(Ordering::Acquire).is_null() {
                BUSY.store(true, Ordering::SeqCst);
                if !CLOSED.load(Ordering::SeqCst) {
                    // The lines are taken with the GIL held, so that the exit
                    // flush (which holds it too) gets whatever this did not.
                    let delivered = Python::try_attach(|py| deliver(py, take_all()));
                    if delivered.is_none() {
                        for (line, fallback) in take_all() {
                            fallback(&line);
                        }
                    }
                }
                BUSY.store(false, Ordering::SeqCst);
            }
            std::thread::park();
        }
    }

    fn deliver(py: Python<'_>, lines: Vec<Line>) {
        let emit = py.import(SINK_MODULE).and_then(|m| m.getattr("emit"));
        for (line, fallback) in lines {
            let logged = match &emit {
                Ok(emit) => emit.call1((line.as_str(),)).is_ok(),
                Err(_) => false,
            };
            if !logged {
                fallback(&line);
            }
        }
    }

    /// `deepnvme._native._flush_log()`, which `deepnvme/__init__.py`
    /// registers with `atexit` when the package is imported (so it runs
    /// after the application's own exit callbacks): from now on lines go to
    /// their fallback; what is pending is logged here, on the exiting thread,
    /// while logging still works. Registered from Python, not by the logging
    /// thread: that thread may not have run yet when a short script exits.
    #[pyfunction]
    #[pyo3(name = "_flush_log")]
    pub(crate) fn flush_log(py: Python<'_>) {
        CLOSED.store(true, Ordering::SeqCst);
        if BUSY.load(Ordering::SeqCst) {
            // Let the logging thread take the GIL and finish before the
            // interpreter goes away.
            py.detach(|| {
                let deadline = std::time::Instant::now() + EXIT_WAIT;
                while BUSY.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            });
        }
        deliver(py, take_all());
    }
}
