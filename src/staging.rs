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
//! The copies overlap the I/O wherever that is safe ([`BounceCopy`]):
//! * a blocking write (`sync_pwrite`) copies each block in on the I/O thread
//!   just before the block is submitted; an async write copies all of the
//!   caller's bytes when it is submitted (the caller may reuse its buffer as
//!   soon as an async write returns, as with DeepSpeed), with several
//!   threads for large buffers ([`parallel_copy`]);
//! * a read copies each block out on the I/O thread as soon as it completes:
//!   at once for memory that cannot move, and for memory that can (a torch
//!   tensor) only while the caller is in a call on the op ([`CallerGate`]);
//!   what completed before is copied when the caller enters `wait()`.
//!
//! So the copies are spread over the workers and hidden behind the device's
//! work on the next blocks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

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

    /// The buffer as memory io_uring may register (it outlives the op: the
    /// pool keeps it for the next).
    pub fn registrable(&self) -> Option<&Arc<crate::engine::fixed::RegistrableMemory>> {
        self.buffer.as_ref().expect("staging buffer").registrable()
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
            // Kept for the next op: worth registering with io_uring now.
            if let Some(memory) = buffer.registrable() {
                memory.mark_reusable();
            }
            pool.idle_bytes += self.class;
            pool.idle.entry(self.class).or_default().push(buffer);
        }
        // Else `buffer` is unmapped here (outside nothing: the pool lock is
        // held, but munmap does not call back into us).
    }
}

/// Copies below this size use plain stores: the bytes may still be in the
/// cache, and may be wanted there.
const STREAMING_MIN: usize = 64 << 10;

/// Copies `len` bytes from `src` to `dst` (not overlapping). Large copies
/// use non-temporal (streaming) stores where the CPU has them: a bounced
/// block is on its way to the device or to memory that the cache cannot
/// hold anyway, and skipping the cache's read-for-ownership of the target
/// halves the copy's cost (0.29 to 0.15 CPU s/GB on the benchmark machine).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`.
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAMING_MIN {
        // SAFETY: the function's contract; SSE2 is part of x86_64.
        unsafe { copy_streaming_sse2(dst, src, len) };
        return;
    }
    // SAFETY: the function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming_sse2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Plain copy up to a 16-byte aligned target (streaming stores need it).
    let head = ((16 - (dst as usize & 15)) & 15).min(len);
    // SAFETY (whole function): every access is inside [0, len) of both
    // buffers, as the caller promises; stores are 16-byte aligned.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 64 <= len {
            let a = _mm_loadu_si128(src.add(i) as *const __m128i);
            let b = _mm_loadu_si128(src.add(i + 16) as *const __m128i);
            let c = _mm_loadu_si128(src.add(i + 32) as *const __m128i);
            let d = _mm_loadu_si128(src.add(i + 48) as *const __m128i);
            _mm_stream_si128(dst.add(i) as *mut __m128i, a);
            _mm_stream_si128(dst.add(i + 16) as *mut __m128i, b);
            _mm_stream_si128(dst.add(i + 32) as *mut __m128i, c);
            _mm_stream_si128(dst.add(i + 48) as *mut __m128i, d);
            i += 64;
        }
        // Streaming stores are weakly ordered: fence them before anyone
        // (the kernel, another thread) is told the bytes are there.
        _mm_sfence();
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
    }
}

/// How many threads a copy of `bytes` is worth: one per 8 MiB, at most 8
/// and the CPUs (one thread copies about 5–10 GB/s, a fraction of what the
/// memory and a fast drive sustain).
fn copy_threads(bytes: usize) -> usize {
    const PER_THREAD: usize = 8 << 20;
    std::thread::available_parallelism().map_or(1, |v| v.get()).min(8).min(bytes / PER_THREAD).max(1)
}

/// Runs `copy` on every part, the first on the calling thread and the
/// others on scoped threads of their own.
fn copy_parts<P: Send>(parts: impl IntoIterator<Item = P>, copy: impl Fn(P) + Sync) {
    let mut parts = parts.into_iter().peekable();
    let Some(first) = parts.next() else { return };
    if parts.peek().is_none() {
        return copy(first); // one part: no thread
    }
    std::thread::scope(|s| {
        for part in parts {
            let copy = &copy;
            s.spawn(move || copy(part));
        }
        copy(first);
    });
}

/// Copies `src` into `dst` (same length), with several threads when it is
/// large.
pub(crate) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let chunk = n.div_ceil(copy_threads(n)).max(1);
    // SAFETY: two slices of equal length; a &mut never overlaps a &.
    let copy = |(d, s_): (&mut [u8], &[u8])| unsafe { copy_streaming(d.as_mut_ptr(), s_.as_ptr(), d.len()) };
    copy_parts(dst[..n].chunks_mut(chunk).zip(src[..n].chunks(chunk)), copy);
}

/// The caller's side of a bounced op over contiguous host memory, in step
/// with the bounce buffer: `bounce..bounce+len` is the I/O memory,
/// `caller..caller+len` the caller's bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyRange {
    pub direction: Direction,
    pub bounce: usize,
    pub caller: usize,
    pub len: usize,
}

