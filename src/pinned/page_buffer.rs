//! Page-aligned anonymous mappings, locked or not: the memory of the
//! manager's regions and of the bounce pool; and the page size and memlock
//! limit they are sized by.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::engine::fixed::RegistrableMemory;
use crate::error::{last_errno, Error, Result};

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// The current RLIMIT_MEMLOCK (soft, hard), in bytes.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
pub fn memlock_limit() -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0 {
        (r.rlim_cur as u64, r.rlim_max as u64)
    } else {
        (0, 0)
    }
}

/// An anonymous, page-aligned mapping. It is locked when `locked` says so.
/// Used directly for bounce buffers, and by the manager for its regions.
#[derive(Debug)]
pub struct PageAlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped: usize,
    locked: bool,
    /// The bounce pool's buffers may be registered with io_uring.
    registrable: Option<Arc<RegistrableMemory>>,
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for PageAlignedBuffer {}
// SAFETY: `&self` methods only hand out the address and read the bytes;
// writes go through `&mut self`.
unsafe impl Sync for PageAlignedBuffer {}

impl PageAlignedBuffer {
    /// Maps `len` bytes (at least one page). With `lock = Required` an mlock
    /// failure is an error that names the size and RLIMIT_MEMLOCK; with
    /// `BestEffort` the buffer stays unlocked (bounce buffers only need to be
    /// aligned, locking just makes them faster).
    pub fn new(len: usize, lock: LockMode) -> Result<Self> {
        Self::map(len, lock, false)
    }

    /// Maps `len` bytes with every page faulted in now (`MAP_POPULATE`), so
    /// that the first copy into it takes no page faults: the bounce pool's
    /// buffers, which are reused op after op (and so are worth registering
    /// with io_uring).
    pub(crate) fn new_populated(len: usize) -> Result<Self> {
        let mut buf = Self::map(len, LockMode::None, true)?;
        buf.registrable = Some(RegistrableMemory::new(buf.ptr.as_ptr() as usize, buf.mapped, false));
        Ok(buf)
    }

    /// As memory io_uring may register, when it may be.
    pub(crate) fn registrable(&self) -> Option<&Arc<RegistrableMemory>> {
        self.registrable.as_ref()
    }

    fn map(len: usize, lock: LockMode, populate: bool) -> Result<Self> {
        let page = page_size();
        let mapped = len.max(1).checked_add(page - 1).map(|v| v / page * page).ok_or_else(|| {
            Error::Alloc { bytes: len, source: io::Error::from_raw_os_error(libc::ENOMEM) }
        })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 },
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Alloc { bytes: len, source: io::Error::last_os_error() });
        }
        let mut buf = PageAlignedBuffer {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned null"),
            len,
            mapped,
            locked: false,
            registrable: None,
        };
        if lock != LockMode::None {
            // SAFETY: locking our own mapping.
            if unsafe { libc::mlock(p, mapped) } == 0 {
                buf.locked = true;
            } else if lock == LockMode::Required {
                let errno = last_errno();
                let (limit_soft, limit_hard) = memlock_limit();
                // `buf` unmaps on drop.
                return Err(Error::Lock { bytes: len, errno, limit_soft, limit_hard });
            }
        }
        Ok(buf)
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn is_locked(&self) -> bool {
        self.locked
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `len` readable bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives up ownership without unmapping; `release_raw` undoes it.
    pub(super) fn into_raw(mut self) -> (NonNull<u8>, usize) {
        let out = (self.ptr, self.mapped);
        drop(self.registrable.take());
        std::mem::forget(self);
        out
    }
}

/// Unlocks and unmaps a mapping made by [`PageAlignedBuffer::new`].
pub(super) fn release_raw(ptr: *mut u8, mapped: usize, locked: bool) {
    // SAFETY: the caller owns this mapping and nobody uses it any more.
    unsafe {
        if locked {
            libc::munlock(ptr as *const libc::c_void, mapped);
        }
        libc::munmap(ptr as *mut libc::c_void, mapped);
    }
}

impl Drop for PageAlignedBuffer {
    fn drop(&mut self) {
        release_raw(self.ptr.as_ptr(), self.mapped, self.locked);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    None,
    BestEffort,
    Required,
}
