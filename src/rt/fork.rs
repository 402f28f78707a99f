//! `fork()`: a child must be able to use the crate (make a handle, lock
//! memory, move bytes) whatever the parent's other threads were doing at the
//! fork, and the fork must give the child no copy of memory registered with
//! io_uring. Both are done here, by `pthread_atfork` handlers.
//!
//! A child inherits every lock in the state it had at the fork, but only the
//! forking thread: a lock that another thread held then is held for good in
//! the child. So the prepare handler takes every process-wide lock that a
//! child may need, and the parent and child handlers let go of them; in
//! between, no other thread can be inside one. All of them are `std::sync`
//! locks (through `sync.rs`), whose state is the lock's own atomic words: a
//! free lock works in the child. (parking_lot's are not: see `sync.rs`.)
//!
//! # Every process-wide lock, and what makes it safe for a child
//!
//! This file names none of their owners: each owner has a hook, and the
//! crate root lists them in this order ([`Participants`], `lib.rs`), which
//! the prepare handler follows. In that order:
//!
//! | # | lock | where | what the prepare handler does |
//! |---|---|---|---|
//! | 0 | the settings, the io_uring probe, the default engine (`OnceLock`s) | `knobs.rs`, `engine/mod.rs` | sets them (waiting for a thread setting one): a `OnceLock` half set at the fork would make the child wait forever |
//! | 1 | the fork gate, [`GATE`] | here | holds it across the fork |
//! | 2 | each of this process's rings' fixed-buffer tables | `engine/fixed.rs` `FixedTable` | waits for each (within [`FORK_WAIT`] in all) and empties it; not held across the fork: nothing registers while a fork is pending, and the child never uses the parent's rings |
//! | 3 | the retire listeners, `LISTENERS` | `engine/fixed.rs` | holds it across the fork |
//! | 4 | the rings' tables, `TABLES` | `engine/fixed.rs` | holds it across the fork |
//! | 5 | the pinned manager's registry | `pinned/manager.rs` (`PinnedMemoryManager::shared()`) | holds it, for writing, across the fork |
//! | 6 | the bounce pool, `POOL` | `bounce/pool.rs` | holds it across the fork |
//! | 7 | `info_once`'s keys, `SEEN` | `log.rs` | holds it across the fork |
//!
//! The parent and child handlers let go of 7 to 1, in that order. Nobody
//! ever waits for the at-exit stats report's registration (`stats.rs`) or
//! for these handlers' installation ([`install`]): atomic flags, not `Once`s.
//!
//! Not taken, because a child never uses them:
//! * a handle's own locks (its queue, its admission lock, its engines, its ops'
//!   latches, its psync helpers' queue): a child refuses the parent's
//!   handles (`IoHandle::check_process`) and leaks them when dropped; a new
//!   handle has locks of its own;
//! * managers made with `PinnedMemoryManager::new()` (tests, tools): not
//!   process-wide;
//! * the copy helpers' pool (`bounce/copy/helpers.rs`: its board, and the
//!   `STARTING` lock, under which `SEEN` may be taken when a helper cannot
//!   start): a child never uses its parent's pool (`StartedIn`), and takes
//!   `STARTING` only with `try_lock`;
//! * GPUDirect Storage (`gds/`: the driver's state, its registered regions
//!   and device contexts, the cuFile handle registry, the piece threads'
//!   pool, the probes): a child cannot use the CUDA its parent initialised
//!   (CUDA's rule for fork()), and a transfer holds the regions' lock for
//!   its whole run, which a fork must not wait for.
//!
//! Not taken, because no fork finds it held: the count of torch storages
//! held unresizable (`resize_hold.rs`, `HELD`) is only taken under the GIL
//! (or while the interpreter finalizes), and `os.fork()` holds the GIL.
//!
//! Outside the crate: glibc takes malloc's locks itself (after these
//! handlers); `log.rs` writes with write(2), never through std's stdout or
//! stderr locks; `os.fork()` holds the GIL and the import lock, under which
//! the Python front end sets up what it keeps (but for a symbol looked up
//! once in `python/mod.rs`, whose first lookup a fork could interrupt).
//!
//! # The order, and why the fork always makes progress
//!
//! Which of these locks is ever held while another is taken (the audit):
//! * a ring's table: `SEEN`, when a registration is refused (`info_once`);
//!   and a handle's op latches, when a stream asks its queue for the next
//!   op or reports one done (the handler never takes those);
//! * the bounce pool: the settings' `OnceLock`, set (0) by then;
//! * the gate, `LISTENERS`, `TABLES`, the pinned registry, `SEEN`: nothing.
//!   The gate is taken, besides by the handler, only by a run that let go
//!   of its table for the fork, which then holds none of these.
//!
//! Every nesting goes forward in the order above, so the handler never
//! waits for a lock whose holder waits for one it holds; and each wait ends:
//! * a table is held by a run over registrable memory from its first request
//!   to its last completion, and by short unregistrations. While a fork is
//!   pending ([`fork_pending`]) a run sends no further request and, once its
//!   in-flight ones (one queue's worth at most) have completed, lets go of
//!   the table, waits at the gate until the fork is done, takes the table
//!   back and goes on (`engine/uring/`). So the fork waits for in-flight
//!   requests, never for a whole run;
//! * 3 to 7 are held for a few memory operations at a time.
//!
//! Nothing registers while a fork is pending (`FixedTable::index_for`), so
//! a table emptied by the handler stays empty until the fork is done: no
//! registered page is left for the kernel to copy into the child. A ring
//! whose table the handler cannot get within [`FORK_WAIT`] (its in-flight
//! requests stuck in a dead device) stays registered: its pages are copied
//! into the child, which is slower, never wrong.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::rt::sync::Mutex;

