//! The pinned-memory manager on real mmap/mlock: alignment, locking (VmLck),
//! exact-base free, range recognition (narrows, views, overruns, gaps),
//! thousands of regions, threads, drop, and the RLIMIT_MEMLOCK error path.
//!
//! VmLck is per process, so every test here that locks memory holds
//! `VMLCK` and measures only its own change.
//!
//! A binary of its own (not a module of `tests/core/`): it measures VmLck,
//! which is per process, and the RLIMIT_MEMLOCK error path; another file's
//! pinned buffers would move the count.

use deepnvme::test_support as common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use common::*;
use deepnvme::diag::page_size;
use deepnvme::PinnedMemoryManager;
use deepnvme::{BufferDesc, Error, HandleConfig, IoHandle};

static VMLCK: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    VMLCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn round_page(n: usize) -> usize {
    n.max(1).div_ceil(page_size()) * page_size()
}

#[test]
fn allocations_are_page_aligned_writable_and_recorded() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let sizes = [0usize, 1, 511, 4095, 4096, 4097, (1 << 20) + 3];
    let mut bases = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let p = m.alloc(n).expect("alloc").as_ptr();
        assert_eq!(p as usize % page_size(), 0, "alloc({n}) is not page aligned: {p:p}");
        // Every requested byte is usable.
        // SAFETY: bytes of this test's own live mapping, which nothing else writes meanwhile.
        let s = unsafe { std::slice::from_raw_parts_mut(p, n) };
        s.fill(i as u8 + 1);
        assert!(s.iter().all(|&b| b == i as u8 + 1));
        assert_eq!(m.region_of(p), Some((p as usize, n)), "region_of base of alloc({n})");
        bases.push(p);
    }
    let distinct: std::collections::HashSet<_> = bases.iter().collect();
    assert_eq!(distinct.len(), bases.len(), "every allocation (even zero-length) has its own base");
    let (count, requested, mapped) = m.stats();
    assert_eq!(count, sizes.len());
    assert_eq!(requested, sizes.iter().sum::<usize>());
    assert_eq!(mapped, sizes.iter().map(|&n| round_page(n)).sum::<usize>());
    for p in bases {
        assert!(m.free(p));
    }
    assert_eq!(m.stats(), (0, 0, 0));
}

#[test]
fn memory_is_really_locked_and_unlocked_on_free() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let before = vm_locked_bytes();
    let n = (1 << 20) + 3;
    let p = m.alloc(n).unwrap().as_ptr();
    let during = vm_locked_bytes();
    assert_eq!(during - before, round_page(n), "VmLck must grow by the mapped size ({} bytes)", round_page(n));
    let q = m.alloc(5 * page_size()).unwrap().as_ptr();
    assert_eq!(vm_locked_bytes() - before, round_page(n) + 5 * page_size());
    assert!(m.free(p));
    assert_eq!(vm_locked_bytes() - before, 5 * page_size(), "free must munlock");
    assert!(m.free(q));
    assert_eq!(vm_locked_bytes(), before, "VmLck back to baseline after freeing everything");
}

#[test]
fn free_accepts_only_an_exact_base_once() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let n = 3 * page_size() + 100;
    let p = m.alloc(n).unwrap().as_ptr();
    let other = m.alloc(page_size()).unwrap().as_ptr();
    // Interior pointers, one past the end, unknown memory: refused, nothing freed.
    for off in [1usize, 3, page_size(), n - 1, n] {
        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
        assert!(!m.free(unsafe { p.add(off) }), "free of base+{off} must be refused");
    }
    let local = [0u8; 16];
    assert!(!m.free(local.as_ptr()), "free of memory the manager never gave out");
    assert!(!m.free(std::ptr::null()), "free of null");
    assert_eq!(m.stats().0, 2, "refused frees release nothing");
    assert!(m.is_managed(p, n), "region still usable after refused frees");
    // SAFETY: writes inside this test's own live mapping, owned by this thread.
    unsafe { std::ptr::write_volatile(p.add(n - 1), 7) };
    // A second manager does not own the first one's memory.
    let m2 = PinnedMemoryManager::new();
    assert!(!m2.free(p));
    assert!(m.free(p));
    assert!(!m.free(p), "double free must be refused");
    assert!(!m.is_managed(p, 1), "freed region is no longer managed");
    assert!(m.free(other));
    assert_eq!(m.stats(), (0, 0, 0));
}

