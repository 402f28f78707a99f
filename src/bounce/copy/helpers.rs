//! The process's copy helpers: threads kept for the life of the process
//! that take pieces of a large host copy beside the thread that asked for it.
//!
//! A copy is cut into pieces of [`COPY_PIECE_BYTES`]. The calling thread posts
//! it, wakes idle helpers, and takes pieces itself until none is left; a
//! helper that wakes in time takes pieces too. So a copy never waits for a
//! helper to start: a late, busy or missing helper only means the calling
//! thread copies more. The calling thread returns only once every piece
//! that was taken is done, so no helper touches the copy's memory after
//! the copy returned (the ownership rule, `op/caller.rs`: a copy of caller
//! memory runs inside the front end's hold, and so do its helpers' pieces).
//!
//! Why kept threads: a window's copy is short, and a thread started per
//! copy cost more than the share it took over (docs/perf/bounds.md).
//!
//! `fork()`: a child has none of its parent's helpers. Its copies run on
//! the calling thread alone, and it never takes the parent's pool's locks,
//! which a helper may have held at the fork. (A child whose parent never
//! made a large copy starts helpers of its own.) Starting the pool is never
//! waited for: a thread that finds it being started copies alone.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::streaming::copy_streaming;
use crate::knobs::{COPY_HELPERS_MAX, COPY_PIECE_BYTES, COPY_SPIN_FOR_LAST_PIECE};
use crate::rt::sync::{Condvar, Mutex};
use crate::rt::threads::{self, Role, StartedIn};

/// Bytes the helpers copied, process-wide (tests read it).
static HELPER_BYTES: AtomicU64 = AtomicU64::new(0);

/// One copy being shared: where, how many pieces, which is next, how many
/// are done.
struct SharedCopy {
    dst: usize,
    src: usize,
    len: usize,
    pieces: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Pieces the helpers copied.
    helped: AtomicUsize,
    /// Taken by the thread that finishes the last piece before it wakes a
    /// waiter, so a waiter that saw pieces left is asleep by then.
    all_done: Mutex<()>,
    all_done_cv: Condvar,
}

impl SharedCopy {
    /// Copies pieces until none is left to take; returns how many it copied.
    /// `by_helper`: counted as the helpers' (before the piece is counted done).
    fn take_pieces(&self, by_helper: bool) -> usize {
        let mut taken = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.pieces {
                return taken;
            }
            let off = i * COPY_PIECE_BYTES;
            let n = COPY_PIECE_BYTES.min(self.len - off);
            // SAFETY: piece `i` lies inside both buffers, which stay valid
            // until every piece is done (`copy`'s contract and its wait), and
            // only this thread took it. copy_streaming fences its stores
            // before the count below tells anyone the bytes are there.
            unsafe { copy_streaming((self.dst + off) as *mut u8, (self.src + off) as *const u8, n) };
            taken += 1;
            if by_helper {
                HELPER_BYTES.fetch_add(n as u64, Ordering::Relaxed);
                self.helped.fetch_add(1, Ordering::Relaxed);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces {
                drop(self.all_done.lock());
                self.all_done_cv.notify_all();
            }
        }
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.pieces
    }

    /// Waits for the pieces other threads took.
    fn wait_done(&self) {
        let spinning = Instant::now();
        while !self.is_done() {
            if spinning.elapsed() > COPY_SPIN_FOR_LAST_PIECE {
                let mut held = self.all_done.lock();
                while !self.is_done() {
                    self.all_done_cv.wait(&mut held);
                }
                return;
            }
            std::hint::spin_loop();
        }
    }
}

/// What the helpers wait on: the copy posted last, and a count of posts.
#[derive(Default)]
struct Posted {
    generation: u64,
    copy: Option<Arc<SharedCopy>>,
}

#[derive(Default)]
struct Board {
    posted: Mutex<Posted>,
    wake: Condvar,
}

struct Pool {
    board: Arc<Board>,
    helpers: usize,
    started_in: StartedIn,
}

impl Pool {
    /// Starts one helper per CPU beyond the first (at most
    /// [`COPY_HELPERS_MAX`]); one that cannot be started is one fewer.
    fn start() -> Pool {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let board = Arc::new(Board::default());
        let mut helpers = 0;
        for index in 0..cpus.saturating_sub(1).min(COPY_HELPERS_MAX) {
            let board = board.clone();
            match threads::spawn(Role::Copy, index, move || helper_loop(&board)) {
                Ok(_) => helpers += 1, // detached: it lives as long as the process
                Err(e) => {
                    crate::rt::log::info_once("copy-helper-start", &format!("{e}; large copies use fewer threads"));
                    break;
                }
            }
        }
        Pool { board, helpers, started_in: StartedIn::here() }
    }
}

