//! Pinned-manager microbenchmark: `PinnedMemoryManager::is_managed` (a
//! page-index lookup under a read lock: a hash probe and one table load) against the linear scan that
//! DeepSpeed's C++ `deepspeed_pin_tensor_t::is_managed` does (walk every
//! recorded (base, bytes) allocation under a mutex until one holds the whole
//! extent), over the very same live, mlock'ed regions.
//!
//!     cargo run --release --example is_managed_bench [-- --counts 10,1000,100000] [--json]
//!
//! For each count N it allocates N regions of 1 byte (one locked page each:
//! 400 MB locked at N = 100,000), then times, in ns per lookup:
//!
//! * hit: `is_managed(base + 0, 1)` of a region picked at random (the linear
//!   scan stops at the match: N/2 entries on average);
//! * miss: an address in no region (the linear scan walks all N).
//!
//! RLIMIT_MEMLOCK is raised with setrlimit when it is too low (root may raise
//! the hard limit too). When that is refused the run goes on: a process with
//! CAP_IPC_LOCK is not bound by the limit, and a count whose allocations fail
//! is skipped with the error. vm.max_map_count is reported (adjacent
//! one-page locked mappings normally merge into few VMAs).
//! No dependency beyond the core crate's own (libc).

use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deepnvme::diag::{memlock_limit, page_size};
use deepnvme::PinnedMemoryManager;

mod common;
use common::Rng;

/// RLIM_INFINITY as the u64 that memlock_limit() returns (rlim_t is not u64 on every target).
#[allow(clippy::unnecessary_cast)]
const INFINITY: u64 = libc::RLIM_INFINITY as u64;

/// What DeepSpeed's C++ does: a mutex-guarded list of (base, bytes), scanned
/// in order until one allocation holds the whole `[ptr, ptr + len)`.
struct LinearScan {
    regions: Mutex<Vec<(usize, usize)>>,
}

impl LinearScan {
    fn is_managed(&self, ptr: *const u8, len: usize) -> bool {
        let start = ptr as usize;
        let end = start + len;
        let regions = self.regions.lock().unwrap();
        for &(base, bytes) in regions.iter() {
            if start >= base && end <= base + bytes {
                return true;
            }
        }
        false
    }
}

/// ns per call of `f` over `queries`, repeated until at least `budget` has
/// passed (best of 3 such passes, to shed scheduler noise).
fn time_ns(queries: &[usize], budget: Duration, f: &dyn Fn(usize) -> bool) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut calls = 0u64;
        let mut hits = 0u64;
        while t0.elapsed() < budget {
            for &q in queries {
                hits += f(q) as u64;
            }
            calls += queries.len() as u64;
        }
        black_box(hits);
        best = best.min(t0.elapsed().as_nanos() as f64 / calls as f64);
    }
    best
}

fn raise_memlock(need: u64) -> Result<String, String> {
    let (soft, hard) = memlock_limit();
    if soft == INFINITY || soft >= need {
        return Ok(format!("RLIMIT_MEMLOCK {} is enough", show_limit(soft)));
    }
    let new_hard = if hard == INFINITY || hard >= need { hard } else { need };
    let r = libc::rlimit { rlim_cur: need as libc::rlim_t, rlim_max: new_hard as libc::rlim_t };
    // SAFETY: setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } == 0 {
        Ok(format!("RLIMIT_MEMLOCK raised from {} to {} bytes", show_limit(soft), need))
    } else {
        Err(format!(
            "RLIMIT_MEMLOCK is {} (hard {}) and raising it to {} bytes was refused ({}); \
             mlock can still succeed (a process with CAP_IPC_LOCK is not bound by the limit); \
             otherwise raise `ulimit -l`",
            show_limit(soft),
            show_limit(hard),
            need,
            std::io::Error::last_os_error()
        ))
    }
}

fn show_limit(v: u64) -> String {
    if v == INFINITY {
        "unlimited".into()
    } else {
        format!("{v}")
    }
}

