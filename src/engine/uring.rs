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
//! A worker's ring also runs streams (`Engine::run_stream`): runs of
//! several queued ops in flight at once, each checked and reported on its
//! own, so that the ring does not drain between back-to-back ops.
//!
//! Every completion is checked. A short transfer resubmits its remainder,
//! EINTR/EAGAIN resubmit the same piece, and any other result stops new
//! submissions; the engine still drains what is in flight (the kernel may be
//! writing into those buffers) before it reports the first error.

use std::sync::Arc;

use io_uring::{opcode, types, IoUring};
use crate::sync::{Mutex, MutexGuard};

use super::fixed::{FixedTable, RegistrableMemory};
use super::{pieces, Engine, EngineKind, Knobs, Piece, PieceCursor, Segment, StreamSource, Submitter};
use crate::error::{Direction, Error, Result, TransferError};

pub struct UringEngine {
    ring: IoUring,
    capacity: usize,
    /// In-flight pieces, indexed by `user_data`.
    slots: Vec<Option<Piece>>,
    /// Which run of a stream each slot's piece belongs to.
    slot_run: Vec<usize>,
    free_slots: Vec<usize>,
    /// Set when `io_uring_enter` failed for good: the ring may hold entries
    /// the kernel never took, which must never be submitted later.
    broken: bool,
    /// The completions of the current wait (reused between waits), how many
    /// were reaped and how many of them were processed: after a panic, the
    /// slots of reaped-but-unprocessed completions are done in the kernel.
    reaped: Vec<(u64, i32)>,
    reaped_count: usize,
    processed: usize,
    /// Registered memory (a worker's ring only; see `fixed.rs`), locked by
    /// each run over registrable memory from its first request to its last
    /// completion (let go of meanwhile while a fork is pending, with nothing
    /// in flight: see `fork.rs`).
    fixed: Option<Arc<Mutex<FixedTable>>>,
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
    fn push(
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

    fn is_broken(&self) -> bool {
        self.broken
    }

    fn run_stream(&mut self, source: &mut dyn StreamSource) {
        self.stream(source);
    }

    fn streams_runs(&self) -> bool {
        true
    }

    fn release_retired(&mut self) {
        if let Some(table) = &self.fixed {
            table.lock().release_retired(&self.ring);
        }
    }

    fn quiesce(&mut self) {
        let done_in_kernel = self.reaped_count.saturating_sub(self.processed);
        let in_flight = self.occupied().saturating_sub(done_in_kernel);
        self.drain_without_entering(in_flight, "an I/O run panicked");
    }

    fn run_with(
        &mut self,
        direction: Direction,
        segments: &[Segment],
        knobs: &Knobs,
        memory: Option<&Arc<RegistrableMemory>>,
    ) -> std::result::Result<(), TransferError> {
        let first_fd = segments.first().map(|s| s.fd).unwrap_or(-1);
        let first_offset = segments.first().map(|s| s.file_offset).unwrap_or(0);
        let ring_error = |errno: i32| TransferError {
            direction,
            path: None,
            fd: first_fd,
            file_offset: first_offset,
            len: segments.iter().map(|s| s.len).sum(),
            errno,
            detail: Some("io_uring_enter failed; the ring is abandoned".into()),
        };
        if self.broken {
            return Err(ring_error(libc::EIO));
        }
        // Only a run over registrable memory takes the table (a fork waits
        // for such runs only).
        let fixed = memory.and_then(|_| self.fixed.clone());
        let mut table = fixed.as_deref().map(take_table);
        // Pieces longer than u32 cannot be one SQE; block sizes are ints anyway.
        let block = knobs.block_size.clamp(1, 1 << 30);
        let depth = knobs.queue_depth.clamp(1, self.capacity);
        let mut todo = pieces(segments, block).peekable();
        let mut in_flight = 0usize;
        let mut first_error: Option<TransferError> = None;
        let mut completions = std::mem::take(&mut self.reaped);

        loop {
            // A fork is waiting for the table (see `fork.rs`): send nothing
            // more and, once what is in flight has completed, let the table
            // go until the fork is done, then go on (registering again).
            let yielding = table.is_some()
                && crate::fork::fork_pending()
                && first_error.is_none()
                && todo.peek().is_some();
            if yielding && in_flight == 0 {
                drop(table.take());
                table = fixed.as_deref().map(take_table);
                continue;
            }
            // Fill: in batch mode only when the previous batch is fully done.
            let may_fill = !yielding && first_error.is_none() && (knobs.overlap_events || in_flight == 0);
            if may_fill {
                while in_flight < depth {
                    let Some(piece) = todo.next() else { break };
                    let slot = self.free_slots.pop().expect("free slot accounting");
                    self.slots[slot] = Some(piece);
                    self.push(direction, slot, memory, table.as_deref_mut());
                    in_flight += 1;
                    if knobs.single_submit {
                        if let Err(errno) = self.submit_wait(0) {
                            return Err(self.abandon(in_flight, ring_error(errno)));
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
                return Err(self.abandon(in_flight, first_error.unwrap_or(ring_error(errno))));
            }
            self.reap(&mut completions);
            for &(user_data, res) in &completions {
                // Counted before the work (see `reap`).
                self.processed += 1;
                let slot = user_data as usize;
                let mut piece = self.slots[slot].take().expect("completion for an empty slot");
                match settle(&mut piece, direction, res, first_error.is_some()) {
                    Settled::Again => {
                        self.slots[slot] = Some(piece);
                        self.push(direction, slot, memory, table.as_deref_mut());
                        if knobs.single_submit {
                            if let Err(errno) = self.submit_wait(0) {
                                return Err(self.abandon(in_flight, ring_error(errno)));
                            }
                        }
                    }
                    settled => {
                        self.free_slots.push(slot);
                        in_flight -= 1;
                        if let Settled::Failed(e) = settled {
                            first_error.get_or_insert(e);
                        }
                        #[cfg(test)]
                        crate::engine::fault::after_completion();
                    }
                }
            }
        }
        self.reaped = completions;
        self.reaped_count = 0;
        self.processed = 0;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Takes a ring's fixed-buffer table for a run (a new run of the table):
/// when a fork is pending, once the fork is done (see `fork.rs`).
fn take_table(table: &Mutex<FixedTable>) -> MutexGuard<'_, FixedTable> {
    crate::fork::wait_while_forking();
    let mut guard = table.lock();
    guard.start_run();
    guard
}

/// What a completion leaves of its piece.
enum Settled {
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
fn settle(piece: &mut Piece, direction: Direction, res: i32, failing: bool) -> Settled {
    match piece.complete(direction, res as i64) {
        Ok(true) => Settled::Done,
        Ok(false) if !failing => Settled::Again,
        Ok(false) => Settled::Abandoned,
        Err(e) => Settled::Failed(e),
    }
}

/// A run of a stream that has started: its requests left to send, how
/// many are in flight, and its first error.
struct StreamedRun {
    n: usize,
    direction: Direction,
    cursor: PieceCursor,
    memory: Option<Arc<RegistrableMemory>>,
    in_flight: usize,
    first_error: Option<TransferError>,
}

impl StreamedRun {
    fn sends_more(&self) -> bool {
        self.first_error.is_none() && self.cursor.has_more()
    }
    fn is_done(&self) -> bool {
        self.in_flight == 0 && !self.sends_more()
    }
    fn ring_error(&self, errno: i32) -> TransferError {
        stream_ring_error(self.direction, self.cursor.segments(), errno)
    }
}

/// A run's error when its ring failed: names its first segment, and all its bytes.
fn stream_ring_error(direction: Direction, segments: &[Segment], errno: i32) -> TransferError {
    TransferError {
        direction,
        path: None,
        fd: segments.first().map(|s| s.fd).unwrap_or(-1),
        file_offset: segments.first().map(|s| s.file_offset).unwrap_or(0),
        len: segments.iter().map(|s| s.len).sum(),
        errno,
        detail: Some("io_uring_enter failed; the ring is abandoned".into()),
    }
}

impl UringEngine {
    /// The stream (see `Engine::run_stream`): requests of the oldest started
    /// run go first; when no started run has any left and a slot is free,
    /// the source is asked for the next run, so back-to-back ops keep the
    /// ring full instead of letting it drain between them. Each run's
    /// completions are checked as in `run_with`, and a failing run stops
    /// only its own requests.
    fn stream(&mut self, source: &mut dyn StreamSource) {
        if self.broken {
            let mut n = 0;
            while let Some(run) = source.next_run() {
                source.run_done(n, Err(stream_ring_error(run.direction, &run.segments, libc::EIO)));
                n += 1;
            }
            return;
        }
        let mut active: Vec<StreamedRun> = Vec::new();
        let mut next_n = 0usize;
        let mut depth = self.capacity;
        let mut in_flight = 0usize;
        // The fixed-buffer table is taken when the first run over
        // registrable memory starts, and held to the end of the stream.
        let fixed = self.fixed.clone();
        let mut table: Option<MutexGuard<'_, FixedTable>> = None;
        let mut completions = std::mem::take(&mut self.reaped);
        loop {
            // A fork is waiting for the table: as in `run_with`.
            let yielding =
                table.is_some() && crate::fork::fork_pending() && active.iter().any(StreamedRun::sends_more);
            if yielding && in_flight == 0 {
                drop(table.take());
                table = Some(take_table(fixed.as_deref().expect("a stream holding a table has one")));
                continue;
            }
            // Fill the free slots.
            while !yielding && in_flight < depth {
                let Some(index) = active.iter().position(StreamedRun::sends_more) else {
                    // Asked again after every wait: an op queued while the
                    // ring was busy starts in the slots its predecessors free.
                    match source.next_run() {
                        Some(run) => {
                            if active.is_empty() && in_flight == 0 {
                                depth = run.knobs.queue_depth.clamp(1, self.capacity);
                            }
                            let memory = run.memory.filter(|_| fixed.is_some());
                            if memory.is_some() && table.is_none() {
                                // One table run for the whole stream: a slot
                                // that any started run's requests name (some
                                // perhaps pushed but not yet submitted) is
                                // never given to other memory until it ends.
                                table = Some(take_table(fixed.as_deref().expect("fixed table")));
                            }
                            // Pieces longer than u32 cannot be one SQE.
                            let block = run.knobs.block_size.clamp(1, 1 << 30);
                            active.push(StreamedRun {
                                n: next_n,
                                direction: run.direction,
                                cursor: PieceCursor::new(run.segments, block),
                                memory,
                                in_flight: 0,
                                first_error: None,
                            });
                            next_n += 1;
                            continue;
                        }
                        None => break,
                    }
                };
                let run = &mut active[index];
                let piece = run.cursor.next().expect("a run that sends more has a piece");
                let slot = self.free_slots.pop().expect("free slot accounting");
                self.slots[slot] = Some(piece);
                self.slot_run[slot] = run.n;
                run.in_flight += 1;
                in_flight += 1;
                self.push(run.direction, slot, run.memory.as_ref(), table.as_deref_mut());
            }
            // Report the runs that are over (a run with no bytes is over at once).
            let mut i = 0;
            while i < active.len() {
                if active[i].is_done() {
                    let run = active.remove(i);
                    source.run_done(run.n, run.first_error.map_or(Ok(()), Err));
                } else {
                    i += 1;
                }
            }
            if in_flight == 0 {
                // Nothing started is left, and the source just said it has
                // no more.
                break;
            }
            if let Err(errno) = self.submit_wait(1) {
                let first = active.first().map(|r| r.ring_error(errno));
                if let Some(e) = first {
                    self.abandon(in_flight, e);
                } else {
                    self.drain_without_entering(in_flight, "io_uring failed");
                }
                for run in active.drain(..) {
                    let e = run.first_error.clone().unwrap_or_else(|| run.ring_error(errno));
                    source.run_done(run.n, Err(e));
                }
                break;
            }
            self.reap(&mut completions);
            for &(user_data, res) in &completions {
                // Counted before the work (see `reap`).
                self.processed += 1;
                let slot = user_data as usize;
                let mut piece = self.slots[slot].take().expect("completion for an empty slot");
                let owner = self.slot_run[slot];
                let index = active.iter().position(|r| r.n == owner).expect("completion of a started run");
                let run = &mut active[index];
                match settle(&mut piece, run.direction, res, run.first_error.is_some()) {
                    Settled::Again => {
                        self.slots[slot] = Some(piece);
                        self.push(run.direction, slot, run.memory.as_ref(), table.as_deref_mut());
                    }
                    settled => {
                        self.free_slots.push(slot);
                        run.in_flight -= 1;
                        in_flight -= 1;
                        if let Settled::Failed(e) = settled {
                            run.first_error.get_or_insert(e);
                        }
                    }
                }
            }
        }
        self.reaped = completions;
        self.reaped_count = 0;
        self.processed = 0;
    }

    /// Takes the completions the kernel posted into `completions`. Counted
    /// on every wake-up (one may bring none), and each counted as processed
    /// before its work, so that after a panic `quiesce` knows which taken
    /// slots the kernel is already done with.
    fn reap(&mut self, completions: &mut Vec<(u64, i32)>) {
        completions.clear();
        completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        self.reaped_count = completions.len();
        self.processed = 0;
    }

    /// Pieces the kernel may hold: taken slots.
    fn occupied(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// After `io_uring_enter` failed for good: waits, without entering the
    /// ring again, until every request the kernel did take has completed
    /// (it may still be moving bytes in the caller's buffers), then marks
    /// the engine broken so the entries it never took are never submitted.
    fn abandon(&mut self, in_flight: usize, error: TransferError) -> TransferError {
        self.drain_without_entering(in_flight, &format!("io_uring failed ({error})"));
        error
    }

    /// Marks the ring broken and waits, without entering it, until the
    /// requests the kernel took (of `in_flight` pieces, less those never
    /// submitted) have completed. `why` goes in the one line logged when
    /// any are outstanding.
    fn drain_without_entering(&mut self, in_flight: usize, why: &str) {
        self.broken = true;
        let mut outstanding = in_flight.saturating_sub(self.ring.submission().len());
        let mut logged = false;
        while outstanding > 0 {
            let reaped = self.ring.completion().count();
            outstanding = outstanding.saturating_sub(reaped);
            if outstanding > 0 {
                if !logged {
                    crate::log::error(&format!("{why}; waiting for {outstanding} requests the kernel already took"));
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