/// How long the prepare handler waits, in all, for the rings' tables: for
/// their in-flight requests to complete. Only a ring stuck in I/O uses it up.
pub(crate) const FORK_WAIT: Duration = Duration::from_secs(2);

/// What a hook takes for the fork: the guards it must hold until the fork
/// is done (dropped by the parent and child handlers), or nothing.
pub(crate) type Held = Option<Box<dyn Any>>;

/// A hook: takes its owner's locks for the fork (or settles its
/// `OnceLock`s), giving up on waits at the deadline where its doc says so.
pub(crate) type Hook = fn(deadline: Instant) -> Held;

/// Every process-wide lock's hook, in the order of the table above: the
/// `settle` ones (row 0) before the gate, the `hold` ones (rows 2 to 7)
/// after it. The crate root fills it in (`lib.rs`, which names every
/// module), so this file names none of the owners, and every hook is there
/// before any lock is first taken.
pub(crate) struct Participants {
    pub settle: &'static [Hook],
    pub hold: &'static [Hook],
}

/// Held by the prepare handler until the fork is done: a run that let go of
/// its table for a fork waits here ([`wait_while_forking`]).
static GATE: Mutex<()> = Mutex::new(());

/// Set while a fork is in its handlers (after the gate is taken, until just
/// before it is let go).
static FORK_PENDING: AtomicBool = AtomicBool::new(false);

/// Whether a `fork()` in this process is in its handlers: runs over
/// registered memory send nothing more and let go of their tables, streams
/// start no further op, and nothing is registered.
pub(crate) fn fork_pending() -> bool {
    FORK_PENDING.load(Ordering::Acquire)
}

/// For a run that let go of its ring's table because a fork is pending:
/// returns once the fork is done (at once when none is pending).
pub(crate) fn wait_while_forking() {
    if fork_pending() {
        drop(GATE.lock());
    }
}

