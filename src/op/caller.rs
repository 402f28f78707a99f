//! The caller's memory, and the one rule for touching it.
//!
//! **The ownership rule.** Memory an op does not own is the caller's. The
//! core touches it in exactly two ways:
//!
//! 1. *Direct I/O* into or out of memory that cannot move while the op runs:
//!    page-locked memory the op holds (a region of the pinned manager, which
//!    the op's [`crate::pinned::RegionHold`] keeps mapped, or memory the
//!    caller declared pinned and whose front end holds it), and memory whose
//!    owner promised it stays put ([`crate::BufferDesc::from_raw_parts`]'s
//!    contract, the Rust API's borrowed and owned buffers).
//! 2. *Copies* between the caller's memory and the op's bounce buffer, made
//!    only through [`CallerMemory`], which runs each copy inside the front
//!    end's [`Staging::hold_still`] (a Python front end holds the GIL
//!    there, so no Python code can free or move a tensor's storage) after
//!    checking that the memory is still where the op was given it. A copy
//!    that cannot be made that way fails the op; it never writes elsewhere.
//!
//! No I/O thread ever copies to or from movable caller memory: copies run on
//! the thread that submits (a write's bytes) or that waits (a read's), or
//! for a blocking op, the calling thread between the windows it streams
//! through (`bounce/window.rs`). A copy of 1 MiB or more shares its pieces with
//! the process's copy helpers (`bounce/copy/helpers.rs`), but the calling
//! thread returns from it, and so leaves the hold, only once every piece is
//! done: the helpers copy inside the same hold, never after it.
//!
//! **Order.** Every op on a handle, from any thread and by any path (async
//! or blocking, queued, windowed, on the calling thread, GDS), is admitted
//! at one point, `handle/order.rs`, which gives it its place in one serial
//! order (consistent with each thread's own). Ops take effect in that order
//! wherever two of them share caller memory or file bytes and one of them
//! writes there: every byte range ends with the bytes of the op admitted
//! last, and none of two such ops sees part of the other. So a blocking call
//! is atomic against every other call on the handle, as DeepSpeed's is: an
//! op another thread submits while it runs takes effect after it. How:
//! before an op is prepared, the earlier ops on its memory have had their
//! effect there (a bounced read's bytes are copied out), and its I/O starts
//! only after the earlier ops on its file bytes have run theirs; a read that
//! runs past the end of the file is checked again once the earlier writes
//! that grow the file have run, so it sees them instead of being refused.

use crate::buffer::Staging;
use crate::error::{Error, Result};

/// The caller's contiguous host bytes `[addr, addr + len)`, as the op was
/// given them, with the front end's hold on them.
pub(crate) struct CallerMemory {
    pub addr: usize,
    pub len: usize,
}

impl CallerMemory {
    /// Runs `copy` on the caller's bytes `[off, off + n)` while they cannot
    /// move, after checking they are still where they were given. `what`
    /// names the op in the error when they moved.
    pub fn with_bytes<T>(
        &self,
        staging: &dyn Staging,
        off: usize,
        n: usize,
        what: &dyn Fn() -> String,
        copy: impl FnOnce(*mut u8) -> T,
    ) -> Result<T> {
        debug_assert!(off + n <= self.len);
        let mut copy = Some(copy);
        let mut out = None;
        staging.hold_still(&mut || {
            if let Some(now) = staging.current_extent() {
                if now != (self.addr, self.len) {
                    return Err(moved_error(what(), (self.addr, self.len), now));
                }
            }
            let copy = copy.take().expect("hold_still runs its access once");
            out = Some(copy((self.addr + off) as *mut u8));
            Ok(())
        })?;
        out.ok_or_else(|| Error::Copy(format!("{}: the front end did not run the copy", what())))
    }
}

/// A tensor whose storage was replaced (`set_`, `resize_`, `.data =`) or
/// freed while its op was in flight: nothing is copied into it.
pub(crate) fn moved_error(what: String, given: (usize, usize), now: (usize, usize)) -> Error {
    Error::StorageReplaced { op: what, given, now }
}

/// `len` bytes at `ptr` as a slice; an empty slice for `len == 0` (whose
/// pointer may be null: an empty tensor has none).
///
/// # Safety
/// For `len > 0`, as [`std::slice::from_raw_parts`].
pub(crate) unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the function's contract.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// As [`bytes`], writable.
///
/// # Safety
/// For `len > 0`, as [`std::slice::from_raw_parts_mut`].
pub(crate) unsafe fn bytes_mut<'a>(ptr: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the function's contract.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}