impl CopyRange {
    /// Bounce bytes `off..off+len` to the caller (a read).
    ///
    /// # Safety
    /// The range lies inside both buffers, no I/O is moving those bounce
    /// bytes, and the caller's memory is valid and unused meanwhile.
    unsafe fn copy_to_caller(&self, off: usize, len: usize) {
        debug_assert!(off + len <= self.len);
        // SAFETY: the function's contract.
        unsafe { copy_streaming((self.caller + off) as *mut u8, (self.bounce + off) as *const u8, len) };
    }

    /// The caller's bytes `off..off+len` into the bounce buffer (a write).
    ///
    /// # Safety
    /// As [`Self::copy_to_caller`].
    unsafe fn copy_from_caller(&self, off: usize, len: usize) {
        debug_assert!(off + len <= self.len);
        // SAFETY: the function's contract.
        unsafe { copy_streaming((self.bounce + off) as *mut u8, (self.caller + off) as *const u8, len) };
    }

    /// Copies each of `ranges` (bounce offsets) in this op's direction, with
    /// several threads when there is much to copy.
    ///
    /// # Safety
    /// As [`Self::copy_to_caller`], for every range.
    unsafe fn copy_ranges(&self, ranges: &[(usize, usize)]) {
        let total: usize = ranges.iter().map(|r| r.1).sum();
        let per_thread = ranges.len().div_ceil(copy_threads(total)).max(1);
        copy_parts(ranges.chunks(per_thread), |part| {
            for &(off, len) in part {
                match self.direction {
                    // SAFETY: the function's contract.
                    Direction::Read => unsafe { self.copy_to_caller(off, len) },
                    Direction::Write => unsafe { self.copy_from_caller(off, len) },
                }
            }
        });
    }
}

/// Write-gate chunk states.
const CHUNK_TODO: u8 = 0;
const CHUNK_COPYING: u8 = 1;
const CHUNK_COPIED: u8 = 2;
/// The unit in which a gated write's bytes are copied in.
const GATE_CHUNK: usize = 1 << 20;

/// Lets the I/O threads copy between the bounce buffer and the caller's
/// memory only while the caller's thread is inside a call on the op (a
/// blocking `sync_*`, or `wait()`): a torch tensor's storage can be freed
/// (`resize_`, `set_`) between an async submit and its `wait()`, but not
/// while its owner is blocked in our call. So a bounced op overlaps its
/// copies with the device's work on other blocks, as locked memory
/// overlaps nothing at all, and no copy ever lands in freed memory.
///
/// * A read: each completed piece is copied out by the worker while the gate
///   is open, and recorded while it is closed; [`Self::open`] copies the
///   recorded ones.
/// * A (blocking) write: each piece's bytes are copied in by the worker just
///   before the piece is submitted, chunk by chunk; [`Self::close`] (the
///   call is interrupted, e.g. by Ctrl-C) copies every chunk still missing,
///   so the write still writes what it was given once the call returns.
///
/// Copies run under `access` read; `close` takes it for writing, so when it
/// returns no I/O thread is inside the caller's memory and none will be.
#[derive(Debug)]
pub(crate) struct CallerGate {
    range: CopyRange,
    open: AtomicBool,
    access: RwLock<()>,
    /// A read's completed ranges (bounce offsets) not yet copied out.
    deferred: Mutex<Vec<(usize, usize)>>,
    /// A write's chunks: CHUNK_TODO, CHUNK_COPYING or CHUNK_COPIED.
    chunks: Box<[AtomicU8]>,
}

impl CallerGate {
    /// A gate for `range`; a read's starts open when the caller is in the
    /// call now (`open`). A write's is always open until [`Self::close`].
    pub fn new(range: CopyRange, open: bool) -> CallerGate {
        let chunks = match range.direction {
            Direction::Write => (0..range.len.div_ceil(GATE_CHUNK)).map(|_| AtomicU8::new(CHUNK_TODO)).collect(),
            Direction::Read => Box::default(),
        };
        let open = open || range.direction == Direction::Write;
        CallerGate { range, open: AtomicBool::new(open), access: RwLock::new(()), deferred: Mutex::default(), chunks }
    }

    /// The caller is in a call on the op from now on: a read copies out what
    /// completed meanwhile, and the workers copy the rest as it completes.
    pub fn open(&self) {
        if self.range.direction == Direction::Write {
            return; // copied in by the workers, or all of it by `close`
        }
        let ready = {
            let _exclusive = self.access.write();
            self.open.store(true, Ordering::Release);
            std::mem::take(&mut *self.deferred.lock())
        };
        // SAFETY: completed ranges, which no I/O moves any more; the caller
        // is in the call (memory valid and unused), and each completed range
        // is recorded once, so no worker copies it too.
        unsafe { self.range.copy_ranges(&ready) };
    }

