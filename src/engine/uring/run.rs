//! The `Engine` impl: one run of pieces through the ring.

use std::sync::Arc;

use crate::engine::fixed::RegistrableMemory;
use crate::engine::contract::{AioParams, Engine, EngineKind, StreamSource};
use crate::engine::piece::{pieces, Segment};
use crate::error::{Direction, TransferError};

use super::ring::{settle, take_table, Settled, UringEngine};

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
        params: &AioParams,
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
        let block = params.block_size.clamp(1, 1 << 30);
        let depth = params.queue_depth.clamp(1, self.capacity);
        let mut todo = pieces(segments, block).peekable();
        let mut in_flight = 0usize;
        let mut first_error: Option<TransferError> = None;
        let mut completions = std::mem::take(&mut self.reaped);

        loop {
            // A fork is waiting for the table (see `rt/fork.rs`): send nothing
            // more and, once what is in flight has completed, let the table
            // go until the fork is done, then go on (registering again).
            let yielding = table.is_some()
                && crate::rt::fork::fork_pending()
                && first_error.is_none()
                && todo.peek().is_some();
            if yielding && in_flight == 0 {
                drop(table.take());
                table = fixed.as_deref().map(take_table);
                continue;
            }
            // Fill: in batch mode only when the previous batch is fully done.
            let may_fill = !yielding && first_error.is_none() && (params.overlap_events || in_flight == 0);
            if may_fill {
                while in_flight < depth {
                    let Some(piece) = todo.next() else { break };
                    let slot = self.free_slots.pop().expect("free slot accounting");
                    self.slots[slot] = Some(piece);
                    self.push(direction, slot, memory, table.as_deref_mut());
                    in_flight += 1;
                    if params.single_submit {
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
            let want = if params.overlap_events { 1 } else { in_flight };
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
                        if params.single_submit {
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
