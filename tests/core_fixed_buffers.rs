//! io_uring fixed buffers, seen through the kernel: registering memory pins
//! its pages and shows in this process's `VmPin` (`mm->pinned_vm`); a plain
//! O_DIRECT request's pins never do. So these tests read /proc to check that
//! locked and bounce memory is registered once used, let go when freed (with
//! the handle still alive and idle) and when the handle goes, never mixed up
//! with a later allocation at the same address, unregistered around
//! `fork()` (the child shares the pages instead of getting copies; a fork
//! during a run waits for its in-flight requests; a child's own fork leaves
//! the parent's rings alone; a closing ring lets go even while a child
//! holds its descriptor),
//! bounce buffers registered only once the pool keeps them, and that
//! `DEEPNVME_FIXED_BUFFERS=0` (run in a child process) registers nothing.
//!
//! One test function drives them in order: `VmPin` is per process, and
//! libtest would otherwise run them on parallel threads.
//!
//! A binary of its own (not a module of `tests/core/`): it reads VmPin (per
//! process) and forks.

use deepnvme::test_support as common;

use std::time::{Duration, Instant};

use common::*;
use deepnvme::{EngineKind, FileTarget, HandleConfig, IoHandle, LockedBuffer};

const MIB: usize = 1 << 20;

/// Waits up to 5 s for `VmPin` to come down to `at_most`; returns the last reading.
fn vm_pinned_settles_to(at_most: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = vm_pinned_bytes();
        if now <= at_most || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn uring_handle(parallelism: usize) -> IoHandle {
    IoHandle::new(HandleConfig {
        engine: Some(EngineKind::Uring),
        intra_op_parallelism: parallelism,
        queue_depth: 32,
        ..HandleConfig::default()
    })
    .expect("creating an io_uring handle")
}

#[test]
fn registered_memory_follows_the_lifetime_of_what_it_registers() {
    if let Err(why) = deepnvme::diag::io_uring_status() {
        skip(&format!("fixed buffers not tested: io_uring is unavailable here: {why}"));
        return;
    }
    if std::env::var("DEEPNVME_FIXED_BUFFERS").as_deref() == Ok("0") {
        off_switch_child();
        return;
    }
    let dir = TempDir::new("fixed");
    let path = dir.file("data.bin");
    let baseline = vm_pinned_bytes();

    // Locked memory: both workers register the region on first use.
    let handle = uring_handle(2);
    let len = 64 * MIB;
    let mut source = LockedBuffer::new(len).expect("locked buffer");
    source.copy_from_slice(&pattern(1, len));
    handle.write_from(&source, FileTarget::Path(&path), 0).expect("locked write");
    let pinned = vm_pinned_bytes() - baseline;
    assert!(pinned >= len, "a 64 MiB locked write registered only {pinned} bytes (VmPin)");
    let mut back = LockedBuffer::new(len).expect("locked buffer");
    handle.read_into(&mut back, FileTarget::Path(&path), 0).expect("locked read");
    assert_bytes_eq(&back, &source, "locked read through fixed buffers");
    assert_bytes_eq(&read_file(&path), &source, "the file written through fixed buffers");

    // fork(): the kernel would copy pinned pages into the child at once; the
    // fork handler unregisters first, so the child shares the region's pages
    // copy-on-write (Shared_Dirty in its smaps), and the parent registers
    // again on its next run.
    std::thread::sleep(Duration::from_millis(50)); // let the workers go idle
    let child_shares = region_is_shared_with_a_forked_child(source.as_ptr() as usize, len);
    assert!(child_shares, "after fork the child holds a private copy of registered memory (pages pinned at fork)");
    assert!(vm_pinned_bytes() <= baseline, "registrations survived the fork handler: VmPin {}", vm_pinned_bytes());
    back.fill(0);
    handle.read_into(&mut back, FileTarget::Path(&path), 0).expect("locked read after fork");
    assert_bytes_eq(&back, &source, "locked read after fork, registered again");
    assert!(vm_pinned_bytes() >= baseline + len, "no registration after the fork");

    // fork() while a run is in flight: the handler waits for its in-flight
    // requests, never hangs (tests/core_fork.rs measures a long run).
    let pending = handle.submit_write(source, FileTarget::Path(&path), 0).expect("async write");
    // SAFETY: the child only exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: _exit in the forked child: no destructors or unwinding run there.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork during a run failed");
    let mut status = 0;
    // SAFETY: waits for this test's own child; the status pointer is a live local or null.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(handle.wait().expect("wait after a fork during the run"), 1);
    let source = pending.take().expect("the written buffer back");
    assert_bytes_eq(&read_file(&path), &source, "a write in flight across fork()");

    // A child that forks again must leave the parent's rings alone: it
    // inherited their descriptors, and emptying their buffer tables would
    // fail the parent's next fixed request (EFAULT). (Its copies of the
    // tables are empty, and the handler only touches its own process's.)
    handle.read_into(&mut back, FileTarget::Path(&path), 0).expect("read that registers `back`");
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: the child forks once more and exits; nothing else.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child only calls fork, waitpid and _exit, all async-signal-safe.
        let grandchild = unsafe { libc::fork() };
        if grandchild == 0 {
            // SAFETY: _exit in the forked child: no destructors or unwinding run there.
            unsafe { libc::_exit(0) };
        }
        if grandchild > 0 {
            // SAFETY: waits for this test's own child; the status pointer is a live local or null.
            unsafe { libc::waitpid(grandchild, std::ptr::null_mut(), 0) };
        }
        // SAFETY: _exit in the forked child: no destructors or unwinding run there.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork failed");
    // SAFETY: waits for this test's own child; the status pointer is a live local or null.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    back.fill(0);
    handle.read_into(&mut back, FileTarget::Path(&path), 0).expect("the parent's read after a grandchild's fork");
    assert_bytes_eq(&back, &source, "the parent's read after a child forked again");

    // Freed with the handle alive and idle: the workers are told, and let go.
    let old_base = source.as_ptr() as usize;
    drop(source);
    drop(back);
    let left = vm_pinned_settles_to(baseline);
    assert!(left <= baseline, "freed locked memory still pinned by idle rings: VmPin {left} > {baseline}");

    // A new region, likely at the freed one's address: its bytes must be the
    // ones written (a registration found by address would write the old pages).
    let mut reused_address = false;
    for round in 0..4u64 {
        let mut fresh = LockedBuffer::new(len).expect("locked buffer");
        reused_address |= fresh.as_ptr() as usize == old_base;
        let want = pattern(100 + round, len);
        fresh.copy_from_slice(&want);
        handle.write_from(&fresh, FileTarget::Path(&path), 0).expect("write from a reallocated region");
        assert_bytes_eq(&read_file(&path), &want, "a write from memory reallocated at a registered address");
        let mut again = LockedBuffer::new(len).expect("locked buffer");
        handle.read_into(&mut again, FileTarget::Path(&path), 0).expect("read into a reallocated region");
        assert_bytes_eq(&again, &want, "a read into memory reallocated at a registered address");
    }
    if !reused_address {
        skip("no locked region was reallocated at a freed one's address (the checks above still ran)");
    }

    // Bounce buffers (plain memory) are registered once the pool keeps them
    // (not for their first op: a buffer used once would cost a registration
    // per op), and let go with the ring.
    let before_bounce = vm_pinned_settles_to(baseline);
    let mut plain = pattern(7, 8 * MIB);
    handle.write_from(&plain, FileTarget::Path(&path), 0).expect("bounced write");
    assert_eq!(vm_pinned_bytes(), before_bounce, "a new bounce buffer was registered for its first op");
    plain.iter_mut().for_each(|b| *b = 0);
    handle.read_into(&mut plain, FileTarget::Path(&path), 0).expect("bounced read");
    assert_bytes_eq(&plain, &pattern(7, 8 * MIB), "bounced read through fixed buffers");
    assert!(vm_pinned_bytes() > before_bounce, "the pool's bounce buffer was not registered on reuse");
    // A forked child that lives on holds the rings' descriptors (and so the
    // rings): a closing ring must still let go of what it registered.
    // SAFETY: the child only sleeps until it is killed.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: sleep and _exit are async-signal-safe; nothing unwinds.
        unsafe {
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork failed");
    handle.read_into(&mut plain, FileTarget::Path(&path), 0).expect("bounced read after the fork");
    assert!(vm_pinned_bytes() > before_bounce, "no registration after the fork");
    drop(handle);
    let left = vm_pinned_settles_to(baseline);
    // SAFETY: kills and reaps this test's own child; no memory is passed.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
    assert!(left <= baseline, "closed rings kept memory pinned while a child held them: VmPin {left} > {baseline}");
    let left = vm_pinned_settles_to(baseline);
    assert!(left <= baseline, "a dropped handle's rings left memory pinned: VmPin {left} > {baseline}");

    // The switch: the same writes in a child with DEEPNVME_FIXED_BUFFERS=0.
    let me = std::env::current_exe().expect("test binary");
    let status = std::process::Command::new(me)
        .args(["--exact", "registered_memory_follows_the_lifetime_of_what_it_registers", "--nocapture"])
        .env("DEEPNVME_FIXED_BUFFERS", "0")
        .env("CARGO_TARGET_TMPDIR", dir.path())
        .status()
        .expect("running the test binary again");
    assert!(status.success(), "DEEPNVME_FIXED_BUFFERS=0 child failed: {status}");
}

/// Forks; the child reports whether the mapping holding `[addr, addr + len)`
/// is at least `len` bytes of Shared_Dirty pages (shared copy-on-write with
/// the parent) rather than Private_Dirty ones (copied at fork).
fn region_is_shared_with_a_forked_child(addr: usize, len: usize) -> bool {
    // SAFETY: the child only reads /proc and exits with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let shared_kb = dirty_kib_of(addr, len).shared;
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if shared_kb * 1024 >= len { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// In the child: with fixed buffers off, locked and bounced I/O is right and
/// pins nothing beyond the request in flight.
fn off_switch_child() {
    let dir = TempDir::new("fixed-off");
    let path = dir.file("data.bin");
    let baseline = vm_pinned_bytes();
    let handle = uring_handle(2);
    let len = 16 * MIB;
    let mut source = LockedBuffer::new(len).expect("locked buffer");
    source.copy_from_slice(&pattern(3, len));
    handle.write_from(&source, FileTarget::Path(&path), 0).expect("locked write");
    let mut plain = vec![0u8; len];
    handle.read_into(&mut plain, FileTarget::Path(&path), 0).expect("bounced read");
    assert_bytes_eq(&plain, &source, "fixed buffers off: round trip");
    assert_eq!(vm_pinned_bytes(), baseline, "DEEPNVME_FIXED_BUFFERS=0 still registered memory");
}
