//! How far a bounced blocking read runs ahead of its copy.
//!
//! A windowed read (`window.rs`) copies each window's bytes to the caller
//! after the device filled it. When the device is slower than the copy,
//! the copy waits for every chunk, and the more windows in flight the
//! deeper the device's queue. When the device is faster (a RAM-backed
//! device, an NVMe array on few cores), the workers fill every window the
//! op has long before the copy reaches it, and the copy reads each byte
//! back from memory instead of the cache (measured on ext4 on zram:
//! docs/perf/read_ahead_ab.md).
//!
//! So the number in flight follows what the copy sees: one fewer after
//! each chunk that was already done when it was waited for (down to
//! [`BOUNCE_WINDOWS_MIN`]), one more after each that made it wait (up to
//! all the op's windows). One step each way: doubling on a wait kept it
//! above the least on zram, where a 2-core VM's scheduler makes the copy
//! wait now and then. A handle remembers where its last read left it, so
//! the next one starts there. Writes copy before the I/O and always use
//! all their windows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::knobs::{BOUNCE_READY_WAIT, BOUNCE_WINDOWS_MIN};

/// A handle's memory of its reads' read-ahead, shared by its windowed ops
/// (0: none yet).
#[derive(Clone, Default)]
pub(crate) struct ReadAheadMemory(Arc<AtomicUsize>);

/// One windowed read's read-ahead.
pub(crate) struct ReadAhead {
    limit: usize,
    most: usize,
    /// The op's first wait says nothing: there was nothing to copy yet.
    first_seen: bool,
    memory: ReadAheadMemory,
}

impl ReadAhead {
    /// For an op of `windows` windows, starting where the handle's last
    /// read left off (or low: a slow device raises it a window per chunk).
    pub(crate) fn new(windows: usize, memory: ReadAheadMemory) -> ReadAhead {
        let least = BOUNCE_WINDOWS_MIN.min(windows);
        let remembered = memory.0.load(Ordering::Relaxed);
        let limit = if remembered == 0 { least } else { remembered.clamp(least, windows) };
        ReadAhead { limit, most: windows, first_seen: false, memory }
    }

    /// How many chunks may be in flight now.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A chunk finished, its wait having taken `waited`.
    pub(crate) fn observe(&mut self, waited: Duration) {
        if !std::mem::replace(&mut self.first_seen, true) {
            return;
        }
        self.limit = if waited < BOUNCE_READY_WAIT {
            self.limit.saturating_sub(1).max(BOUNCE_WINDOWS_MIN.min(self.most))
        } else {
            (self.limit + 1).min(self.most)
        };
        self.memory.0.store(self.limit, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: Duration = Duration::ZERO;
    const WAITED: Duration = Duration::from_millis(1);

    #[test]
    fn a_copy_that_keeps_finding_its_chunks_done_runs_few_ahead() {
        let mut ahead = ReadAhead::new(18, ReadAheadMemory::default());
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN, "starts low");
        ahead.observe(WAITED); // the first wait: nothing was there to copy
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN);
        ahead.observe(WAITED);
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN + 1);
        for _ in 0..40 {
            ahead.observe(WAITED);
        }
        assert_eq!(ahead.limit(), 18, "a slow device raises it up to every window");
        for _ in 0..40 {
            ahead.observe(DONE);
        }
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN, "a fast device takes it down to the least");
    }

    #[test]
    fn the_next_read_of_a_handle_starts_where_the_last_left_off() {
        let memory = ReadAheadMemory::default();
        let mut first = ReadAhead::new(18, memory.clone());
        for _ in 0..10 {
            first.observe(WAITED);
        }
        assert_eq!(first.limit(), 12, "the least, raised once per wait after the first");
        let mut second = ReadAhead::new(18, memory.clone());
        assert_eq!(second.limit(), 12);
        second.observe(WAITED); // its own first wait changes nothing
        second.observe(DONE);
        assert_eq!(ReadAhead::new(18, memory.clone()).limit(), 11);
        assert_eq!(ReadAhead::new(5, memory.clone()).limit(), 5, "never more than the op's windows");
        assert_eq!(ReadAhead::new(2, memory).limit(), 2, "nor fewer than it has, when it has few");
    }
}