/// Installs the fork handlers, once per process. Called on the way into
/// every process-wide state (`knobs::settings()`, the pinned manager, a
/// ring's table), so they are there before any lock above is first taken.
/// Never waits: a thread that finds another one installing them goes on (a
/// fork racing the very first install may find them missing, but then no
/// thread is inside the crate's locks either). False when `pthread_atfork`
/// failed: a fork then copies registered memory, and its child may find a
/// lock held.
pub(crate) fn install() -> bool {
    const NONE: u8 = 0;
    const INSTALLING: u8 = 1;
    const INSTALLED: u8 = 2;
    const FAILED: u8 = 3;
    static STATE: AtomicU8 = AtomicU8::new(NONE);
    match STATE.load(Ordering::Acquire) {
        INSTALLED | INSTALLING => return true,
        FAILED => return false,
        _ => {}
    }
    if STATE.compare_exchange(NONE, INSTALLING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return STATE.load(Ordering::Acquire) != FAILED;
    }
    // SAFETY: registers three plain functions; they call the hooks (which
    // take the crate's locks) and never unwind.
    let rc = unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
    STATE.store(if rc == 0 { INSTALLED } else { FAILED }, Ordering::Release);
    rc == 0
}

/// What the prepare handler holds until the fork is done, by hook; let go
/// of in the reverse order ([`release`]), the gate last.
struct Holding {
    by_hook: Vec<Held>,
    _gate: crate::rt::sync::MutexGuard<'static, ()>,
}

thread_local! {
    /// On the forking thread (which runs all three handlers, and is the
    /// child's only thread).
    static HOLDING: RefCell<Option<Holding>> = const { RefCell::new(None) };
}

/// `pthread_atfork` prepare: see the module doc. Nothing may unwind out of
/// it: after a panic (which lets go of whatever it took) the fork goes on
/// unprotected.
extern "C" fn before_fork() {
    if std::panic::catch_unwind(prepare).is_err() {
        FORK_PENDING.store(false, Ordering::Release);
    }
}

/// Allocates (glibc runs the prepare handlers before it takes malloc's
/// locks, and the child handlers after it resets them).
fn prepare() {
    for settle in crate::FORK_PARTICIPANTS.settle {
        drop(settle(Instant::now() + FORK_WAIT));
    }
    let gate = GATE.lock();
    FORK_PENDING.store(true, Ordering::Release);
    let deadline = Instant::now() + FORK_WAIT;
    let by_hook = crate::FORK_PARTICIPANTS.hold.iter().map(|take| take(deadline)).collect();
    HOLDING.with(|h| *h.borrow_mut() = Some(Holding { by_hook, _gate: gate }));
}

/// Lets go of what `prepare` took, the last hook first; the gate last, once
/// the flag is down, so that the runs waiting at it go on with their tables
/// at once.
fn release() {
    let Some(mut holding) = HOLDING.with(|h| h.borrow_mut().take()) else { return };
    while let Some(held) = holding.by_hook.pop() {
        drop(held);
    }
    FORK_PENDING.store(false, Ordering::Release);
    drop(holding);
}

/// `pthread_atfork` parent.
extern "C" fn after_fork_in_parent() {
    let _ = std::panic::catch_unwind(release);
}

/// `pthread_atfork` child: the same, on the child's copies (unlocking a
/// futex-based lock is an atomic and at most one futex wake, fine in the
/// child). The parent's rings, and their tables, are never used here.
extern "C" fn after_fork_in_child() {
    FORKS_INTO_THIS_PROCESS.fetch_add(1, Ordering::Relaxed);
    let _ = std::panic::catch_unwind(release);
}

/// How many forks lie between the first process of this line and this one
/// (0 in a process not made by `fork()` since the handlers were installed).
static FORKS_INTO_THIS_PROCESS: AtomicU64 = AtomicU64::new(0);

/// Which fork of its line this process is: with the pid, it tells a
/// process from a descendant that was given the same pid after the
/// original exited (`threads::StartedIn`).
pub(crate) fn fork_generation() -> u64 {
    FORKS_INTO_THIS_PROCESS.load(Ordering::Relaxed)
}
