//! What engines move: segments (contiguous fd/offset/memory ranges), the
//! pieces they are cut into, and moving one piece with pread/pwrite.

use std::os::fd::RawFd;

use crate::error::{Direction, TransferError};
use crate::knobs;

/// One contiguous range to move. The memory must stay valid, and must not be
/// touched by anyone else, until the engine's `run` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub fd: RawFd,
    pub file_offset: u64,
    pub addr: *mut u8,
    pub len: usize,
}

// SAFETY: a Segment is a description; the op that owns the memory keeps it
// alive and unaliased while engines on other threads move its bytes.
unsafe impl Send for Segment {}
// SAFETY: shared references only read the description; as for Send.
unsafe impl Sync for Segment {}

/// A piece of a segment still to be moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub fd: RawFd,
    pub file_offset: u64,
    pub addr: *mut u8,
    pub len: usize,
    /// Bytes of this piece already moved (by short transfers).
    pub done: usize,
    /// EAGAIN answers in a row (since the last progress).
    pub eagain: u32,
    /// EINTR answers in a row (since the last progress).
    pub eintr: u32,
}

/// The pause before resubmitting after the `n`-th EAGAIN in a row: doubling
/// from 4 µs, capped at 4 ms (64 retries wait about 0.2 s in all).
fn eagain_backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_micros(4u64 << n.saturating_sub(1).min(10))
}

// SAFETY: as for Segment: the owning op keeps the memory alive and unaliased.
unsafe impl Send for Piece {}
// SAFETY: shared references only read the description; as for Send.
unsafe impl Sync for Piece {}

impl Piece {
    /// The piece of `segment` that starts `offset` bytes into it: at most
    /// `block` bytes (`offset` < the segment's length).
    fn of(segment: &Segment, offset: usize, block: usize) -> Piece {
        debug_assert!(offset < segment.len);
        Piece {
            fd: segment.fd,
            file_offset: segment.file_offset + offset as u64,
            // SAFETY: offset < segment.len, inside the segment.
            addr: unsafe { segment.addr.add(offset) },
            len: block.min(segment.len - offset),
            done: 0,
            eagain: 0,
            eintr: 0,
        }
    }

    pub fn remaining(&self) -> usize {
        self.len - self.done
    }
    pub fn cur_offset(&self) -> u64 {
        self.file_offset + self.done as u64
    }
    pub fn cur_addr(&self) -> *mut u8 {
        // SAFETY: done <= len, so this stays inside the segment.
        unsafe { self.addr.add(self.done) }
    }
    pub fn error(&self, direction: Direction, errno: i32, detail: Option<String>) -> TransferError {
        TransferError {
            direction,
            path: None,
            fd: self.fd,
            file_offset: self.cur_offset(),
            len: self.remaining(),
            errno,
            detail,
        }
    }

    /// Applies one completion result (`res` as the kernel returns it: bytes
    /// moved, or a negative errno). Returns `Ok(true)` when the piece is done,
    /// `Ok(false)` when the remainder must be submitted again.
    pub fn complete(&mut self, direction: Direction, res: i64) -> std::result::Result<bool, TransferError> {
        if res < 0 {
            let errno = (-res) as i32;
            if errno == libc::EAGAIN {
                // The device or file system asks to try again later: back
                // off, and give up (naming EAGAIN) if it never gets better.
                if self.eagain >= knobs::MAX_EAGAIN_RETRIES {
                    let detail = format!("still EAGAIN after {} retries with backoff", self.eagain);
                    return Err(self.error(direction, errno, Some(detail)));
                }
                self.eagain += 1;
                std::thread::sleep(eagain_backoff(self.eagain));
                return Ok(false);
            }
            if errno == libc::EINTR {
                // A signal interrupted the transfer: resubmit at once. Only a
                // signal storm with no byte moved in between could repeat
                // this, so the bound is high and stops a livelock only.
                if self.eintr >= knobs::MAX_EINTR_RETRIES {
                    let detail = format!("interrupted {} times in a row without progress", self.eintr);
                    return Err(self.error(direction, errno, Some(detail)));
                }
                self.eintr += 1;
                return Ok(false);
            }
            return Err(self.error(direction, errno, None));
        }
        if res == 0 {
            let (errno, what) = match direction {
                Direction::Read => (libc::ENODATA, "unexpected end of file"),
                Direction::Write => (libc::EIO, "the device accepted no bytes"),
            };
            let detail = format!("{what} after {} of {} bytes of this block", self.done, self.len);
            return Err(self.error(direction, errno, Some(detail)));
        }
        let res = res as usize;
        if res > self.remaining() {
            return Err(self.error(direction, libc::EIO, Some(format!("kernel reported {res} bytes, more than asked"))));
        }
        self.done += res;
        self.eagain = 0;
        self.eintr = 0;
        Ok(self.done == self.len)
    }
}

/// Cuts segments into block-sized pieces, in order.
pub(crate) fn pieces(segments: &[Segment], block_size: usize) -> impl Iterator<Item = Piece> + '_ {
    let block = block_size.max(1);
    segments.iter().flat_map(move |s| {
        let n = s.len.div_ceil(block);
        (0..n).map(move |i| Piece::of(s, i * block, block))
    })
}

/// The pieces of a run, cut as they are sent.
pub(crate) struct PieceCursor {
    segments: Vec<Segment>,
    block: usize,
    segment: usize,
    offset: usize,
}

impl PieceCursor {
    pub fn new(segments: Vec<Segment>, block_size: usize) -> Self {
        PieceCursor { segments, block: block_size.max(1), segment: 0, offset: 0 }
    }
    pub fn has_more(&self) -> bool {
        let sent = |i: usize| if i == self.segment { self.offset } else { 0 };
        self.segments.iter().enumerate().skip(self.segment).any(|(i, s)| s.len > sent(i))
    }
    /// Every segment of the run (for naming it in an error).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
}

impl Iterator for PieceCursor {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        while let Some(s) = self.segments.get(self.segment) {
            if self.offset >= s.len {
                self.segment += 1;
                self.offset = 0;
                continue;
            }
            let piece = Piece::of(s, self.offset, self.block);
            self.offset += piece.len;
            return Some(piece);
        }
        None
    }
}

/// Moves `len` bytes at `file_offset` synchronously with plain
/// pread/pwrite, retrying EINTR/EAGAIN and short transfers. Used for the
/// small unaligned edges and by the psync engine.
pub(crate) fn move_piece_blocking(direction: Direction, piece: &mut Piece) -> std::result::Result<(), TransferError> {
    while piece.remaining() > 0 {
        // SAFETY: the piece describes memory its owner keeps valid.
        let res = unsafe {
            match direction {
                Direction::Read => libc::pread(
                    piece.fd,
                    piece.cur_addr() as *mut libc::c_void,
                    piece.remaining(),
                    piece.cur_offset() as libc::off_t,
                ),
                Direction::Write => libc::pwrite(
                    piece.fd,
                    piece.cur_addr() as *const libc::c_void,
                    piece.remaining(),
                    piece.cur_offset() as libc::off_t,
                ),
            }
        };
        let res = if res < 0 { -(crate::error::last_errno() as i64) } else { res as i64 };
        piece.complete(direction, res)?;
    }
    Ok(())
}