    /// The caller leaves the call with the op still in flight: from now on
    /// no I/O thread touches its memory. A write first gets every byte it
    /// was given.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
        let _exclusive = self.access.write();
        let missing: Vec<(usize, usize)> = (0..self.chunks.len())
            .filter(|&c| self.chunks[c].load(Ordering::Acquire) == CHUNK_TODO)
            .map(|c| (c * GATE_CHUNK, GATE_CHUNK.min(self.range.len - c * GATE_CHUNK)))
            .collect();
        // SAFETY: no worker copies while `access` is held for writing, and
        // these chunks were never submitted (their pieces wait in `fill`).
        unsafe { self.range.copy_ranges(&missing) };
        for &(off, _) in &missing {
            self.chunks[off / GATE_CHUNK].store(CHUNK_COPIED, Ordering::Release);
        }
    }

    /// An I/O thread, before submitting bounce bytes `off..off+len` of a
    /// write: makes sure they hold the caller's bytes.
    fn fill(&self, off: usize, len: usize) {
        let _shared = self.access.read();
        for c in off / GATE_CHUNK..(off + len).div_ceil(GATE_CHUNK) {
            loop {
                match self.chunks[c].compare_exchange(CHUNK_TODO, CHUNK_COPYING, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        let claim = ChunkClaim(&self.chunks[c]);
                        let start = c * GATE_CHUNK;
                        // SAFETY: the chunk is ours (claimed), unsubmitted, and
                        // the caller is in the call (else `close` copied it).
                        unsafe { self.range.copy_from_caller(start, GATE_CHUNK.min(self.range.len - start)) };
                        claim.copied();
                        break;
                    }
                    Err(CHUNK_COPIED) => break,
                    // Another worker is copying this chunk (pieces of two slices share it).
                    Err(_) => std::thread::yield_now(),
                }
            }
        }
    }

    /// An I/O thread, after bounce bytes `off..off+len` of a read completed.
    fn completed(&self, off: usize, len: usize) {
        let _shared = self.access.read();
        if self.open.load(Ordering::Acquire) {
            // SAFETY: the range completed, and the caller is in the call.
            unsafe { self.range.copy_to_caller(off, len) };
        } else {
            self.deferred.lock().push((off, len));
        }
    }
}

/// A claimed write chunk; released unclaimed if the copy unwinds, so that
/// nobody waits forever for it.
struct ChunkClaim<'a>(&'a AtomicU8);

impl ChunkClaim<'_> {
    fn copied(self) {
        self.0.store(CHUNK_COPIED, Ordering::Release);
        std::mem::forget(self);
    }
}

impl Drop for ChunkClaim<'_> {
    fn drop(&mut self) {
        self.0.store(CHUNK_TODO, Ordering::Release);
    }
}

/// How the engines move bytes between a bounce buffer and the caller's
/// host memory, piece by piece, in step with the I/O.
#[derive(Clone, Debug)]
pub(crate) enum BounceCopy {
    /// Memory that cannot move (`Staging::memory_is_fixed`): each read piece
    /// is copied out as soon as it completes.
    Fixed(CopyRange),
    /// Memory that may move between calls (a torch tensor): see [`CallerGate`].
    Gated(Arc<CallerGate>),
}

impl BounceCopy {
    fn range(&self) -> &CopyRange {
        match self {
            BounceCopy::Fixed(r) => r,
            BounceCopy::Gated(g) => &g.range,
        }
    }

    /// Bounce offset of I/O memory at `addr`.
    fn offset_of(&self, addr: *mut u8) -> usize {
        let off = addr as usize - self.range().bounce;
        debug_assert!(off <= self.range().len);
        off
    }

    /// Before a piece is first submitted: a gated write's bytes are copied
    /// in. Returns whether this piece's bytes are copied in here (so the
    /// engine submits it at once).
    pub fn before_submit(&self, piece: &Piece) -> bool {
        match self {
            BounceCopy::Gated(g) if g.range.direction == Direction::Write && piece.len > 0 => {
                g.fill(self.offset_of(piece.addr), piece.len);
                true
            }
            _ => false,
        }
    }

    /// After a read piece completed entirely: its bytes to the caller.
    pub fn after_complete(&self, piece: &Piece) {
        if self.range().direction != Direction::Read || piece.len == 0 {
            return;
        }
        let off = self.offset_of(piece.addr);
        match self {
            // SAFETY: the piece lies inside the bounce buffer, which the op
            // owns, and the kernel is done with it; the caller's range is in
            // step with it and cannot move until the op finishes.
            BounceCopy::Fixed(r) => unsafe { r.copy_to_caller(off, piece.len) },
            BounceCopy::Gated(g) => g.completed(off, piece.len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copies_move_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..(STREAMING_MIN * 3 + 77)).map(|i| (i * 7 + i / 251) as u8).collect();
        let cases = [(0, 0, STREAMING_MIN), (1, 3, STREAMING_MIN + 5), (15, 0, 2 * STREAMING_MIN + 63), (7, 9, 100)];
        for (dst_off, src_off, len) in cases {
            let mut dst = vec![0xAAu8; len + 32];
            // SAFETY: both ranges are inside their vectors.
            unsafe { copy_streaming(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len) };
            assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len], "{dst_off} {src_off} {len}");
            assert!(dst[..dst_off].iter().chain(&dst[dst_off + len..]).all(|&b| b == 0xAA), "nothing outside");
        }
    }

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
