//! What the core did, counted per handle and per process: ops, bytes read
//! and written, bytes that went through a bounce buffer, failed ops, time
//! spent in I/O, time callers spent blocked waiting for it, and a latency
//! histogram (p50/p99 per op).
//!
//! Counting is a handful of relaxed atomic adds per op (not per block), so
//! it costs nothing measurable next to the I/O itself. An op's latency runs
//! from its dispatch to the moment `wait()` (or the blocking call) finishes
//! it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Direction;

/// Latency buckets: bucket `i` holds ops that took less than 2^i µs
/// (bucket 0: under 1 µs; the last bucket: everything longer).
const BUCKETS: usize = 40;

/// What one finished op contributes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpRecord {
    /// `None` for work that moves no file bytes of its own (tests' ops).
    pub direction: Option<Direction>,
    pub bytes: u64,
    /// Bytes copied through a bounce buffer (0 when the I/O used the caller's memory).
    pub bounced_bytes: u64,
    pub ok: bool,
    pub latency: Duration,
}

/// Live counters (one set per handle, one for the process).
pub(crate) struct Counters {
    ops: AtomicU64,
    failed_ops: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    bounced_bytes: AtomicU64,
    io_nanos: AtomicU64,
    wait_nanos: AtomicU64,
    uring_runs: AtomicU64,
    psync_runs: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

/// A snapshot of the counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ops finished (successfully or not).
    pub ops: u64,
    /// Ops that failed.
    pub failed_ops: u64,
    /// Bytes moved by successful reads and writes.
    pub bytes_read: u64,
    /// Bytes moved by successful writes.
    pub bytes_written: u64,
    /// Bytes that went through a bounce buffer (memory that was not
    /// page-locked, contiguous host memory).
    pub bounced_bytes: u64,
    /// Sum of the ops' latencies.
    pub io_time: Duration,
    /// Time callers spent blocked in calls that wait for I/O (`wait()`,
    /// `sync_*`, other blocking calls): the part of a training step that
    /// waited on the disk.
    pub wait_time: Duration,
    /// Median op latency (upper bound of its histogram bucket), if any op finished.
    pub p50: Option<Duration>,
    /// 99th-percentile op latency (upper bound of its bucket).
    pub p99: Option<Duration>,
    /// Engine runs (one list of segments moved by one engine call, or one
    /// op slice of a ring's stream) made by io_uring and by psync: which
    /// engine moved the bytes (see `engine::choice`).
    pub io_uring_runs: u64,
    /// Engine runs made by psync.
    pub psync_runs: u64,
}

impl Counters {
    pub(crate) const fn new() -> Counters {
        #[allow(clippy::declare_interior_mutable_const)] // only used to build the array
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Counters {
            ops: ZERO,
            failed_ops: ZERO,
            bytes_read: ZERO,
            bytes_written: ZERO,
            bounced_bytes: ZERO,
            io_nanos: ZERO,
            wait_nanos: ZERO,
            uring_runs: ZERO,
            psync_runs: ZERO,
            latency: [ZERO; BUCKETS],
        }
    }

    pub(crate) fn record(&self, r: &OpRecord) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if r.ok {
            let bytes = match r.direction {
                Some(Direction::Read) => &self.bytes_read,
                Some(Direction::Write) => &self.bytes_written,
                None => return self.record_latency(r.latency),
            };
            bytes.fetch_add(r.bytes, Ordering::Relaxed);
            self.bounced_bytes.fetch_add(r.bounced_bytes, Ordering::Relaxed);
        } else {
            self.failed_ops.fetch_add(1, Ordering::Relaxed);
        }
        self.record_latency(r.latency);
    }

    /// A caller was blocked for `waited` in a call that waits for I/O
    /// (`wait()`, a `sync_*` or other blocking call).
    pub(crate) fn record_wait(&self, waited: Duration) {
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// `runs` engine runs made by `kind`.
    pub(crate) fn record_runs(&self, kind: crate::engine::EngineKind, runs: u64) {
        let counter = match kind {
            crate::engine::EngineKind::Uring => &self.uring_runs,
            crate::engine::EngineKind::Psync => &self.psync_runs,
        };
        counter.fetch_add(runs, Ordering::Relaxed);
    }

    fn record_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.io_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.latency[bucket(latency)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let hist: Vec<u64> = self.latency.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        Stats {
            ops: self.ops.load(Ordering::Relaxed),
            failed_ops: self.failed_ops.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            bounced_bytes: self.bounced_bytes.load(Ordering::Relaxed),
            io_time: Duration::from_nanos(self.io_nanos.load(Ordering::Relaxed)),
            wait_time: Duration::from_nanos(self.wait_nanos.load(Ordering::Relaxed)),
            p50: quantile(&hist, 0.50),
            p99: quantile(&hist, 0.99),
            io_uring_runs: self.uring_runs.load(Ordering::Relaxed),
            psync_runs: self.psync_runs.load(Ordering::Relaxed),
        }
    }
}