fn helper_loop(board: &Board) {
    let mut seen = 0u64;
    loop {
        let copy = {
            let mut posted = board.posted.lock();
            loop {
                if posted.generation != seen {
                    seen = posted.generation;
                    if let Some(copy) = posted.copy.clone() {
                        break copy;
                    }
                }
                board.wake.wait(&mut posted);
            }
        };
        copy.take_pieces(true);
    }
}

static POOL: OnceLock<Pool> = OnceLock::new();
/// Held while the pool starts. Taken with `try_lock` only: a thread that
/// finds it held (another thread is starting the pool, or was at a fork)
/// copies alone instead of waiting.
static STARTING: Mutex<()> = Mutex::new(());

/// The pool, when this process has helpers (started on first use).
fn pool() -> Option<&'static Pool> {
    let usable = |pool: &'static Pool| (pool.helpers > 0 && pool.started_in.is_here()).then_some(pool);
    if let Some(pool) = POOL.get() {
        return usable(pool);
    }
    let _starting = STARTING.try_lock()?;
    if POOL.get().is_none() {
        let _ = POOL.set(Pool::start()); // (only ever set under STARTING: never waits)
    }
    POOL.get().and_then(usable)
}

/// Copies `len` bytes from `src` to `dst`, sharing pieces with the helpers
/// when there are at least two pieces and the process has helpers;
/// otherwise on this thread alone. Returns once every byte is copied, with
/// how many pieces the helpers copied.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`, for the whole call.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> usize {
    let pool = match len >= 2 * COPY_PIECE_BYTES {
        true => pool(),
        false => None,
    };
    let Some(pool) = pool else {
        // SAFETY: the function's contract.
        unsafe { copy_streaming(dst, src, len) };
        return 0;
    };
    let pieces = len.div_ceil(COPY_PIECE_BYTES);
    let shared = Arc::new(SharedCopy {
        dst: dst as usize,
        src: src as usize,
        len,
        pieces,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        helped: AtomicUsize::new(0),
        all_done: Mutex::new(()),
        all_done_cv: Condvar::new(),
    });
    {
        let mut posted = pool.board.posted.lock();
        posted.generation += 1;
        posted.copy = Some(shared.clone());
    }
    for _ in 0..pool.helpers.min(pieces - 1) {
        pool.board.wake.notify_one();
    }
    shared.take_pieces(false);
    shared.wait_done();
    // Let go of the copy (helpers that wake later find nothing to take).
    let mut posted = pool.board.posted.lock();
    if posted.copy.as_ref().is_some_and(|c| Arc::ptr_eq(c, &shared)) {
        posted.copy = None;
    }
    shared.helped.load(Ordering::Relaxed)
}

/// Bytes the helpers copied so far in this process.
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn helper_bytes() -> u64 {
    HELPER_BYTES.load(Ordering::Relaxed)
}

/// How many helpers this process has (0 in a child of `fork()`).
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn helper_count() -> usize {
    pool().map_or(0, |p| p.helpers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_copy_moves_every_byte_at_any_length_and_alignment() {
        let src = crate::test_support::pattern(0x5C, 9 * COPY_PIECE_BYTES + 4099);
        for (dst_off, src_off, len) in [(0, 0, 2 * COPY_PIECE_BYTES), (3, 1, 9 * COPY_PIECE_BYTES + 77), (17, 0, 4 * COPY_PIECE_BYTES - 1)] {
            let mut dst = vec![0xAAu8; len + 64];
            // SAFETY: both ranges are inside their vectors, which outlive the call.
            unsafe { copy(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len) };
            assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len], "{dst_off} {src_off} {len}");
            assert!(dst[..dst_off].iter().chain(&dst[dst_off + len..]).all(|&b| b == 0xAA), "nothing outside");
        }
    }

    /// The pool, once no other test thread is starting it (a thread that
    /// finds it being started copies alone).
    fn helpers_when_started() -> usize {
        use std::time::Duration;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = helper_count();
            if n > 0 || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn helpers_take_pieces_of_large_copies_on_a_machine_with_several_cpus() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return crate::test_support::skip("one CPU: no copy helpers");
        }
        assert!(helpers_when_started() >= 1, "no copy helper started");
        let src = crate::test_support::pattern(0x3D, 64 << 20);
        let mut dst = vec![0u8; src.len()];
        // A helper wakes within a few of these copies (each about 5 ms).
        let mut helped = 0;
        for _ in 0..20 {
            dst.fill(0);
            // SAFETY: two vectors of the same length.
            helped = unsafe { copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
            assert!(dst == src, "a shared copy left wrong bytes");
            if helped > 0 {
                break;
            }
        }
        assert!(helped > 0, "no helper took a piece of 20 copies of 64 MiB");
    }
}
