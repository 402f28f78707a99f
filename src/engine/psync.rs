//! The fallback engine: blocking pread/pwrite on threads.
//!
//! Used where io_uring cannot be set up. Up to `queue_depth` pieces (capped
//! at [`MAX_THREADS`]) are in flight at once, one per thread; a run with a
//! single piece, or a depth of one, stays on the calling thread. The
//! `single_submit` and `overlap_events` knobs have no meaning here: every
//! piece is its own syscall and threads pick up the next piece as soon as
//! they finish one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{move_piece_blocking, pieces, Engine, EngineKind, Knobs, Piece, Segment};
use crate::error::{Direction, TransferError};

/// More threads than this per worker buys nothing on NVMe.
pub const MAX_THREADS: usize = 16;

pub struct PsyncEngine {
    max_threads: usize,
}

impl PsyncEngine {
    pub fn new(queue_depth: usize) -> Self {
        PsyncEngine { max_threads: queue_depth.clamp(1, MAX_THREADS) }
    }
}

impl Engine for PsyncEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Psync
    }

    fn run(&mut self, direction: Direction, segments: &[Segment], knobs: &Knobs) -> Result<(), TransferError> {
        let all: Vec<Piece> = pieces(segments, knobs.block_size).collect();
        let threads = self.max_threads.min(knobs.queue_depth.max(1)).min(all.len());
        if threads <= 1 {
            for mut p in all {
                move_piece_blocking(direction, &mut p)?;
            }
            return Ok(());
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<TransferError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    if failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(piece) = all.get(i) else { return };
                    let mut piece = *piece;
                    if let Err(e) = move_piece_blocking(direction, &mut piece) {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().get_or_insert(e);
                        return;
                    }
                });
            }
        });
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
