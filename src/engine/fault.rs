//! Test-only fault injection: a panic in the middle of an engine run, with
//! other requests still in the kernel (see `internal_tests/robustness.rs`).

use std::cell::Cell;

thread_local! {
    /// Completions left before the engine run on this thread panics.
    static PANIC_AFTER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Arms a panic after `completions` more completions on this thread.
pub(crate) fn panic_after_completions(completions: usize) {
    PANIC_AFTER.with(|c| c.set(Some(completions)));
}

/// Called by the io_uring engine after each completion it settles.
pub(crate) fn after_completion() {
    PANIC_AFTER.with(|c| match c.get() {
        Some(0) => {
            c.set(None);
            panic!("injected panic after a completion (test)");
        }
        Some(n) => c.set(Some(n - 1)),
        None => {}
    });
}

/// Called by the psync engine when the calling thread's share of a run is
/// done: a fault still armed fires now (its helper threads may have moved
/// every piece, so its own completions never reached the count).
pub(crate) fn at_run_end() {
    PANIC_AFTER.with(|c| {
        if c.take().is_some() {
            panic!("injected panic at the end of the calling thread's share of a run (test)");
        }
    });
}
