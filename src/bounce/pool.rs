//! The bounce path's memory: page-aligned host buffers for ops on memory
//! that the I/O cannot use directly (unlocked, strided or device memory),
//! and the process-wide budget they draw from.
//!
//! * **Sized to the op.** A buffer is the op's bytes rounded up to a page,
//!   faulted in once (a fresh mapping's page faults were most of the bounce
//!   path's CPU time) and kept for reuse by an op of the same size, up to
//!   [`crate::knobs::Settings::bounce_pool_max_bytes`] of idle buffers.
//! * **Budgeted.** Bounce bytes in use, process-wide, never pass
//!   [`crate::knobs::Settings::bounce_max_bytes`]: an async op that would
//!   pass it fails, naming [`crate::knobs::BOUNCE_MAX_MB_ENV`]. Blocking ops
//!   stream through a few windows of bounded size (`bounce/window.rs`), which
//!   always get their memory: at most [`crate::knobs::BOUNCE_WINDOWS_MAX`]
//!   windows per blocking call in progress.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::rt::sync::Mutex;

use crate::error::{Error, Result};
use crate::pinned::{page_size, PageAlignedBuffer};

/// Idle buffers by size, and what is in use.
struct Pool {
    idle: BTreeMap<usize, Vec<PageAlignedBuffer>>,
    idle_bytes: usize,
    /// Bytes of the buffers handed out and not yet returned.
    in_use: usize,
}

/// The process's bounce memory. A leaf lock: nothing else is taken while
/// it is held (the fork handler relies on that). Taken through [`pool`].
static POOL: Mutex<Pool> = Mutex::new(Pool { idle: BTreeMap::new(), idle_bytes: 0, in_use: 0 });

/// What a buffer is for: async snapshots are refused at the budget,
/// windows of blocking ops are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The whole of an async op's bytes, held until `wait()` finishes it.
    AsyncOp,
    /// One window of a blocking op (bounded, released when the call returns).
    Window,
}

/// A bounce buffer; back to the pool when dropped.
pub(crate) struct BounceBuffer {
    buffer: Option<PageAlignedBuffer>,
    size: usize,
}

impl BounceBuffer {
    /// At least `len` page-aligned, faulted-in bytes (`len` rounded up to a
    /// page). `what` names the op in the error at the budget.
    pub fn take(len: usize, purpose: Purpose, what: &dyn Fn() -> String) -> Result<BounceBuffer> {
        let page = page_size();
        let size = len.max(1).div_ceil(page) * page;
        let reused = {
            let mut pool = pool();
            let budget = crate::knobs::settings().bounce_max_bytes;
            if purpose == Purpose::AsyncOp && pool.in_use + size > budget {
                return Err(Error::BounceBudget { op: what(), needed: size, in_use: pool.in_use, budget });
            }
            pool.in_use += size;
            let found = pool.idle.get_mut(&size).and_then(Vec::pop);
            if found.is_some() {
                pool.idle_bytes -= size;
            }
            found
        };
        let buffer = match reused {
            Some(b) => b,
            None => match PageAlignedBuffer::new_populated(size) {
                Ok(b) => b,
                Err(e) => {
                    pool().in_use -= size;
                    return Err(e);
                }
            },
        };
        Ok(BounceBuffer { buffer: Some(buffer), size })
    }

    fn buffer(&self) -> &PageAlignedBuffer {
        self.buffer.as_ref().expect("a bounce buffer holds its memory until dropped")
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.buffer().as_ptr()
    }

    /// The buffer as memory io_uring may register (it outlives the op: the
    /// pool keeps it for the next).
    pub fn registrable(&self) -> Option<&Arc<crate::engine::fixed::RegistrableMemory>> {
        self.buffer().registrable()
    }

    /// The first `len` bytes.
    pub fn slice(&self, len: usize) -> &[u8] {
        &self.buffer().as_slice()[..len]
    }

    /// The first `len` bytes, writable.
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buffer.as_mut().expect("a bounce buffer holds its memory until dropped").as_mut_slice()[..len]
    }
}

impl Drop for BounceBuffer {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else { return };
        let mut pool = pool();
        pool.in_use -= self.size;
        if pool.idle_bytes + self.size <= crate::knobs::settings().bounce_pool_max_bytes {
            // Kept for the next op: worth registering with io_uring now.
            if let Some(memory) = buffer.registrable() {
                memory.mark_reusable();
            }
            pool.idle_bytes += self.size;
            pool.idle.entry(self.size).or_default().push(buffer);
            return;
        }
        drop(pool);
        drop(buffer); // unmapped outside the lock
    }
}

/// The pool's lock (the fork handlers installed first: see `rt/fork.rs`).
fn pool() -> crate::rt::sync::MutexGuard<'static, Pool> {
    crate::rt::fork::install();
    POOL.lock()
}

/// The fork handler's hook (`rt/fork.rs`): holds the pool across `fork()`, so
/// that no other thread is inside it at the fork and a child can take it.
pub(crate) fn hold_for_fork(_: std::time::Instant) -> crate::rt::fork::Held {
    Some(Box::new(POOL.lock()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what() -> String {
        "a test op".into()
    }

    #[test]
    fn buffers_are_sized_to_the_op_and_reused_by_size() {
        let page = page_size();
        // A size no other test uses (the pool is process-wide).
        let a = BounceBuffer::take((24 << 20) + 7, Purpose::AsyncOp, &what).unwrap();
        assert_eq!(a.size, ((24 << 20) + 7usize).div_ceil(page) * page, "page-rounded, not a power of two");
        let addr = a.as_ptr();
        assert_eq!(addr as usize % page, 0);
        drop(a);
        let b = BounceBuffer::take((24 << 20) + 1, Purpose::AsyncOp, &what).unwrap();
        assert_eq!(b.as_ptr(), addr, "the idle buffer of the size is reused");
        let c = BounceBuffer::take((24 << 20) + 1, Purpose::AsyncOp, &what).unwrap();
        assert_ne!(c.as_ptr(), addr, "a buffer in use is never handed out twice");
    }
}
