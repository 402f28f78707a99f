//! The one buffer a bare run moves: a tensor-sized anonymous mapping on huge
//! pages where the machine gives them, filled and locked, as deepnvme's
//! locked tensors are (`src/pinned/page_buffer.rs`).
//!
//! It asks for hugetlb pages first (`MAP_HUGETLB`, only where
//! `vm.nr_hugepages` reserved some), then for transparent huge pages (a
//! mapping on a 2 MiB boundary advised `MADV_HUGEPAGE`), and reports what it
//! got, counted from `/proc/self/smaps`, so that a table never shows a 4 KiB
//! baseline as a huge-page one.

use std::io;

const HUGE: usize = 2 << 20;

/// What backs the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Reserved huge pages (`MAP_HUGETLB`).
    HugeTlb,
    /// Transparent huge pages asked for with `MADV_HUGEPAGE`; how many bytes
    /// of the buffer `/proc/self/smaps` shows on them is in [`Buffer::huge_bytes`].
    Thp,
}

/// A locked, page-aligned, filled mapping of `len` bytes.
pub struct Buffer {
    ptr: *mut u8,
    mapped: usize,
    len: usize,
    pub pages: Pages,
    pub locked: bool,
}

// SAFETY: plain memory owned by this value; the workers write disjoint
// slices of it, between barriers (workers.rs).
unsafe impl Send for Buffer {}
// SAFETY: as above: `&self` hands out only the address.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Maps `len` bytes (rounded up to 2 MiB), fills them with `fill` (which
    /// faults every page in) and locks them.
    pub fn new(len: usize, fill: u8) -> io::Result<Buffer> {
        let mapped = len.div_ceil(HUGE) * HUGE;
        let (ptr, pages) = match map(mapped, libc::MAP_HUGETLB) {
            Some(p) => (p, Pages::HugeTlb),
            None => (map_thp(mapped)?, Pages::Thp),
        };
        // SAFETY: `ptr..ptr + mapped` is the writable mapping just made.
        unsafe { std::ptr::write_bytes(ptr, fill, mapped) };
        // SAFETY: the same mapping.
        let locked = unsafe { libc::mlock(ptr.cast(), mapped) } == 0;
        Ok(Buffer { ptr, mapped, len, pages, locked })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The buffer's bytes (for checks after a run; no worker runs then).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the mapping, initialized by the fill.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Bytes of the buffer on huge pages: all of it for hugetlb, else the
    /// `AnonHugePages` of its mapping in `/proc/self/smaps` (None when that
    /// cannot be read).
    pub fn huge_bytes(&self) -> Option<usize> {
        match self.pages {
            Pages::HugeTlb => Some(self.mapped),
            Pages::Thp => thp_bytes(self.ptr as usize, self.mapped),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping this value owns; nobody uses it any more.
        unsafe {
            if self.locked {
                libc::munlock(self.ptr.cast(), self.mapped);
            }
            libc::munmap(self.ptr.cast(), self.mapped);
        }
    }
}

fn map(len: usize, extra: libc::c_int) -> Option<*mut u8> {
    // SAFETY: an anonymous private mapping; no memory of ours is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// A mapping on a 2 MiB boundary (over-mapped by one huge page, head and
/// tail given back), advised `MADV_HUGEPAGE` before any page is touched.
fn map_thp(len: usize) -> io::Result<*mut u8> {
    let padded = len + HUGE;
    let p = map(padded, 0).ok_or_else(io::Error::last_os_error)?;
    let start = p as usize;
    let aligned = start.next_multiple_of(HUGE);
    let (head, tail) = (aligned - start, start + padded - (aligned + len));
    // SAFETY: parts of the mapping just made, which nobody else knows of.
    unsafe {
        if head > 0 {
            libc::munmap(p.cast(), head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
        // Advice only: where THP is off the pages stay small, and the
        // report says so.
        libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    Ok(aligned as *mut u8)
}

/// `AnonHugePages` of the smaps entries inside `start..start + len`, in bytes.
fn thp_bytes(start: usize, len: usize) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let end = start + len;
    let mut inside = false;
    let mut total = 0usize;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a >= start && b <= end;
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                total += kb.trim().trim_end_matches("kB").trim().parse::<usize>().ok()? * 1024;
            }
        }
    }
    Some(total)
}
