//! How far a bounced blocking read runs ahead of its copy.
//!
//! A windowed read (`window.rs`) copies each window to the caller after the
//! device filled it. Too few windows in flight starve a slow device; too
//! many, on a device faster than the copy, make the copy read each byte
//! back from memory instead of the cache. So the number in flight follows
//! what the copy sees: one more after a chunk that made it wait (up to all
//! the op's windows), one fewer after one that was already done (down to
//! [`BOUNCE_WINDOWS_MIN`]), the latter only while the copy is the one
//! behind (under [`BOUNCE_COPY_BOUND_WAIT_SHARE`] of its recent time spent
//! waiting), so a device that completes chunks in bursts does not drive it
//! down. A handle remembers where its last read left it. Writes copy before
//! the I/O and use all their windows. The measurements behind each part of
//! the rule: docs/perf/read_ahead_ab.md.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::knobs::{BOUNCE_COPY_BOUND_WAIT_SHARE, BOUNCE_READY_WAIT, BOUNCE_WINDOWS_MIN};

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
    /// The copier's recent time waiting for chunks that were not done yet,
    /// and copying them out, in ns, each decayed by an eighth per chunk
    /// (about the last 8 chunks).
    recent_wait_ns: u64,
    recent_copy_ns: u64,
}

impl ReadAhead {
    /// For an op of `windows` windows, starting where the handle's last
    /// read left off (or low: a slow device raises it a window per chunk).
    pub(crate) fn new(windows: usize, memory: ReadAheadMemory) -> ReadAhead {
        let least = BOUNCE_WINDOWS_MIN.min(windows);
        let remembered = memory.0.load(Ordering::Relaxed);
        let limit = if remembered == 0 { least } else { remembered.clamp(least, windows) };
        ReadAhead { limit, most: windows, first_seen: false, memory, recent_wait_ns: 0, recent_copy_ns: 0 }
    }

    /// How many chunks may be in flight now.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A chunk was copied out after a wait of `waited`; the copy took `copied`.
    pub(crate) fn observe(&mut self, waited: Duration, copied: Duration) {
        if !std::mem::replace(&mut self.first_seen, true) {
            return;
        }
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // Taking a chunk that was already done costs the wait's own overhead:
        // not waiting for the device, though with short copies it would look
        // like a large share of the time.
        let waited_for_device = if waited >= BOUNCE_READY_WAIT { ns(waited) } else { 0 };
        self.recent_wait_ns = (self.recent_wait_ns - self.recent_wait_ns / 8).saturating_add(waited_for_device);
        self.recent_copy_ns = (self.recent_copy_ns - self.recent_copy_ns / 8).saturating_add(ns(copied));
        let copier_behind = self.recent_wait_ns.saturating_mul(BOUNCE_COPY_BOUND_WAIT_SHARE - 1) < self.recent_copy_ns;
        self.limit = if waited >= BOUNCE_READY_WAIT {
            (self.limit + 1).min(self.most)
        } else if copier_behind {
            self.limit.saturating_sub(1).max(BOUNCE_WINDOWS_MIN.min(self.most))
        } else {
            self.limit
        };
        self.memory.0.store(self.limit, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COPY: Duration = Duration::from_micros(300);
    /// A chunk already done when the copier came for it.
    fn done(ahead: &mut ReadAhead) {
        ahead.observe(Duration::ZERO, COPY);
    }
    /// A chunk the copier waited for.
    fn waited(ahead: &mut ReadAhead) {
        ahead.observe(Duration::from_millis(1), COPY);
    }
    /// A fresh read-ahead of 18 windows after a slow device raised it to all of them.
    fn raised_to_every_window() -> ReadAhead {
        let mut ahead = ReadAhead::new(18, ReadAheadMemory::default());
        for _ in 0..30 {
            waited(&mut ahead);
        }
        assert_eq!(ahead.limit(), 18);
        ahead
    }

    #[test]
    fn a_copy_that_keeps_finding_its_chunks_done_runs_few_ahead() {
        let mut ahead = ReadAhead::new(18, ReadAheadMemory::default());
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN, "starts low");
        waited(&mut ahead); // the first wait: nothing was there to copy
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN);
        waited(&mut ahead);
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN + 1);
        for _ in 0..40 {
            waited(&mut ahead);
        }
        assert_eq!(ahead.limit(), 18, "a slow device raises it up to every window");
        done(&mut ahead);
        assert_eq!(ahead.limit(), 18, "the copier still waited for most of its recent time");
        for _ in 0..40 {
            done(&mut ahead);
        }
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN, "a fast device takes it down to the least");
    }

    #[test]
    fn a_device_that_completes_in_bursts_keeps_every_window_in_flight() {
        // One long wait, then three chunks that came with it: the copier is
        // still the one waiting (the virtio disk's pattern).
        let mut ahead = ReadAhead::new(18, ReadAheadMemory::default());
        for _ in 0..30 {
            ahead.observe(Duration::from_millis(2), COPY);
            for _ in 0..3 {
                done(&mut ahead);
            }
        }
        assert_eq!(ahead.limit(), 18);
    }

    #[test]
    fn a_copier_that_waits_now_and_then_still_runs_few_ahead() {
        // A fast device on a busy 2-core machine: a short wait every tenth chunk.
        let mut ahead = raised_to_every_window();
        for i in 0..200 {
            match i % 10 {
                0 => ahead.observe(Duration::from_micros(50), COPY),
                _ => done(&mut ahead),
            }
        }
        assert!(ahead.limit() <= BOUNCE_WINDOWS_MIN + 1, "limit {}", ahead.limit());
    }

    #[test]
    fn short_copies_of_chunks_already_done_still_lower_it() {
        // Copies of 40 µs (helpers on many CPUs), and waits for chunks that
        // were done that cost 15 µs of overhead each: the copy is behind.
        let mut ahead = raised_to_every_window();
        for _ in 0..60 {
            ahead.observe(Duration::from_micros(15), Duration::from_micros(40));
        }
        assert_eq!(ahead.limit(), BOUNCE_WINDOWS_MIN);
    }

    #[test]
    fn the_next_read_of_a_handle_starts_where_the_last_left_off() {
        let memory = ReadAheadMemory::default();
        let mut first = ReadAhead::new(18, memory.clone());
        for _ in 0..10 {
            waited(&mut first);
        }
        assert_eq!(first.limit(), 12, "the least, raised once per wait after the first");
        let mut second = ReadAhead::new(18, memory.clone());
        assert_eq!(second.limit(), 12);
        done(&mut second); // its own first chunk changes nothing
        done(&mut second);
        assert_eq!(ReadAhead::new(18, memory.clone()).limit(), 11);
        assert_eq!(ReadAhead::new(5, memory.clone()).limit(), 5, "never more than the op's windows");
        assert_eq!(ReadAhead::new(2, memory).limit(), 2, "nor fewer than it has, when it has few");
    }
}
