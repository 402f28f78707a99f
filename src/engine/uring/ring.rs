//! The ring: an io_uring instance with `capacity` slots of in-flight
//! pieces, and the primitives runs and streams are made of.

use std::sync::Arc;

use io_uring::{opcode, types, IoUring};
use crate::rt::sync::{Mutex, MutexGuard};

use crate::engine::fixed::{FixedTable, RegistrableMemory};
use crate::engine::contract::Submitter;
use crate::engine::piece::Piece;
use crate::error::{Direction, Error, Result, TransferError};

pub struct UringEngine {
    pub(super) ring: IoUring,
    pub(super) capacity: usize,
    /// In-flight pieces, indexed by `user_data`.
    pub(super) slots: Vec<Option<Piece>>,
    /// Which run of a stream each slot's piece belongs to.
    pub(super) slot_run: Vec<usize>,
    pub(super) free_slots: Vec<usize>,
    /// Set when `io_uring_enter` failed for good: the ring may hold entries
    /// the kernel never took, which must never be submitted later.
    pub(super) broken: bool,
    /// The completions of the current wait (reused between waits), how many
    /// were reaped and how many of them were processed: after a panic, the
    /// slots of reaped-but-unprocessed completions are done in the kernel.
    pub(super) reaped: Vec<(u64, i32)>,
    pub(super) reaped_count: usize,
    pub(super) processed: usize,
    /// Registered memory (a worker's ring only; see `fixed.rs`), locked by
    /// each run over registrable memory from its first request to its last
    /// completion (let go of meanwhile while a fork is pending, with nothing
    /// in flight: see `rt/fork.rs`).
    pub(super) fixed: Option<Arc<Mutex<FixedTable>>>,
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Before the ring's descriptor closes (the fields drop after this).
        if let Some(table) = &self.fixed {
            table.lock().ring_closing();
        }
    }
}

// SAFETY: the ring and the raw pointers in `slots` are only used by the
// thread that currently owns the engine; nothing is in flight between runs.
unsafe impl Send for UringEngine {}

