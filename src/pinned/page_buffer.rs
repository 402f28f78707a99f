//! Page-aligned anonymous mappings, locked or not: the memory of the
//! manager's regions and of the bounce pool; and the page size and memlock
//! limit they are sized by.
//!
//! A mapping of a huge page or more (2 MiB on x86-64) starts on a huge-page
//! boundary and asks for transparent huge pages (`MADV_HUGEPAGE`; most
//! distributions' THP setting is `madvise`, which gives them only to memory
//! that asks). The kernel then pins, registers and walks such memory a huge
//! page at a time instead of 4 KiB, and the copies into and out of it take
//! fewer TLB misses (measured: docs/perf/huge_pages_ab.md).
//! `DEEPNVME_HUGE_PAGES=0` turns it off; where THP is off or absent the
//! advice is simply refused.

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
        let huge = mapped >= huge_page_size() && crate::knobs::settings().huge_pages;
        let p = if huge { map_large(mapped, populate) } else { map_anonymous(mapped, populate) };
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

    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether `mlock` succeeded on it.
    pub fn is_locked(&self) -> bool {
        self.locked
    }
    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `len` readable bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    /// Its bytes, to write.
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

/// The size of a transparent huge page (the kernel's PMD size: 2 MiB on
/// x86-64 and on arm64 with 4 KiB pages), or 2 MiB where it does not say.
fn huge_page_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&v| v.is_power_of_two() && v >= page_size())
            .unwrap_or(2 << 20)
    })
}

/// `mmap`s `bytes` of private anonymous memory, faulted in when `populate`.
fn map_anonymous(bytes: usize, populate: bool) -> *mut libc::c_void {
    let populate = if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate,
            -1,
            0,
        )
    }
}

/// Maps `bytes` (a multiple of the page size) for a buffer of 2 MiB or
/// more: on a huge-page boundary and advised `MADV_HUGEPAGE` where that
/// works, else as [`map_anonymous`] would. `MAP_FAILED` with errno set
/// when even that fails.
fn map_large(bytes: usize, populate: bool) -> *mut libc::c_void {
    match map_huge_aligned(bytes, populate) {
        Ok(Some(p)) => p,
        Ok(None) => map_anonymous(bytes, populate), // no room for the padding, or the split was refused
        Err(errno) => {
            // SAFETY: setting this thread's errno for the caller to read.
            unsafe { *libc::__errno_location() = errno };
            libc::MAP_FAILED
        }
    }
}

/// A mapping of `bytes` starting on a huge-page boundary, advised
/// `MADV_HUGEPAGE` before any page is faulted in (a populated mapping's
/// pages would already be small ones). It over-maps by one huge page and
/// unmaps the head and tail again, so the result is `bytes` long like any
/// other. `Ok(None)`: that could not be done (nothing is left mapped);
/// `Err(errno)`: the memory could not be faulted in (nothing is left mapped).
fn map_huge_aligned(bytes: usize, populate: bool) -> std::result::Result<Option<*mut libc::c_void>, i32> {
    let huge = huge_page_size();
    let Some(padded) = bytes.checked_add(huge) else { return Ok(None) };
    let p = map_anonymous(padded, false);
    if p == libc::MAP_FAILED {
        return Ok(None);
    }
    let start = p as usize;
    let aligned = start.next_multiple_of(huge);
    let (head, tail) = (aligned - start, start + padded - (aligned + bytes));
    let at = aligned as *mut libc::c_void;
    // SAFETY: all within the mapping just made, which nobody else knows of.
    unsafe {
        if head > 0 && libc::munmap(p, head) != 0 {
            libc::munmap(p, padded); // the split was refused (vm.max_map_count): give it all back
            return Ok(None);
        }
        if tail > 0 && libc::munmap((aligned + bytes) as *mut libc::c_void, tail) != 0 {
            libc::munmap(at, bytes + tail);
            return Ok(None);
        }
        // Only advice: where THP is off or absent it is refused and the
        // pages stay small.
        libc::madvise(at, bytes, libc::MADV_HUGEPAGE);
        if populate {
            if let Err(errno) = populate_writable(at, bytes) {
                libc::munmap(at, bytes);
                return Err(errno);
            }
        }
    }
    Ok(Some(at))
}