#[test]
fn is_managed_accepts_whole_narrows_views_and_rejects_overruns_and_gaps() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let page = page_size();
    let n = 2 * page + 1000; // requested < mapped: [n, 3*page) is a gap
    let a = m.alloc(n).unwrap().as_ptr();
    // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
    let at = |off: usize| unsafe { a.add(off) };

    // Whole region, narrows, views, zero-length at base and at the end.
    assert!(m.is_managed(a, n));
    assert!(m.is_managed(a, 0));
    assert!(m.is_managed(at(1), n - 1));
    assert!(m.is_managed(at(3), 100));
    assert!(m.is_managed(at(page), page));
    assert!(m.is_managed(at(n - 1), 1));
    assert!(m.is_managed(at(n), 0));
    // Views as a tensor library makes them: fixed-stride rows of the region.
    for row in 0..(n / 1000) {
        assert!(m.is_managed(at(row * 1000), 1000), "row view {row}");
    }

    // Starting inside but running past the requested end (even into the
    // mapped-but-not-requested tail of the last page).
    assert!(!m.is_managed(a, n + 1));
    assert!(!m.is_managed(at(n - 1), 2));
    assert!(!m.is_managed(at(1), n));
    assert!(!m.is_managed(at(page), 3 * page));
    assert!(!m.is_managed(at(10), usize::MAX - 5), "length overflowing the address space");
    // The gap after the requested bytes belongs to no region.
    assert!(!m.is_managed(at(n), 1));
    assert!(!m.is_managed(at(3 * page - 1), 1));
    // Before the (only) region.
    // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
    assert!(!m.is_managed(unsafe { a.sub(1) }, 1));
    // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
    assert!(!m.is_managed(unsafe { a.sub(1) }, 2), "starting before, ending inside");
    // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
    assert!(!m.is_managed(unsafe { a.sub(page) }, 0));
    assert!(!m.is_managed(std::ptr::null(), 1));
    assert!(!m.is_managed(std::ptr::null(), 0));

    // Between two regions, and spanning two regions.
    let b = m.alloc(page).unwrap().as_ptr();
    let (lo, lo_len, hi) = if (a as usize) < (b as usize) { (a, n, b) } else { (b, page, a) };
    let lo_mapped = round_page(lo_len);
    if lo_len < lo_mapped {
        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
        assert!(!m.is_managed(unsafe { lo.add(lo_len) }, 1), "gap between regions");
    }
    if lo as usize + lo_mapped == hi as usize {
        // Adjacent mappings: an extent covering the end of one and the start
        // of the next is not inside ONE region.
        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
        assert!(!m.is_managed(unsafe { lo.add(lo_len - 1) }, (hi as usize - lo as usize) - lo_len + 2));
    }
    assert!(!m.is_managed(lo, hi as usize - lo as usize + 1), "extent spanning two regions");

    // After free.
    assert!(m.free(a));
    assert!(!m.is_managed(a, 1));
    assert!(!m.is_managed(a, n));
    // An empty extent at `a` is managed only as the end of `b`, when `b`'s
    // (full-page) mapping sits right below `a`.
    assert_eq!(m.is_managed(a, 0), b as usize + page == a as usize);
    assert_eq!(m.region_of(a), None);
    assert!(m.is_managed(b, page));
    assert!(m.free(b));
}

#[test]
fn adjacent_full_page_regions_do_not_merge() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let page = page_size();
    let bases: Vec<usize> = (0..64).map(|_| m.alloc(page).unwrap().as_ptr() as usize).collect();
    let set: std::collections::BTreeSet<usize> = bases.iter().copied().collect();
    let mut adjacent = 0;
    for &b in &set {
        if set.contains(&(b + page)) {
            adjacent += 1;
            assert!(m.is_managed(b as *const u8, page));
            assert!(m.is_managed((b + page) as *const u8, page));
            assert!(!m.is_managed((b + page - 1) as *const u8, 2), "extent across two adjacent regions");
            assert!(!m.is_managed(b as *const u8, 2 * page), "two whole adjacent regions");
        }
    }
    eprintln!("adjacent region pairs checked: {adjacent}");
    for b in bases {
        assert!(m.free(b as *const u8));
    }
}

