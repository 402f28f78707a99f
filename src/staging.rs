//! The bounce path's memory: page-aligned buffers, faulted in once and
//! reused op after op, so a bounced op costs one copy of its bytes and no
//! allocation, no page faults and no zeroing (a fresh 256 MiB mapping costs
//! 65,536 page faults, which was most of the bounce path's CPU time).
//!
//! Buffers are kept by size class (a power of two, at least 64 KiB); an op
//! takes one of the class its bytes need and gives it back when it is
//! dropped. Idle buffers are kept up to [`crate::knobs::BOUNCE_POOL_MAX_BYTES`]
//! in all (past that, a returned buffer is unmapped).
//!
//! A bounced write copies the caller's bytes when it is submitted (the
//! caller may reuse its buffer as soon as an async write returns, as with
//! DeepSpeed), with several threads for large buffers ([`parallel_copy`]).
//! A bounced read into host memory copies each block out on the I/O thread
//! as soon as the block completes ([`BounceCopy`]), so the copies are spread
//! over the workers and overlap the device's work on the next blocks.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::engine::Piece;
use crate::error::{Direction, Result};
use crate::pinned::PageAlignedBuffer;

const MIN_CLASS: usize = 64 << 10;

/// Idle buffers by size class, and their total size.
struct Pool {
    idle: BTreeMap<usize, Vec<PageAlignedBuffer>>,
    idle_bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { idle: BTreeMap::new(), idle_bytes: 0 });

fn class_of(len: usize) -> usize {
    len.max(MIN_CLASS).checked_next_power_of_two().unwrap_or(len)
}

/// A bounce buffer from the pool; back to the pool when dropped.
pub(crate) struct StagingBuffer {
    buffer: Option<PageAlignedBuffer>,
    class: usize,
}

impl StagingBuffer {
    /// At least `len` page-aligned, already faulted-in bytes.
    pub fn take(len: usize) -> Result<StagingBuffer> {
        let class = class_of(len);
        let reused = {
            let mut pool = POOL.lock();
            let found = pool.idle.get_mut(&class).and_then(Vec::pop);
            if found.is_some() {
                pool.idle_bytes -= class;
            }
            found
        };
        let buffer = match reused {
            Some(b) => b,
            None => PageAlignedBuffer::new_populated(class)?,
        };
        Ok(StagingBuffer { buffer: Some(buffer), class })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.buffer.as_ref().expect("staging buffer").as_ptr()
    }

    /// The first `len` bytes.
    pub fn slice(&self, len: usize) -> &[u8] {
        &self.buffer.as_ref().expect("staging buffer").as_slice()[..len]
    }

    /// The first `len` bytes, writable.
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.buffer.as_mut().expect("staging buffer").as_mut_slice()[..len]
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else { return };
        let mut pool = POOL.lock();
        if pool.idle_bytes + self.class <= crate::knobs::settings().bounce_pool_max_bytes {
            pool.idle_bytes += self.class;
            pool.idle.entry(self.class).or_default().push(buffer);
        }
        // Else `buffer` is unmapped here (outside nothing: the pool lock is
        // held, but munmap does not call back into us).
    }
}

/// Copies `src` into `dst` (same length), with several threads when it is
/// large: one thread copies about 5–10 GB/s, a fraction of what the memory
/// and a fast drive sustain.
pub(crate) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    const PER_THREAD: usize = 8 << 20;
    let n = dst.len().min(src.len());
    let threads = std::thread::available_parallelism().map_or(1, |v| v.get()).min(8).min(n / PER_THREAD).max(1);
    if threads == 1 {
        dst[..n].copy_from_slice(&src[..n]);
        return;
    }
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        let mut rest = dst[..n].chunks_mut(chunk).zip(src[..n].chunks(chunk));
        let first = rest.next();
        for (d, s_) in rest {
            s.spawn(move || d.copy_from_slice(s_));
        }
        if let Some((d, s_)) = first {
            d.copy_from_slice(s_);
        }
    });
}

/// The copy-out of a bounced read into contiguous host memory, done piece
/// by piece by the engines as pieces complete: `bounce..bounce+len` is the
/// I/O memory, `caller..caller+len` the caller's bytes, in step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BounceCopy {
    pub direction: Direction,
    pub bounce: usize,
    pub caller: usize,
    pub len: usize,
}

impl BounceCopy {
    /// The caller's address for I/O memory at `addr` (inside the bounce).
    fn caller_addr(&self, addr: *mut u8) -> *mut u8 {
        let off = addr as usize - self.bounce;
        debug_assert!(off <= self.len);
        (self.caller + off) as *mut u8
    }

    /// After a read piece completed entirely: its bytes to the caller.
    pub fn after_complete(&self, piece: &Piece) {
        if self.direction == Direction::Read && piece.len > 0 {
            // SAFETY: the piece lies inside the bounce buffer, which the op
            // owns, and the kernel is done with it; the caller's range is in
            // step with it and valid until the op finishes (BufferDesc's
            // contract).
            unsafe { std::ptr::copy_nonoverlapping(piece.addr, self.caller_addr(piece.addr), piece.len) };
        }
    }
}

// SAFETY: addresses of memory the op keeps alive until every engine run
// that uses them has returned.
unsafe impl Send for BounceCopy {}
unsafe impl Sync for BounceCopy {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_size_class() {
        // A class no other test uses (the pool is process-wide).
        let a = StagingBuffer::take((24 << 20) + 7).unwrap();
        let addr = a.as_ptr();
        assert_eq!(addr as usize % crate::pinned::page_size(), 0);
        drop(a);
        let b = StagingBuffer::take(30 << 20).unwrap(); // the same 32 MiB class
        assert_eq!(b.as_ptr(), addr, "the idle buffer of the class is reused");
        let c = StagingBuffer::take(30 << 20).unwrap();
        assert_ne!(c.as_ptr(), addr, "a buffer in use is never handed out twice");
        assert_eq!(class_of(1), MIN_CLASS);
        assert_eq!(class_of((1 << 20) + 1), 2 << 20);
    }
}