/// Faults in every page of a fresh mapping, as `MAP_POPULATE` would have
/// (`MADV_POPULATE_WRITE`: Linux 5.14). `Err(errno)` when the memory is
/// not there (ENOMEM, EFAULT).
///
/// # Safety
/// `at..at + bytes` is a private anonymous mapping the caller owns and
/// nobody uses yet.
unsafe fn populate_writable(at: *mut libc::c_void, bytes: usize) -> std::result::Result<(), i32> {
    // SAFETY: the caller's contract.
    if unsafe { libc::madvise(at, bytes, libc::MADV_POPULATE_WRITE) } == 0 {
        return Ok(());
    }
    match last_errno() {
        // A kernel before 5.14, or a seccomp filter that refuses the advice:
        // touch one byte per page (the mapping is all zeros).
        libc::EINVAL | libc::EPERM | libc::ENOSYS => {
            let page = page_size();
            for offset in (0..bytes).step_by(page) {
                // SAFETY: inside the caller's mapping, which is writable.
                unsafe { std::ptr::write_volatile(at.cast::<u8>().add(offset), 0) };
            }
            Ok(())
        }
        errno => Err(errno),
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

/// Whether a [`PageAlignedBuffer`] is page-locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Not locked.
    None,
    /// Locked when RLIMIT_MEMLOCK allows, else left unlocked.
    BestEffort,
    /// Locked, or an error.
    Required,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AnonHugePages` of the mapping that holds `addr`, in bytes.
    fn anon_huge_bytes_at(addr: usize) -> usize {
        crate::test_support::smaps_kib_of(addr, 1, "AnonHugePages") * 1024
    }

    /// Whether this kernel gives huge pages to memory that asks
    /// (`always` or `madvise`).
    fn thp_on_request() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .map(|s| s.contains("[always]") || s.contains("[madvise]"))
            .unwrap_or(false)
    }

    /// `thp_fault_fallback` of /proc/vmstat: faults in huge-page memory
    /// that got small pages (fragmented memory, a tight cgroup).
    fn thp_fallbacks() -> u64 {
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        vmstat
            .lines()
            .find_map(|l| l.strip_prefix("thp_fault_fallback "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn large_mappings_start_on_a_huge_page_boundary_and_get_huge_pages() {
        let huge = huge_page_size();
        if huge > 2 << 20 {
            return eprintln!("huge pages of {huge} bytes here: 4-6 MiB mappings stay small");
        }
        let fallbacks = thp_fallbacks();
        let mut populated = PageAlignedBuffer::new_populated(6 << 20).unwrap();
        let mut plain = PageAlignedBuffer::new(4 << 20, LockMode::BestEffort).unwrap();
        for buf in [&mut populated, &mut plain] {
            assert_eq!(buf.as_ptr() as usize % huge, 0, "a huge-page-aligned start");
            assert!(buf.as_slice().iter().all(|&b| b == 0), "fresh memory reads as zeros");
            buf.as_mut_slice().fill(0xA5); // every page writable, and faulted in
            assert!(buf.as_slice().iter().all(|&b| b == 0xA5));
        }
        let got = [anon_huge_bytes_at(populated.as_ptr() as usize), anon_huge_bytes_at(plain.as_ptr() as usize)];
        if !thp_on_request() {
            eprintln!("transparent huge pages are off here: only the alignment was checked");
        } else if got.iter().any(|&b| b < huge) && thp_fallbacks() > fallbacks {
            eprintln!("the kernel fell back to small pages (thp_fault_fallback rose): {got:?}");
        } else {
            assert!(got[0] >= huge, "a populated 6 MiB bounce buffer is backed by huge pages: {got:?}");
            assert!(got[1] >= huge, "and so is a 4 MiB mapping: {got:?}");
        }
    }

    #[test]
    fn small_mappings_stay_small() {
        let buf = PageAlignedBuffer::new(64 << 10, LockMode::None).unwrap();
        assert_eq!(buf.len(), 64 << 10);
        assert_eq!(buf.as_ptr() as usize % page_size(), 0);
    }
}
