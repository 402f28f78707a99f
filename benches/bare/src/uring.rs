//! The io_uring engine: one ring per worker with its slice of the buffer
//! registered (fixed buffers, so the kernel pins it once, not per request)
//! and the file registered (no fd lookup per request), `queue_depth`
//! blocks in flight, refilled as they complete, one `io_uring_enter` per
//! refill. The ring is single-issuer with deferred task work where the
//! kernel has them (6.1+), else cooperative task work, else plain.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

use crate::geometry::{blocks, Slice};
use crate::{Direction, Mover};

/// A registered buffer may be at most 1 GiB: a slice is registered in
/// pieces of this many bytes (a multiple of the block size).
const MAX_REGISTERED: usize = 1 << 30;

pub struct Uring {
    ring: IoUring,
    base: *mut u8,
    slice: Slice,
    block_size: usize,
    queue_depth: usize,
    piece: usize,
    direction: Direction,
    /// Length of each block by index, to check every completion.
    lens: Vec<usize>,
}

// SAFETY: `base` points into the run's buffer, which outlives every worker;
// each worker touches only its own slice, and its ring is its own.
unsafe impl Send for Uring {}

/// The ring set-up that worked: "single_issuer+defer_taskrun",
/// "coop_taskrun" or "plain".
pub fn setup(entries: u32) -> io::Result<(IoUring, &'static str)> {
    if let Ok(r) = IoUring::builder().setup_single_issuer().setup_defer_taskrun().build(entries) {
        return Ok((r, "single_issuer+defer_taskrun"));
    }
    if let Ok(r) = IoUring::builder().setup_coop_taskrun().build(entries) {
        return Ok((r, "coop_taskrun"));
    }
    Ok((IoUring::new(entries)?, "plain"))
}

impl Uring {
    /// Made on the worker's own thread (a single-issuer ring belongs to the
    /// thread that first submits on it).
    pub fn new(
        fd: RawFd,
        base: *mut u8,
        slice: Slice,
        block_size: usize,
        queue_depth: usize,
        direction: Direction,
    ) -> io::Result<(Uring, &'static str)> {
        let (ring, flags) = setup(queue_depth.max(1) as u32)?;
        let piece = (MAX_REGISTERED / block_size).max(1) * block_size;
        let iovecs: Vec<libc::iovec> = (0..slice.len)
            .step_by(piece)
            .map(|o| libc::iovec {
                // SAFETY: inside this worker's slice of the buffer.
                iov_base: unsafe { base.add(slice.start + o) }.cast(),
                iov_len: piece.min(slice.len - o),
            })
            .collect();
        if !iovecs.is_empty() {
            // SAFETY: the memory stays mapped until the ring is dropped (the
            // buffer outlives every worker).
            unsafe { ring.submitter().register_buffers(&iovecs)? };
        }
        ring.submitter().register_files(&[fd])?;
        let lens = blocks(slice.len, block_size).map(|(_, l)| l).collect();
        Ok((Uring { ring, base, slice, block_size, queue_depth: queue_depth.max(1), piece, direction, lens }, flags))
    }

    fn push(&mut self, index: usize, file_offset: u64) {
        let o = index * self.block_size;
        let len = self.lens[index];
        // SAFETY: inside this worker's slice.
        let p = unsafe { self.base.add(self.slice.start + o) };
        let buf_index = (o / self.piece) as u16;
        let off = file_offset + (self.slice.start + o) as u64;
        let fixed = types::Fixed(0);
        let e = match self.direction {
            Direction::Read => opcode::ReadFixed::new(fixed, p, len as u32, buf_index).offset(off).build(),
            Direction::Write => opcode::WriteFixed::new(fixed, p, len as u32, buf_index).offset(off).build(),
        };
        // SAFETY: the buffer stays valid until the completion is reaped
        // (op() reaps every one before it returns); in-flight requests never
        // exceed the ring's queue_depth entries, so the push has room.
        unsafe { self.ring.submission().push(&e.user_data(index as u64)) }.expect("submission queue full");
    }
}

impl Mover for Uring {
    fn op(&mut self, file_offset: u64) -> io::Result<()> {
        let n = self.lens.len();
        let (mut next, mut done, mut in_flight) = (0usize, 0usize, 0usize);
        let mut failed: Option<io::Error> = None;
        while done < n {
            while failed.is_none() && in_flight < self.queue_depth && next < n {
                self.push(next, file_offset);
                next += 1;
                in_flight += 1;
            }
            self.ring.submit_and_wait(1)?;
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                let r = cqe.result();
                if r < 0 {
                    failed.get_or_insert(io::Error::from_raw_os_error(-r));
                } else if r as usize != self.lens[i] {
                    failed.get_or_insert(io::Error::other(format!("short transfer in block {i}: {r} of {}", self.lens[i])));
                }
                done += 1;
                in_flight -= 1;
            }
            if failed.is_some() && in_flight == 0 {
                break;
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