/// How many one-page regions this process may lock (RLIMIT_MEMLOCK applies
/// without CAP_IPC_LOCK), leaving headroom for other tests' buffers.
fn lockable_pages(want: usize) -> usize {
    let (soft, _) = deepnvme::diag::memlock_limit();
    // SAFETY: no arguments, no memory touched.
    let privileged = unsafe { libc::geteuid() } == 0;
    if privileged || soft == libc::RLIM_INFINITY {
        return want;
    }
    let can = (soft as usize / page_size()).saturating_sub(64);
    if can < want {
        skip(&format!("RLIMIT_MEMLOCK is {soft} bytes: testing {can} regions instead of {want}"));
    }
    can.min(want)
}

#[test]
fn thousands_of_regions_stay_correct() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let count = lockable_pages(3000);
    assert!(count >= 100, "too little lockable memory to test many regions");
    let mut rng = Rng::new(42);
    let mut regions: BTreeMap<usize, usize> = BTreeMap::new();
    for _ in 0..count {
        let n = rng.range(0, page_size());
        let p = m.alloc(n).unwrap().as_ptr() as usize;
        regions.insert(p, n);
    }
    assert_eq!(m.stats().0, count);
    // Every region: whole, narrow, past-the-end, and the byte before.
    for (&b, &n) in &regions {
        let p = b as *const u8;
        assert!(m.is_managed(p, n));
        assert_eq!(m.region_of(p), Some((b, n)));
        if n > 2 {
            // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
            assert!(m.is_managed(unsafe { p.add(1) }, n - 2));
        }
        assert!(!m.is_managed(p, n + 1), "overrun of region {b:#x} ({n} bytes)");
        // The byte before a region is managed only when it ends the
        // requested bytes of a full-page region right below.
        let below = regions.range(..b).next_back();
        let before_ok = matches!(below, Some((&lb, &ln)) if lb + ln == b);
        assert_eq!(m.is_managed((b - 1) as *const u8, 1), before_ok, "byte before region {b:#x}");
    }
    // Free every other region, check both halves, free the rest.
    let all: Vec<(usize, usize)> = regions.iter().map(|(&b, &n)| (b, n)).collect();
    for (i, &(b, _)) in all.iter().enumerate() {
        if i % 2 == 0 {
            assert!(m.free(b as *const u8));
        }
    }
    for (i, &(b, n)) in all.iter().enumerate() {
        let managed = m.is_managed(b as *const u8, n.max(1));
        assert_eq!(managed, i % 2 == 1 && n > 0, "region {i} after freeing the even ones");
    }
    for (i, &(b, _)) in all.iter().enumerate() {
        assert_eq!(m.free(b as *const u8), i % 2 == 1);
    }
    assert_eq!(m.stats(), (0, 0, 0));
}

