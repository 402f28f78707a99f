//! The threads engine: each worker moves its slice with one `pread` or
//! `pwrite` per block, one at a time (queue depth does not apply: a thread
//! has one call in flight).

use std::io;
use std::os::fd::RawFd;

use crate::geometry::{blocks, Slice};
use crate::{Direction, Mover};

pub struct Psync {
    fd: RawFd,
    base: *mut u8,
    slice: Slice,
    block_size: usize,
    direction: Direction,
}

// SAFETY: `base` points into the run's buffer, which outlives every worker;
// each worker touches only its own slice.
unsafe impl Send for Psync {}

impl Psync {
    pub fn new(fd: RawFd, base: *mut u8, slice: Slice, block_size: usize, direction: Direction) -> Psync {
        Psync { fd, base, slice, block_size, direction }
    }
}

impl Mover for Psync {
    fn op(&mut self, file_offset: u64) -> io::Result<()> {
        for (o, len) in blocks(self.slice.len, self.block_size) {
            // SAFETY: inside this worker's slice of the buffer.
            let p = unsafe { self.base.add(self.slice.start + o) };
            let off = (file_offset + (self.slice.start + o) as u64) as libc::off_t;
            // SAFETY: `p..p + len` is in the buffer, which outlives the call.
            let r = unsafe {
                match self.direction {
                    Direction::Read => libc::pread(self.fd, p.cast(), len, off),
                    Direction::Write => libc::pwrite(self.fd, p.cast(), len, off),
                }
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            if r as usize != len {
                return Err(io::Error::other(format!("short transfer at {off}: {r} of {len} bytes")));
            }
        }
        Ok(())
    }
}