/// Creates and tears down a small ring, checks that the kernel has the
/// READ and WRITE opcodes (5.6+; a 5.4 ring runs NOPs but fails every read
/// with EINVAL), and runs one NOP through it.
pub(crate) fn probe() -> std::result::Result<(), String> {
    let mut ring = IoUring::new(2).map_err(|e| format!("io_uring_setup: {e}"))?;
    let mut ops = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut ops)
        .map_err(|e| format!("IORING_REGISTER_PROBE (kernel older than 5.6?): {e}"))?;
    for (name, code) in [("READ", opcode::Read::CODE), ("WRITE", opcode::Write::CODE)] {
        if !ops.is_supported(code) {
            return Err(format!("the kernel's io_uring lacks IORING_OP_{name}"));
        }
    }
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
    /// A ring for `submitter`. A ring only its creating thread submits to
    /// asks for `COOP_TASKRUN` (completions are posted at the thread's next
    /// kernel entry instead of by interrupting it) and, unless it registers
    /// fixed buffers (which the fork handler must be able to unregister
    /// from another thread), `SINGLE_ISSUER` (no submission locking in the
    /// kernel), falling back to a plain ring on
    /// kernels without them (before 6.0). `DEFER_TASKRUN` is not used: a ring
    /// that failed is drained without entering it (see `abandon`), which
    /// needs the kernel to post completions by itself.
    pub fn with_submitter(queue_depth: usize, submitter: Submitter) -> Result<Self> {
        let capacity = queue_depth.clamp(1, crate::knobs::MAX_QUEUE_DEPTH);
        // A completion queue twice the submission queue (the kernel default)
        // cannot overflow: at most `capacity` pieces are ever in flight.
        let entries = capacity.next_power_of_two() as u32;
        // With fixed buffers the fork handler unregisters them from the
        // forking thread, which a SINGLE_ISSUER ring would refuse (EEXIST).
        let fixed_buffers = submitter == Submitter::OneThread && crate::knobs::settings().fixed_buffers;
        let tuned = match submitter {
            Submitter::OneThread if fixed_buffers => IoUring::builder().setup_coop_taskrun().build(entries).ok(),
            Submitter::OneThread => IoUring::builder().setup_single_issuer().setup_coop_taskrun().build(entries).ok(),
            Submitter::AnyThread => None,
        };
        let ring = match tuned {
            Some(ring) => ring,
            None => IoUring::new(entries)
                .map_err(|e| Error::Engine(format!("io_uring_setup with {capacity} entries failed: {e}")))?,
        };
        Ok(UringEngine {
            fixed: if fixed_buffers { FixedTable::for_ring(&ring) } else { None },
            ring,
            capacity,
            slots: vec![None; capacity],
            slot_run: vec![0; capacity],
            free_slots: (0..capacity).rev().collect(),
            broken: false,
            reaped: Vec::new(),
            reaped_count: 0,
            processed: 0,
        })
    }

    /// Queues the request for the piece in `slot`: a READ_FIXED /
    /// WRITE_FIXED when its bytes lie in registered (or registrable) memory.
    pub(super) fn push(
        &mut self,
        direction: Direction,
        slot: usize,
        memory: Option<&Arc<RegistrableMemory>>,
        table: Option<&mut FixedTable>,
    ) {
        let p = self.slots[slot].as_ref().expect("pushing an empty slot");
        let len = p.remaining() as u32;
        let fd = types::Fd(p.fd);
        let (addr, offset) = (p.cur_addr(), p.cur_offset());
        let fixed_index = match (memory, table) {
            (Some(memory), Some(table)) => table.index_for(&self.ring, memory, addr as usize, len as usize),
            _ => None,
        };
        let entry = match (direction, fixed_index) {
            (Direction::Read, Some(i)) => opcode::ReadFixed::new(fd, addr, len, i).offset(offset).build(),
            (Direction::Write, Some(i)) => opcode::WriteFixed::new(fd, addr, len, i).offset(offset).build(),
            (Direction::Read, None) => opcode::Read::new(fd, addr, len).offset(offset).build(),
            (Direction::Write, None) => opcode::Write::new(fd, addr, len).offset(offset).build(),
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
    pub(super) fn submit_wait(&mut self, want: usize) -> std::result::Result<(), i32> {
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

impl UringEngine {
    /// Takes the completions the kernel posted into `completions`. Counted
    /// on every wake-up (one may bring none), and each counted as processed
    /// before its work, so that after a panic `quiesce` knows which taken
    /// slots the kernel is already done with.
    pub(super) fn reap(&mut self, completions: &mut Vec<(u64, i32)>) {
        completions.clear();
        completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.reaped_count = completions.len();
        self.processed = 0;
    }

    /// Pieces the kernel may hold: taken slots.
    pub(super) fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// After `io_uring_enter` failed for good: waits, without entering the
    /// ring again, until every request the kernel did take has completed
    /// (it may still be moving bytes in the caller's buffers), then marks
    /// the engine broken so the entries it never took are never submitted.
    pub(super) fn abandon(&mut self, in_flight: usize, error: TransferError) -> TransferError {
        self.drain_without_entering(in_flight, &format!("io_uring failed ({error})"));
        error
    }

    /// Marks the ring broken and waits, without entering it, until the
    /// requests the kernel took (of `in_flight` pieces, less those never
    /// submitted) have completed. `why` goes in the one line logged when
    /// any are outstanding.
    pub(super) fn drain_without_entering(&mut self, in_flight: usize, why: &str) {
        self.broken = true;
        let mut outstanding = in_flight.saturating_sub(self.ring.submission().len());
        let mut logged = false;
        while outstanding > 0 {
            let reaped = self.ring.completion().count();
            outstanding = outstanding.saturating_sub(reaped);
            if outstanding > 0 {
                if !logged {
                    crate::rt::log::error(&format!("{why}; waiting for {outstanding} requests the kernel already took"));
                    logged = true;
                }
                // A syscall also runs the task work that posts completions.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        // The kernel holds nothing now: a later `quiesce` (a panic after
        // this) must not wait for completions that were just reaped.
        self.slots.iter_mut().for_each(|slot| *slot = None);
        self.free_slots = (0..self.capacity).rev().collect();
        self.reaped_count = 0;
        self.processed = 0;
    }
}

/// Takes a ring's fixed-buffer table for a run (a new run of the table):
/// when a fork is pending, once the fork is done (see `rt/fork.rs`).
pub(super) fn take_table(table: &Mutex<FixedTable>) -> MutexGuard<'_, FixedTable> {
    crate::rt::fork::wait_while_forking();
    let mut guard = table.lock();
    guard.start_run();
    guard
}

/// What a completion leaves of its piece.
pub(super) enum Settled {
    /// All its bytes moved: the slot is free.
    Done,
    /// Short or interrupted: the remainder goes again in the same slot.
    Again,
    /// The run is already failing: the remainder is dropped.
    Abandoned,
    /// The piece failed: the run fails with this, its first error.
    Failed(TransferError),
}

/// Applies one completion result (`res`, as the kernel returns it) to its
/// piece, in a run that is `failing` already or not.
pub(super) fn settle(piece: &mut Piece, direction: Direction, res: i32, failing: bool) -> Settled {
    match piece.complete(direction, res as i64) {
        Ok(true) => Settled::Done,
        Ok(false) if !failing => Settled::Again,
        Ok(false) => Settled::Abandoned,
        Err(e) => Settled::Failed(e),
    }
}
