//! What a handle says about itself: its knobs and engine, the memory it
//! recognises as pinned, its pending ops, and its statistics.


use std::sync::atomic::Ordering;
use std::time::Instant;

use super::construction::IoHandle;

use crate::buffer::BufferDesc;
use crate::config::HandleConfig;
use crate::engine::EngineKind;
use crate::op::work::OpMeta;
use crate::pinned::PinnedMemoryManager;
use crate::stats::{self, OpRecord, Stats};

impl IoHandle {
    /// The knobs the CPU path runs with (a GDS handle's CPU path has one worker).
    pub fn config(&self) -> &HandleConfig {
        &self.config
    }

    /// The engine this handle's workers run (files on tmpfs and ramfs may
    /// still take psync: see [`crate::diag::FILE_ENGINE_RULE`]).
    pub fn engine_kind(&self) -> EngineKind {
        self.engine_kind
    }

    /// The pinned-memory manager this handle recognises (the process's).
    pub fn manager(&self) -> &'static PinnedMemoryManager {
        self.manager
    }

    /// `handle.is_pinned(buffer)`: declared pinned, or inside a managed region.
    pub fn is_pinned(&self, buffer: &BufferDesc) -> bool {
        buffer.is_host()
            && (buffer.is_declared_pinned() || self.manager.is_managed(buffer.ptr(), buffer.len()))
    }

    /// Number of ops submitted and not yet finished by `wait()`.
    pub fn pending_ops(&self) -> usize {
        self.pending.lock().len()
    }

    pub(super) fn record(&self, meta: OpMeta, ok: bool, started: Instant) {
        let record = OpRecord {
            direction: meta.direction,
            bytes: meta.bytes,
            bounced_bytes: meta.bounced_bytes,
            ok,
            latency: started.elapsed(),
        };
        self.counters.record(&record);
        stats::process_counters().record(&record);
    }

    /// How its workers streamed ops: (runs started while an earlier one was
    /// unfinished, slices held back to keep the order of ops on the same
    /// bytes).
    #[cfg_attr(not(test), allow(dead_code))] // read by the internal tests
    pub(crate) fn stream_counts(&self) -> (u64, u64) {
        (
            self.stream_tally.overlapped.load(Ordering::Relaxed),
            self.stream_tally.held_for_order.load(Ordering::Relaxed),
        )
    }

    /// What this handle did so far: ops, bytes, bounced bytes, failures,
    /// latency (see [`Stats`]; [`crate::process_stats`] for the whole process).
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

}
