//! How the core starts its threads: every production thread is started
//! here, named `deepnvme-<role>-<index>`, and a thread that cannot be
//! started is the crate's [`Error`] (never a panic, never an `unwrap`); the
//! owner decides what that means (fail the call, or do the work on fewer
//! threads). Test code may spawn as it likes.
//!
//! # The core's threads
//!
//! | role | name | started by | lives | when one cannot be started |
//! |---|---|---|---|---|
//! | [`Role::IoWorker`] | `deepnvme-io-N` | `handle/construction.rs`, one per `intra_op_parallelism` | the handle | the handle is not made |
//! | [`Role::Psync`] | `deepnvme-psync-N` | `engine/psync.rs`, on a psync engine's first run of several pieces | the engine | the engine runs with the helpers it has (at worst none: the calling thread alone) |
//! | [`Role::GdsPiece`] | `deepnvme-gds-N` | `gds/transfer/piece_pool.rs`, grown to the pieces in flight | the process | the pool stops growing; with no thread at all, pieces run on the calling thread |
//! | [`Role::Copy`] | `deepnvme-copy-N` | `bounce/copy/helpers.rs`, one per CPU beyond the first (at most 7), on the first copy of 1 MiB or more | the process | the pool has fewer helpers (at worst none: the calling thread copies alone) |
//! | (none) | `deepnvme-log` | `rt/log_queue.rs` itself (a leaf below `error` and `rt/log`, so not through [`spawn`]), with the `python` feature, on the first informational line inside Python; a child of `fork()` starts its own | the process | lines go to stderr directly, as without Python |
//!
//! These are three kinds of lifetime (a handle's, an engine's, the
//! process's); they stay separate pools on purpose. Folding them into one
//! would change who runs what (a handle's workers own their engines and
//! rings; a psync run waits for exactly its helpers; GDS pieces must all run
//! at once; a copy never waits for a helper to start), which this module
//! does not do: it owns how a thread is started, not what it runs.
//!
//! # Threads and `fork()`
//!
//! A child made by `fork()` has one thread, the one that forked: none of
//! the threads above exist in it. So every owner of long-lived threads
//! records the process that started them ([`StartedIn`]) and, in a child,
//! never waits for or joins them (that would wait forever) and never hands
//! them work:
//! * a handle refuses every call in a child and leaks its workers when
//!   dropped there (`IoHandle::check_process`, its `Drop`; it keeps the pid
//!   as `creator_pid`, for its error message);
//! * a psync engine's helpers belong to its handle, refused as above; the
//!   calling thread's one-shot engine is leaked and made afresh when the
//!   child makes a one-shot transfer (`handle/calling_thread.rs`), and a
//!   psync pool dropped in a child (that engine, at the child's `exit()`)
//!   leaves its helpers and channel alone instead of joining them
//!   (`engine/psync.rs`, `core_fork.rs`);
//! * the GDS piece pool is replaced by a fresh one in a child
//!   (`gds/transfer/piece_pool.rs`);
//! * the copy helpers are left alone in a child: it copies on the calling
//!   thread and never takes the pool's lock (`bounce/copy/helpers.rs`). A
//!   copy in the parent never waits for a helper to wake, only for pieces
//!   a helper already took, so no copy can wait on a thread the child lacks.
//!
//! An idle long-lived thread waits on a `std::sync` lock (through
//! `sync.rs`), never parking_lot's: a child inherits parking_lot's table of
//! parked threads, entries for threads it does not have (see `sync.rs`).
//! Starting a thread takes none of the locks the fork handlers hold
//! (`fork.rs`), so it never waits for them and has no hook there. (The GDS
//! piece pool grows under its own lock, which the handlers do not take: a
//! child cannot use its parent's CUDA anyway.)

use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// What a thread of the core is for (see the table in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A handle's I/O worker (`handle/workers.rs`).
    IoWorker,
    /// A psync engine's helper (`engine/psync.rs`).
    Psync,
    /// A thread of the GDS piece pool (`gds/transfer/piece_pool.rs`).
    GdsPiece,
    /// A kept helper of large host copies (`bounce/copy/helpers.rs`).
    Copy,
}

impl Role {
    /// The part of the thread's name after `deepnvme-`.
    fn tag(self) -> &'static str {
        match self {
            Role::IoWorker => "io",
            Role::Psync => "psync",
            Role::GdsPiece => "gds",
            Role::Copy => "copy",
        }
    }

    /// The role in an error message.
    fn what(self) -> &'static str {
        match self {
            Role::IoWorker => "I/O worker",
            Role::Psync => "psync helper",
            Role::GdsPiece => "GDS piece thread",
            Role::Copy => "copy thread",
        }
    }
}

/// The name of thread `index` of `role`: `deepnvme-io-0`, ...
pub(crate) fn name(role: Role, index: usize) -> String {
    format!("deepnvme-{}-{index}", role.tag())
}

fn start_error(role: Role, index: usize, e: std::io::Error) -> Error {
    Error::Engine(format!("starting {} {index} (thread {}): {e}", role.what(), name(role, index)))
}

/// Starts thread `index` of `role`, running `body`.
pub(crate) fn spawn<T, F>(role: Role, index: usize, body: F) -> Result<JoinHandle<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    std::thread::Builder::new().name(name(role, index)).spawn(body).map_err(|e| start_error(role, index, e))
}

/// The process a set of threads was started in (see "Threads and `fork()`"
/// above): in any other process, a child of `fork()`, they do not exist.
/// The pid alone would not do: a descendant can be given the pid of an
/// ancestor that has exited, so the count of forks (`fork.rs`) is part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StartedIn {
    pid: u32,
    fork_generation: u64,
}

impl StartedIn {
    /// This process.
    pub(crate) fn here() -> StartedIn {
        crate::rt::fork::install(); // so that a later fork is counted
        StartedIn { pid: std::process::id(), fork_generation: crate::rt::fork::fork_generation() }
    }

    /// True in the process that started the threads; false in a child.
    pub(crate) fn is_here(self) -> bool {
        self.pid == std::process::id() && self.fork_generation == crate::rt::fork::fork_generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_named_by_role_and_index() {
        let t = spawn(Role::Psync, 3, || std::thread::current().name().map(str::to_owned)).unwrap();
        assert_eq!(t.join().unwrap().as_deref(), Some("deepnvme-psync-3"));
        assert_eq!(name(Role::Copy, 1), "deepnvme-copy-1");
        assert_eq!(name(Role::IoWorker, 0), "deepnvme-io-0");
        assert_eq!(name(Role::GdsPiece, 7), "deepnvme-gds-7");
        assert!(StartedIn::here().is_here());
        assert!(!StartedIn { pid: 0, ..StartedIn::here() }.is_here(), "pid 0 is never a user process");
        let earlier_generation = StartedIn { fork_generation: StartedIn::here().fork_generation + 1, ..StartedIn::here() };
        assert!(!earlier_generation.is_here(), "same pid, another fork generation: another process");
    }

    #[test]
    fn a_thread_that_cannot_start_is_an_error_naming_it() {
        let e = start_error(Role::IoWorker, 2, std::io::Error::from_raw_os_error(libc::EAGAIN));
        let text = e.to_string();
        assert!(text.contains("I/O worker 2") && text.contains("deepnvme-io-2"), "{text}");
    }
}