#[test]
fn concurrent_alloc_free_and_lookup() {
    let _g = serial();
    let m = PinnedMemoryManager::new();
    let before = vm_locked_bytes();
    let threads = 8;
    let rounds = 300;
    std::thread::scope(|s| {
        for t in 0..threads {
            let m = &m;
            s.spawn(move || {
                let mut rng = Rng::new(1000 + t as u64);
                let mut mine: Vec<(*mut u8, usize, u8)> = Vec::new();
                for r in 0..rounds {
                    if mine.len() < 8 && (mine.is_empty() || rng.range(0, 2) > 0) {
                        let n = rng.range(1, 3 * page_size());
                        let p = m.alloc(n).unwrap().as_ptr();
                        let tag = (t * 31 + r) as u8;
                        // SAFETY: writes inside this test's own live mapping, owned by this thread.
                        unsafe { std::ptr::write_bytes(p, tag, n) };
                        mine.push((p, n, tag));
                    } else {
                        let i = rng.range(0, mine.len() - 1);
                        let (p, n, tag) = mine.swap_remove(i);
                        // SAFETY: bytes of this test's own live mapping, which nothing else writes meanwhile.
                        let s = unsafe { std::slice::from_raw_parts(p, n) };
                        assert!(s.iter().all(|&b| b == tag), "another thread wrote into my region");
                        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
                        assert!(!m.free(unsafe { p.add(1) }), "interior free");
                        assert!(m.free(p));
                    }
                    for &(p, n, _) in &mine {
                        assert!(m.is_managed(p, n));
                        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
                        assert!(m.is_managed(unsafe { p.add(n / 2) }, n - n / 2));
                        assert!(!m.is_managed(p, n + 1));
                        // SAFETY: address arithmetic near the test's mapping; the result is only compared or handed to the manager, which checks it.
                        assert_eq!(m.region_of(unsafe { p.add(n - 1) }), Some((p as usize, n)));
                    }
                }
                for (p, _, _) in mine {
                    assert!(m.free(p));
                }
            });
        }
    });
    assert_eq!(m.stats(), (0, 0, 0));
    assert_eq!(vm_locked_bytes(), before, "VmLck back to baseline after concurrent use");
}

#[test]
fn dropping_a_private_manager_releases_everything() {
    let _g = serial();
    let before = vm_locked_bytes();
    {
        let m = PinnedMemoryManager::new();
        let mut total = 0;
        for i in 0..20 {
            let n = i * 10_000 + 1;
            m.alloc(n).unwrap();
            total += round_page(n);
        }
        assert_eq!(vm_locked_bytes() - before, total);
    }
    assert_eq!(vm_locked_bytes(), before, "drop must munlock (and unmap) every region");
}

#[test]
fn shared_manager_is_one_per_process_and_backs_is_pinned() {
    let _g = serial();
    let a = PinnedMemoryManager::shared();
    let b = PinnedMemoryManager::shared();
    assert!(std::ptr::eq(a, b));
    let before = vm_locked_bytes();
    let n = 3 * 4096 + 5;
    let p = a.alloc(n).unwrap().as_ptr();
    assert_eq!(vm_locked_bytes() - before, round_page(n));
    assert!(b.is_managed(p, n));
    let h = IoHandle::new(HandleConfig { engine: Some(deepnvme::EngineKind::Psync), ..HandleConfig::default() }).unwrap();
    assert!(std::ptr::eq(h.manager(), a), "handles use the shared manager");
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(h.is_pinned(&unsafe { BufferDesc::from_raw_parts(p, n) }.pinned(false)));
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(h.is_pinned(&unsafe { BufferDesc::from_raw_parts(p.add(3), 100) }.pinned(false)), "narrow");
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(!h.is_pinned(&unsafe { BufferDesc::from_raw_parts(p, n + 1) }.pinned(false)), "overrun");
    let heap = [0u8; 64];
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(!h.is_pinned(&unsafe { BufferDesc::from_raw_parts(heap.as_ptr() as *mut u8, 64) }.pinned(false)));
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(h.is_pinned(&unsafe { BufferDesc::from_raw_parts(heap.as_ptr() as *mut u8, 64) }.pinned(true)), "declared pinned (torch-pinned) counts");
    assert!(a.free(p));
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    assert!(!h.is_pinned(&unsafe { BufferDesc::from_raw_parts(p, n) }.pinned(false)));
    assert_eq!(vm_locked_bytes(), before);
}

/// Exit codes of the child in `mlock_failure_is_an_error_naming_size_and_limit`.
mod child {
    pub const PASS: i32 = 0;
    pub const SKIP_CANNOT_DROP: i32 = 20;
    pub const SETRLIMIT: i32 = 10;
    pub const SMALL_ALLOC_FAILED: i32 = 11;
    pub const BIG_ALLOC_SUCCEEDED: i32 = 12;
    pub const WRONG_ERROR: i32 = 13;
    pub const BAD_MESSAGE: i32 = 14;
    pub const LEAKED_RECORD: i32 = 15;
    pub const PANIC: i32 = 16;
}