fn main() {
    let mut counts: Vec<usize> = vec![10, 1_000, 100_000];
    let mut json = false;
    let mut budget = Duration::from_millis(200);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--counts" => {
                let v = args.next().expect("--counts needs a list like 10,1000,100000");
                counts = v.split(',').map(|s| s.trim().replace('_', "").parse().expect("a count")).collect();
            }
            "--budget-ms" => {
                let v = args.next().expect("--budget-ms needs a number");
                budget = Duration::from_millis(v.parse().expect("a number of ms"));
            }
            "-h" | "--help" => {
                println!("usage: is_managed_bench [--counts 10,1000,100000] [--budget-ms 200] [--json]");
                return;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let page = page_size();
    let max_count = counts.iter().copied().max().unwrap_or(0);
    // Our regions plus slack for whatever else the process locks.
    let need = (max_count as u64 + 16) * page as u64 + (64 << 20);
    let limit_note = match raise_memlock(need) {
        Ok(s) => s,
        Err(s) => s,
    };
    let max_map_count =
        std::fs::read_to_string("/proc/sys/vm/max_map_count").map(|s| s.trim().to_string()).unwrap_or_default();
    if !json {
        println!("is_managed: deepnvme (page index: hash probe + table load, read lock) vs linear scan (mutex + Vec walk, as DeepSpeed's C++)");
        println!("{limit_note}; vm.max_map_count {max_map_count}; page {page} bytes; 1-byte regions (1 locked page each)");
        println!("{:>9} {:>14} {:>14} {:>14} {:>14} {:>13}", "regions", "deepnvme hit", "linear hit", "deepnvme miss", "linear miss", "linear/dn hit");
    }
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for &n in &counts {
        let mgr = PinnedMemoryManager::new();
        let mut bases = Vec::with_capacity(n);
        let mut failed = None;
        for i in 0..n {
            match mgr.alloc(1) {
                Ok(p) => bases.push(p.as_ptr() as usize),
                Err(e) => {
                    failed = Some(format!("allocation {i} of {n} failed: {e}"));
                    break;
                }
            }
        }
        if let Some(why) = failed {
            eprintln!("is_managed_bench: {n} regions: {why}; skipped");
            skipped.push(serde_free_json_string(&format!("{n}: {why}")));
            continue; // `mgr` frees what it got on drop
        }
        // std::map iterates by address: keep the scan in the same order.
        let mut sorted = bases.clone();
        sorted.sort_unstable();
        let scan = LinearScan { regions: Mutex::new(sorted.iter().map(|&b| (b, 1usize)).collect()) };

        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ n as u64);
        let queries: Vec<usize> = (0..4096).map(|_| bases[(rng.next() % n as u64) as usize]).collect();
        // An address in no region: a small heap allocation of our own.
        let outside = Box::new([0u8; 64]);
        let miss = vec![outside.as_ptr() as usize; queries.len()];

        // Sanity: both agree on every query.
        for &q in &queries {
            assert!(mgr.is_managed(q as *const u8, 1) && scan.is_managed(q as *const u8, 1));
        }
        assert!(!mgr.is_managed(miss[0] as *const u8, 1) && !scan.is_managed(miss[0] as *const u8, 1));

        let d_hit = time_ns(&queries, budget, &|q| mgr.is_managed(black_box(q) as *const u8, 1));
        let l_hit = time_ns(&queries, budget, &|q| scan.is_managed(black_box(q) as *const u8, 1));
        let d_miss = time_ns(&miss, budget, &|q| mgr.is_managed(black_box(q) as *const u8, 1));
        let l_miss = time_ns(&miss, budget, &|q| scan.is_managed(black_box(q) as *const u8, 1));
        let ratio = l_hit / d_hit;
        if !json {
            println!("{n:>9} {d_hit:>11.1} ns {l_hit:>11.1} ns {d_miss:>11.1} ns {l_miss:>11.1} ns {ratio:>12.1}x");
        }
        rows.push(format!(
            "{{\"regions\": {n}, \"deepnvme_hit_ns\": {d_hit:.2}, \"linear_hit_ns\": {l_hit:.2}, \
             \"deepnvme_miss_ns\": {d_miss:.2}, \"linear_miss_ns\": {l_miss:.2}, \"locked_bytes\": {}}}",
            mgr.stats().2
        ));
        drop(mgr);
    }
    if json {
        println!(
            "{{\"bench\": \"is_managed\", \"page_size\": {page}, \"memlock\": {}, \"max_map_count\": {}, \
             \"rows\": [{}], \"skipped\": [{}]}}",
            serde_free_json_string(&limit_note),
            serde_free_json_string(&max_map_count),
            rows.join(", "),
            skipped.join(", ")
        );
    }
}

/// A JSON string literal without serde (the core crate gains no dependency).
fn serde_free_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