fn bucket(latency: Duration) -> usize {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    // Bucket i holds [2^(i-1), 2^i) µs; 0 holds under 1 µs.
    let i = (u64::BITS - micros.leading_zeros()) as usize;
    i.min(BUCKETS - 1)
}

/// The upper bound of the bucket that holds quantile `q`.
fn quantile(hist: &[u64], q: f64) -> Option<Duration> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, &n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(Duration::from_micros(1u64 << i.min(63)));
        }
    }
    None
}

static PROCESS: Counters = Counters::new();

/// With [`crate::knobs::STATS_ENV`]`=1`, registers (once) a report of the
/// process's statistics on stderr at exit. Called when a handle is made.
pub(crate) fn report_at_exit_if_asked() {
    // A flag, not a `Once`, so that nobody ever waits on it: a child of a
    // fork() made while another thread was in here would wait forever.
    static REGISTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !crate::knobs::settings().stats_at_exit {
        return;
    }
    extern "C" fn report() {
        // Nothing may unwind out of an atexit handler.
        let _ = std::panic::catch_unwind(|| crate::rt::log::info(&format!("stats: {}", process())));
    }
    if !REGISTERED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        // SAFETY: registers a plain function with no captured state.
        unsafe { libc::atexit(report) };
    }
}

/// The process-wide counters (every handle adds to them).
pub(crate) fn process_counters() -> &'static Counters {
    &PROCESS
}

/// Everything every handle of this process did so far.
pub fn process() -> Stats {
    PROCESS.snapshot()
}

impl std::fmt::Display for Stats {
    /// One line: ops, GB read/written, bounced bytes, failures, p50/p99.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gb = |b: u64| b as f64 / 1e9;
        let us = |d: Option<Duration>| d.map(|d| format!("{} us", d.as_micros())).unwrap_or_else(|| "-".into());
        write!(
            f,
            "{} ops ({} failed), read {:.3} GB, wrote {:.3} GB, bounced {:.3} GB, I/O time {:.3} s, \
             waited {:.3} s, p50 < {}, p99 < {}, engine runs io_uring {} / psync {}",
            self.ops,
            self.failed_ops,
            gb(self.bytes_read),
            gb(self.bytes_written),
            gb(self.bounced_bytes),
            self.io_time.as_secs_f64(),
            self.wait_time.as_secs_f64(),
            us(self.p50),
            us(self.p99),
            self.io_uring_runs,
            self.psync_runs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_bytes_failures_and_quantiles() {
        let c = Counters::new();
        for i in 0..100u64 {
            c.record(&OpRecord {
                direction: Some(if i % 2 == 0 { Direction::Read } else { Direction::Write }),
                bytes: 1000,
                bounced_bytes: if i < 10 { 1000 } else { 0 },
                ok: i != 99,
                latency: Duration::from_micros(if i < 98 { 100 } else { 10_000 }),
            });
        }
        let s = c.snapshot();
        assert_eq!((s.ops, s.failed_ops), (100, 1));
        assert_eq!((s.bytes_read, s.bytes_written, s.bounced_bytes), (50_000, 49_000, 10_000));
        // 100 µs lies in [64, 128): its bucket's upper bound is 128 µs.
        assert_eq!(s.p50, Some(Duration::from_micros(128)));
        assert_eq!(s.p99, Some(Duration::from_micros(16_384)));
        assert_eq!(Counters::new().snapshot().p50, None);
    }
}