fn cap_eff_has_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    let caps = u64::from_str_radix(&hex, 16).unwrap_or(u64::MAX);
    const CAP_IPC_LOCK: u32 = 14;
    caps & (1 << CAP_IPC_LOCK) != 0
}

/// Runs in the forked child: lowers RLIMIT_MEMLOCK, gives up the privilege
/// that ignores it, and checks the error of an alloc above the limit.
fn mlock_child() -> i32 {
    const LIMIT: u64 = 64 * 1024;
    const BIG: usize = 1 << 20;
    let r = libc::rlimit { rlim_cur: LIMIT as libc::rlim_t, rlim_max: LIMIT as libc::rlim_t };
    // SAFETY: `r` is a live rlimit; it changes only this (child) process.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return child::SETRLIMIT;
    }
    // SAFETY: no arguments, no memory touched.
    if unsafe { libc::geteuid() } == 0 {
        // Leaving uid 0 clears every capability (no SECBIT_KEEP_CAPS).
        // SAFETY: a null list with length 0, and plain ids; this child only.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return child::SKIP_CANNOT_DROP;
            }
        }
    }
    if cap_eff_has_ipc_lock() {
        return child::SKIP_CANNOT_DROP;
    }
    let m = PinnedMemoryManager::new();
    // Under the limit still works: the failure below is the limit, not mlock at large.
    match m.alloc(4096) {
        Ok(p) => {
            if !m.free(p.as_ptr()) {
                return child::SMALL_ALLOC_FAILED;
            }
        }
        Err(_) => return child::SMALL_ALLOC_FAILED,
    }
    match m.alloc(BIG) {
        Ok(_) => child::BIG_ALLOC_SUCCEEDED,
        Err(e @ Error::Lock { .. }) => {
            let Error::Lock { bytes, errno, limit_soft, limit_hard } = &e else { unreachable!() };
            if *bytes != BIG || *limit_soft != LIMIT || *limit_hard != LIMIT || *errno == 0 {
                return child::WRONG_ERROR;
            }
            let msg = e.to_string();
            if !(msg.contains("1048576 bytes") && msg.contains("65536 bytes") && msg.contains("RLIMIT_MEMLOCK")) {
                return child::BAD_MESSAGE;
            }
            if m.stats() != (0, 0, 0) {
                return child::LEAKED_RECORD;
            }
            child::PASS
        }
        Err(_) => child::WRONG_ERROR,
    }
}

#[test]
fn mlock_failure_is_an_error_naming_size_and_limit() {
    let _g = serial();
    // SAFETY: the child only runs `mlock_child` (mmap, mlock, a fresh
    // manager) and leaves with _exit, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(mlock_child).unwrap_or(child::PANIC);
        // SAFETY: _exit in the forked child: no destructors or unwinding run there.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for this test's own child; the status pointer is a live local or null.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "child did not exit normally (status {status:#x})");
    let code = libc::WEXITSTATUS(status);
    let why = match code {
        child::PASS => return,
        child::SKIP_CANNOT_DROP => {
            skip(
                "mlock failure path not tested: cannot drop CAP_IPC_LOCK \
                 (setuid to nobody failed or the capability stayed), so RLIMIT_MEMLOCK is not enforced",
            );
            return;
        }
        child::SETRLIMIT => "setrlimit(RLIMIT_MEMLOCK) failed",
        child::SMALL_ALLOC_FAILED => "a 4 KiB alloc under a 64 KiB limit failed",
        child::BIG_ALLOC_SUCCEEDED => "a 1 MiB alloc above a 64 KiB RLIMIT_MEMLOCK succeeded (not locked?)",
        child::WRONG_ERROR => "the error was not Error::Lock with the size and limits",
        child::BAD_MESSAGE => "the Error::Lock message does not name the size and the limit",
        child::LEAKED_RECORD => "a failed alloc left a record in the manager",
        child::PANIC => "the child panicked",
        _ => "unknown child exit code",
    };
    panic!("mlock failure child: {why} (exit code {code})");
}
