//! Streams (`Engine::run_stream`): several queued ops' runs in flight in
//! one ring at once, each checked and reported on its own.

use std::sync::Arc;

use crate::engine::fixed::{FixedTable, RegistrableMemory};
use crate::rt::sync::MutexGuard;
use crate::engine::contract::StreamSource;
use crate::engine::piece::{PieceCursor, Segment};
use crate::error::{Direction, TransferError};

use super::ring::{settle, take_table, Settled, UringEngine};

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
    pub(super) fn stream(&mut self, source: &mut dyn StreamSource) {
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
                table.is_some() && crate::rt::fork::fork_pending() && active.iter().any(StreamedRun::sends_more);
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
                                depth = run.params.queue_depth.clamp(1, self.capacity);
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
                            let block = run.params.block_size.clamp(1, 1 << 30);
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
}
