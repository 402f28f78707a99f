//! The io_uring engine: one ring per worker thread, `queue_depth` slots.
//!
//! Knobs keep DeepSpeed's meaning:
//! * `overlap_events = false`: push a batch of up to `queue_depth` pieces,
//!   wait until all of them (and any resubmitted remainders) complete, repeat;
//! * `overlap_events = true`: keep the ring topped up, reaping at least one
//!   completion at a time and refilling the freed slots at once;
//! * `single_submit = true`: one `io_uring_enter` submit per piece; else one
//!   per batch (or per refill).
//!
//! Every completion is checked. A short transfer resubmits its remainder,
//! EINTR/EAGAIN resubmit the same piece, and any other result stops new
//! submissions; the engine still drains what is in flight (the kernel may be
//! writing into those buffers) before it reports the first error.

use io_uring::{opcode, types, IoUring};

use super::{pieces, Engine, EngineKind, Knobs, Piece, Segment};
use crate::error::{Direction, Error, Result, TransferError};

pub struct UringEngine {
    ring: IoUring,
    capacity: usize,
    /// In-flight pieces, indexed by `user_data`.
    slots: Vec<Option<Piece>>,
    free_slots: Vec<usize>,
}

// SAFETY: the ring and the raw pointers in `slots` are only used by the
// thread that currently owns the engine; nothing is in flight between runs.
unsafe impl Send for UringEngine {}

/// Creates and tears down a small ring, and runs one NOP through it.
pub(crate) fn probe() -> std::result::Result<(), String> {
    let mut ring = IoUring::new(2).map_err(|e| format!("io_uring_setup: {e}"))?;
    let nop = opcode::Nop::new().build().user_data(7);
    // SAFETY: a NOP carries no memory.
    unsafe { ring.submission().push(&nop).map_err(|_| "submission queue full".to_string())? };
    ring.submit_and_wait(1).map_err(|e| format!("io_uring_enter: {e}"))?;
    let completion = ring.completion().next().map(|c| (c.user_data(), c.result()));
    match completion {
        Some((7, res)) if res >= 0 => Ok(()),
        Some((_, res)) => Err(format!("NOP completed with {res}")),
        None => Err("NOP never completed".to_string()),
    }
}

impl UringEngine {
    pub fn new(queue_depth: usize) -> Result<Self> {
        let capacity = queue_depth.clamp(1, 32768);
        // A completion queue twice the submission queue (the kernel default)
        // cannot overflow: at most `capacity` pieces are ever in flight.
        let ring = IoUring::new(capacity.next_power_of_two() as u32)
            .map_err(|e| Error::Engine(format!("io_uring_setup with {capacity} entries failed: {e}")))?;
        Ok(UringEngine {
            ring,
            capacity,
            slots: vec![None; capacity],
            free_slots: (0..capacity).rev().collect(),
        })
    }

    fn push(&mut self, direction: Direction, slot: usize) {
        let p = self.slots[slot].as_ref().expect("pushing an empty slot");
        let len = p.remaining() as u32;
        let fd = types::Fd(p.fd);
        let entry = match direction {
            Direction::Read => opcode::Read::new(fd, p.cur_addr(), len).offset(p.cur_offset()).build(),
            Direction::Write => opcode::Write::new(fd, p.cur_addr(), len).offset(p.cur_offset()).build(),
        }
        .user_data(slot as u64);
        // SAFETY: the buffer belongs to a live piece that stays in `slots`
        // until its completion is reaped. The SQ has room for every slot.
        unsafe {
            self.ring.submission().push(&entry).expect("io_uring submission queue overflow");
        }
    }

    /// Submits pushed entries, waiting for `want` completions. Retries EINTR
    /// and EBUSY (the latter cannot happen with our CQ sizing, but is harmless).
    fn submit_wait(&mut self, want: usize) -> std::result::Result<(), i32> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => continue,
                    Some(errno) => return Err(errno),
                    None => return Err(libc::EIO),
                },
            }
        }
    }
}

impl Engine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Uring
    }

    fn run(&mut self, direction: Direction, segments: &[Segment], knobs: &Knobs) -> std::result::Result<(), TransferError> {
        // Pieces longer than u32 cannot be one SQE; block sizes are ints anyway.
        let block = knobs.block_size.clamp(1, 1 << 30);
        let depth = knobs.queue_depth.clamp(1, self.capacity);
        let mut todo = pieces(segments, block);
        let mut in_flight = 0usize;
        let mut first_error: Option<TransferError> = None;
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(depth);

        loop {
            // Fill: in batch mode only when the previous batch is fully done.
            let may_fill = first_error.is_none() && (knobs.overlap_events || in_flight == 0);
            if may_fill {
                while in_flight < depth {
                    let Some(piece) = todo.next() else { break };
                    let slot = self.free_slots.pop().expect("free slot accounting");
                    self.slots[slot] = Some(piece);
                    self.push(direction, slot);
                    in_flight += 1;
                    if knobs.single_submit {
                        if let Err(errno) = self.submit_wait(0) {
                            // The kernel refused the submit itself: nothing of
                            // this entry is in flight, but earlier ones may be.
                            let p = self.slots[slot].take().expect("slot just filled");
                            self.free_slots.push(slot);
                            in_flight -= 1;
                            first_error.get_or_insert(p.error(direction, errno, Some("io_uring_enter failed".into())));
                            break;
                        }
                    }
                }
            }
            if in_flight == 0 {
                break;
            }
            // Wait: for one completion when overlapping, else the whole batch.
            let want = if knobs.overlap_events { 1 } else { in_flight };
            if let Err(errno) = self.submit_wait(want) {
                // Cannot wait on the ring: the kernel still owns the buffers,
                // so keep trying to reap with the plainest wait there is.
                first_error.get_or_insert(TransferError {
                    direction,
                    path: None,
                    fd: segments.first().map(|s| s.fd).unwrap_or(-1),
                    file_offset: segments.first().map(|s| s.file_offset).unwrap_or(0),
                    len: 0,
                    errno,
                    detail: Some("io_uring_enter wait failed".into()),
                });
                while self.ring.submit_and_wait(1).is_err() {
                    std::thread::yield_now();
                }
            }
            completions.clear();
            completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(user_data, res) in &completions {
                let slot = user_data as usize;
                let mut piece = self.slots[slot].take().expect("completion for an empty slot");
                match piece.complete(direction, res as i64) {
                    Ok(true) => {
                        self.free_slots.push(slot);
                        in_flight -= 1;
                    }
                    Ok(false) if first_error.is_none() => {
                        // Short or interrupted: send the remainder again.
                        self.slots[slot] = Some(piece);
                        self.push(direction, slot);
                        if knobs.single_submit {
                            if let Err(errno) = self.submit_wait(0) {
                                let p = self.slots[slot].take().expect("slot just filled");
                                self.free_slots.push(slot);
                                in_flight -= 1;
                                first_error.get_or_insert(p.error(direction, errno, Some("io_uring_enter failed".into())));
                            }
                        }
                    }
                    Ok(false) => {
                        // Already failing: abandon the remainder, report the first error.
                        self.free_slots.push(slot);
                        in_flight -= 1;
                    }
                    Err(e) => {
                        self.free_slots.push(slot);
                        in_flight -= 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
