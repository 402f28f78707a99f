//! fork() always makes progress, in the parent and in the child, whatever
//! the parent's other threads are doing at the moment of the fork: real
//! fork(2), real io_uring, real mlock, no mocks.
//!
//! * Forks while other threads sit inside every process-wide lock of the
//!   crate (the pinned-memory manager, the bounce pool, the fixed-buffer
//!   registry, handles being made and dropped) and in `wait()` and blocking
//!   calls; every child makes a new handle, locks memory and moves bytes
//!   (locked, bounced, async), and must exit within a deadline; the
//!   parent's ops must all be right.
//! * A fork during a long run over registered memory: the run lets go of
//!   its ring's buffer table after its in-flight requests, so the fork
//!   handler unregisters the buffer and the child shares its pages
//!   copy-on-write instead of getting a private copy of every pinned page.
//!
//! Both tests hold `SERIAL`: each measures (or provokes) the whole process.
//!
//! A binary of its own (not a module of `tests/core/`): it forks a
//! multithreaded process and reads VmPin and the dirty pages of the whole
//! process (see SERIAL above).

use deepnvme::test_support as common;

use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use deepnvme::{EngineKind, FileTarget, HandleConfig, IoHandle, LockedBuffer, PinnedMemoryManager};
use deepnvme::test_support::calls as ds;

const MIB: usize = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A line on stderr past libtest's capture (as `skip` does): the numbers a
/// passing run should still show.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Forks; the child runs `body` and leaves with `_exit(code)` (101 when it
/// panicked), never returning here. Returns the child's pid.
fn fork_child(body: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child runs `body` and ends with `_exit`; the parent goes on.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for child `pid` (polling, so that a hang is a failure and never a
/// hung test): its exit code. Past `timeout` it is killed and the test
/// fails, saying the child hung.
fn wait_child(pid: libc::pid_t, timeout: Duration, what: &str) -> i32 {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: polls our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if rc == pid {
            if libc::WIFEXITED(status) {
                return libc::WEXITSTATUS(status);
            }
            panic!("{what}: child {pid} died of signal {}", libc::WTERMSIG(status));
        }
        assert_eq!(rc, 0, "{what}: waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            // SAFETY: our own child, which we then reap.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{what}: child hung (still running after {timeout:?}; killed)");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---------------------------------------------------------------------------
// 1. Forks while other threads hold the process-wide locks.
// ---------------------------------------------------------------------------

/// What a child's exit code means.
fn child_failure(code: i32) -> &'static str {
    match code {
        10 => "IoHandle::new failed",
        11 => "LockedBuffer::new failed",
        12 => "a locked write failed",
        13 => "a locked read failed",
        14 => "a locked read brought back wrong bytes",
        15 => "a bounced read failed",
        16 => "a bounced read brought back wrong bytes",
        17 => "a bounced write failed",
        18 => "a bounced write left wrong bytes in the file",
        19 => "an async read or its wait() failed",
        20 => "an async read brought back wrong bytes",
        21 => "the child saw its parent's copy helpers (threads it does not have)",
        101 => "the child panicked",
        _ => "unknown exit code",
    }
}

/// The child's work: a new handle, new locked memory, and I/O through the
/// locked, bounced and async paths, every byte checked. Its exit code.
fn child_io(dir: &Path, engine: EngineKind, round: u64) -> i32 {
    // The parent started its copy helpers before any fork: none is here, and
    // a copy must not be handed to them (bounce/copy/helpers.rs).
    if copy_helper_count() != 0 {
        return 21;
    }
    let config = HandleConfig {
        engine: Some(engine),
        intra_op_parallelism: 2,
        queue_depth: 8,
        block_size: 256 * 1024,
        ..HandleConfig::default()
    };
    let Ok(h) = IoHandle::new(config) else { return 10 };
    let len = MIB + 4096;
    let want = pattern(1000 + round, len);
    let path = dir.join(format!("child-{round}.bin"));
    let Ok(mut locked) = LockedBuffer::new(len) else { return 11 };
    locked.copy_from_slice(&want);
    if h.write_from(&locked, FileTarget::Path(&path), 0).is_err() {
        return 12;
    }
    let Ok(mut back) = LockedBuffer::new(len) else { return 11 };
    if h.read_into(&mut back, FileTarget::Path(&path), 0).is_err() {
        return 13;
    }
    if back[..] != want[..] {
        return 14;
    }
    // Plain memory: through the bounce pool.
    let mut plain = vec![0u8; len];
    if h.read_into(&mut plain, FileTarget::Path(&path), 0).is_err() {
        return 15;
    }
    if plain != want {
        return 16;
    }
    let other = pattern(2000 + round, len);
    if h.write_from(&other, FileTarget::Path(&path), 0).is_err() {
        return 17;
    }
    if std::fs::read(&path).ok().as_deref() != Some(&other[..]) {
        return 18;
    }
    // Async, finished by wait().
    back.fill(0);
    let Ok(pending) = h.submit_read(back, FileTarget::Path(&path), 0) else { return 19 };
    if h.wait().is_err() {
        return 19;
    }
    match pending.take() {
        Some(back) if back[..] == other[..] => {}
        _ => return 20,
    }
    drop(h);
    0
}

/// Runs `body` in a loop on a new thread until `stop`; the thread's result
/// is the number of rounds, or the first failure.
fn busy(
    name: &str,
    stop: &Arc<AtomicBool>,
    mut body: impl FnMut(u64) -> Result<(), String> + Send + 'static,
) -> std::thread::JoinHandle<Result<u64, String>> {
    let stop = stop.clone();
    let name = name.to_string();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                body(rounds).map_err(|e| format!("{name}, round {rounds}: {e}"))?;
                rounds += 1;
            }
            Ok(rounds)
        })
        .expect("spawning a busy thread")
}

fn uring_or_psync() -> EngineKind {
    match deepnvme::diag::io_uring_status() {
        Ok(()) => EngineKind::Uring,
        Err(why) => {
            skip(&format!("io_uring is unavailable ({why}): the fork tests run on the psync engine"));
            EngineKind::Psync
        }
    }
}

#[test]
fn forks_while_other_threads_hold_every_process_wide_lock_never_hang_the_child() {
    let _g = serial();
    let engine = uring_or_psync();
    let dir = TempDir::new("fork-locks");
    let stop = Arc::new(AtomicBool::new(false));
    // The busy threads stop when the test does, a failing one included.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_on_drop = StopOnDrop(stop.clone());
    let config = move |parallelism| HandleConfig {
        engine: Some(engine),
        intra_op_parallelism: parallelism,
        queue_depth: 8,
        block_size: 256 * 1024,
        overlap_events: true,
        ..HandleConfig::default()
    };
    let mut threads = Vec::new();

    // The pinned manager's lock: locked memory made and freed all the time.
    threads.push(busy("pinned-churn", &stop, |round| {
        let len = 4096 * (1 + (round as usize * 7919) % 512);
        let mut b = LockedBuffer::new(len).map_err(|e| e.to_string())?;
        b[0] = 1;
        b[len - 1] = 2;
        let p = PinnedMemoryManager::shared().alloc(len).map_err(|e| e.to_string())?;
        if !PinnedMemoryManager::shared().free(p.as_ptr()) {
            return Err("free refused a fresh region".into());
        }
        Ok(())
    }));

    // The bounce pool: plain memory both ways, on a shared handle (its
    // workers' rings register the pool's buffers).
    let bounced = Arc::new(IoHandle::new(config(2)).expect("a handle"));
    for t in 0..2u64 {
        let h = bounced.clone();
        let path = dir.file(&format!("bounced-{t}.bin"));
        let data = pattern(10 + t, 3 * MIB + 512);
        let mut back = vec![0u8; data.len()];
        threads.push(busy(&format!("bounced-{t}"), &stop, move |_| {
            h.write_from(&data, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            back.fill(0);
            h.read_into(&mut back, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            if back != data {
                return Err("a bounced read brought back wrong bytes".into());
            }
            Ok(())
        }));
    }

    // Async ops, the thread parked in wait().
    {
        let h = IoHandle::new(config(2)).expect("a handle");
        let path = dir.file("async.bin");
        let data = pattern(20, 8 * MIB);
        // (The read's size is checked when it is submitted.)
        write_file(&path, &data);
        threads.push(busy("async-wait", &stop, move |_| {
            let mut out = LockedBuffer::new(data.len()).map_err(|e| e.to_string())?;
            out.copy_from_slice(&data);
            let written = h.submit_write(out, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            let back = LockedBuffer::new(data.len()).map_err(|e| e.to_string())?;
            let read = h.submit_read(back, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            if h.wait().map_err(|e| e.to_string())? != 2 {
                return Err("wait() did not finish both ops".into());
            }
            let back = read.take().ok_or("no buffer back from the read")?;
            drop(written.take().ok_or("no buffer back from the write")?);
            if back[..] != data[..] {
                return Err("an async read after an async write brought back wrong bytes".into());
            }
            Ok(())
        }));
    }

    // A blocking call on a large bounced buffer (streamed through bounce
    // windows on the workers), the thread parked in it.
    {
        let h = IoHandle::new(config(2)).expect("a handle");
        let path = dir.file("blocking.bin");
        let data = pattern(30, 40 * MIB);
        write_file(&path, &data);
        let mut back = vec![0u8; data.len()];
        threads.push(busy("blocking-read", &stop, move |_| {
            back.fill(0);
            h.read_into(&mut back, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            if back != data {
                return Err("a blocking bounced read brought back wrong bytes".into());
            }
            Ok(())
        }));
    }

    // Handles made and dropped: the ring and retire-listener registries,
    // rings closing.
    {
        let path = dir.file("churn.bin");
        let data = pattern(40, 512 * 1024);
        threads.push(busy("handle-churn", &stop, move |_| {
            let h = IoHandle::new(config(1)).map_err(|e| e.to_string())?;
            h.write_from(&data, FileTarget::Path(&path), 0).map_err(|e| e.to_string())?;
            Ok(())
        }));
    }

    // Every thread under way before the first fork.
    std::thread::sleep(Duration::from_millis(200));
    let helped_before = copy_helper_bytes();
    let parent_helpers = copy_helper_count();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(parent_helpers > 0, "the copy helpers were not started by the blocking read's copies");
    }
    let forks = 40u64;
    let mut rng = Rng::new(7);
    let mut slowest = Duration::ZERO;
    let mut failure = None;
    for round in 0..forks {
        std::thread::sleep(Duration::from_micros(rng.range(0, 15_000) as u64));
        let child_dir = dir.path().to_path_buf();
        let forked = Instant::now();
        let pid = fork_child(|| child_io(&child_dir, engine, round));
        slowest = slowest.max(forked.elapsed());
        let code = wait_child(pid, Duration::from_secs(20), &format!("fork {round} of {forks}"));
        if code != 0 {
            failure = Some(format!("fork {round}: the child exited with {code}: {}", child_failure(code)));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err("panicked".into()))).collect();
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    for result in &results {
        let rounds = result.as_ref().unwrap_or_else(|e| panic!("a parent thread failed: {e}"));
        assert!(*rounds > 0, "a busy thread never finished a round: {results:?}");
    }
    // The blocking read's window copies were shared with the copy helpers
    // while the forks happened (a child copies alone: bounce/copy/helpers.rs).
    let helped = copy_helper_bytes() - helped_before;
    if parent_helpers > 0 {
        assert!(helped > 0, "no copy helper took a piece of a copy during the forks");
    }
    report(&format!(
        "{forks} forks with busy threads ({engine:?}): slowest fork() {slowest:?}; rounds {results:?}; copy helpers copied {} MiB",
        helped >> 20
    ));
}

// ---------------------------------------------------------------------------
// 2. A fork during a long run over registered memory.
// ---------------------------------------------------------------------------

/// Writes `seed` and each 4 KiB page's index at the start of the page.
fn stamp(buf: &mut [u8], seed: u64) {
    for (i, page) in buf.chunks_mut(4096).enumerate() {
        page[..8].copy_from_slice(&seed.to_le_bytes());
        page[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    }
}

/// The first page whose stamp is not (`seed`, its index).
fn first_bad_stamp(buf: &[u8], seed: u64) -> Option<usize> {
    buf.chunks(4096).enumerate().position(|(i, page)| {
        page[..8] != seed.to_le_bytes() || page[8..16] != (i as u64).to_le_bytes()
    })
}

/// While it holds a pipe's read end, the parent's side of a fork waits (in
/// `hold_parent`) until the child has written its dirty page counts there.
static HOLD_FD: AtomicI32 = AtomicI32::new(-1);
/// What the child wrote: Private_Dirty and Shared_Dirty, in KiB (`u64::MAX`
/// until it did).
static CHILD_PRIVATE_KIB: AtomicU64 = AtomicU64::new(u64::MAX);
static CHILD_SHARED_KIB: AtomicU64 = AtomicU64::new(u64::MAX);

/// Registers `hold_parent` before `main`, so before the crate's own fork
/// handlers: parent handlers run in the order they were registered, so the
/// parent stays held before the crate's parent handler lets its paused runs
/// go on. A run that goes on registers its buffer again, and pinning a page
/// that the child still shares makes the kernel give the parent a copy of
/// it: the child's page then counts as private, though the fork never
/// copied it. Holding the parent makes the child's reading exact.
#[used]
#[link_section = ".init_array"]
static REGISTER_HOLD: extern "C" fn() = register_hold;

extern "C" fn register_hold() {
    // SAFETY: registers a plain function.
    unsafe { libc::pthread_atfork(None, Some(hold_parent), None) };
}

/// The parent's side of a fork: when `HOLD_FD` is set, waits (20 s at most)
/// for the child's line "private shared" and keeps the numbers.
extern "C" fn hold_parent() {
    let fd = HOLD_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    let mut line = [0u8; 64];
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < line.len() && Instant::now() < deadline {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd; then reading into our own buffer.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reads into the unfilled tail of `line`, a live local buffer.
        let n = unsafe { libc::read(fd, line[got..].as_mut_ptr() as *mut libc::c_void, line.len() - got) };
        if n <= 0 {
            break;
        }
        got += n as usize;
        if line[..got].contains(&b'\n') {
            break;
        }
    }
    let text = std::str::from_utf8(&line[..got]).unwrap_or("");
    let mut numbers = text.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(u64::MAX));
    CHILD_PRIVATE_KIB.store(numbers.next().unwrap_or(u64::MAX), Ordering::Release);
    CHILD_SHARED_KIB.store(numbers.next().unwrap_or(u64::MAX), Ordering::Release);
}

/// Forks; the child reports the dirty pages it has of `[addr, addr + len)`
/// before the parent goes on (see `hold_parent`), and exits. Returns what
/// the child saw and how long `fork()` took in the parent (the handlers and
/// the child's reading included).
fn dirty_pages_in_a_child(addr: usize, len: usize) -> (DirtyKib, Duration) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    CHILD_PRIVATE_KIB.store(u64::MAX, Ordering::Release);
    CHILD_SHARED_KIB.store(u64::MAX, Ordering::Release);
    HOLD_FD.store(fds[0], Ordering::Release);
    let started = Instant::now();
    let pid = fork_child(|| {
        let d = dirty_kib_of(addr, len);
        let line = format!("{} {}\n", d.private, d.shared);
        // SAFETY: our bytes to our pipe.
        let n = unsafe { libc::write(fds[1], line.as_ptr() as *const libc::c_void, line.len()) };
        if n == line.len() as isize {
            0
        } else {
            1
        }
    });
    let took = started.elapsed();
    HOLD_FD.store(-1, Ordering::Release);
    // SAFETY: both ends are ours.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert_eq!(wait_child(pid, Duration::from_secs(60), "the smaps child"), 0, "the smaps child failed");
    let (private, shared) = (CHILD_PRIVATE_KIB.load(Ordering::Acquire), CHILD_SHARED_KIB.load(Ordering::Acquire));
    assert!(private != u64::MAX && shared != u64::MAX, "the smaps child never reported its pages");
    (DirtyKib { private: private as usize, shared: shared as usize }, took)
}

#[test]
fn a_fork_during_a_long_run_leaves_no_registered_page_to_copy_into_the_child() {
    let _g = serial();
    if let Err(why) = deepnvme::diag::io_uring_status() {
        skip(&format!("fork during a long run not tested: io_uring is unavailable here: {why}"));
        return;
    }
    if std::env::var("DEEPNVME_FIXED_BUFFERS").as_deref() == Ok("0") {
        skip("fork during a long run not tested: DEEPNVME_FIXED_BUFFERS=0 (nothing is registered)");
        return;
    }
    let mib = 1024;
    let len = mib * MIB;
    let dir = TempDir::new("fork-long");
    let path = dir.file("long.bin");
    let mut buf = LockedBuffer::new(len).expect("locked memory for the long run");
    stamp(&mut buf, 1);
    {
        let fast = IoHandle::new(HandleConfig { engine: Some(EngineKind::Uring), queue_depth: 32, ..HandleConfig::default() })
            .expect("a handle");
        fast.write_from(&buf, FileTarget::Path(&path), 0).expect("writing the file for the long run");
    }
    // Streamed (overlap_events) and batched runs take different paths.
    let mut failures = Vec::new();
    for (mode, overlap_events) in [("stream", true), ("batch", false)] {
        let slow = IoHandle::new(HandleConfig {
            engine: Some(EngineKind::Uring),
            block_size: 64 * 1024,
            queue_depth: 2,
            overlap_events,
            single_submit: false,
            intra_op_parallelism: 1,
        })
        .expect("a handle");
        buf.fill(0);
        let addr = buf.as_ptr() as usize;
        let baseline = vm_pinned_bytes();
        let started = Instant::now();
        let pending = slow.submit_read(buf, FileTarget::Path(&path), 0).expect("the long read");
        // The ring registers the buffer with its first request.
        let registered_by = Instant::now() + Duration::from_secs(10);
        while vm_pinned_bytes() < baseline + len {
            assert!(Instant::now() < registered_by, "{mode}: the long read never registered its buffer (VmPin)");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(100));
        let fork_at = started.elapsed();
        let (dirty, fork_took) = dirty_pages_in_a_child(addr, len);
        let after_fork = Instant::now();
        assert_eq!(slow.wait().expect("the long read across fork()"), 1);
        let run = started.elapsed();
        let waited_after_fork = after_fork.elapsed();
        buf = pending.take().expect("the read buffer back");
        if let Some(page) = first_bad_stamp(&buf, 1) {
            panic!("{mode}: after a fork during the read, page {page} of the buffer holds wrong bytes");
        }
        let numbers = format!(
            "{mode} run of {mib} MiB ({:.2} s; fork at {:.2} s took {:.0} ms, the run went on {:.2} s after it): \
             the child's Private_Dirty {} kB, Shared_Dirty {} kB of the buffer's {} kB",
            run.as_secs_f64(),
            fork_at.as_secs_f64(),
            fork_took.as_secs_f64() * 1e3,
            waited_after_fork.as_secs_f64(),
            dirty.private,
            dirty.shared,
            len / 1024
        );
        report(&numbers);
        if waited_after_fork < Duration::from_millis(50) {
            failures.push(format!(
                "{mode}: the run was over before the fork returned (the disk is too fast for this test's \
                 run): {numbers}"
            ));
        }
        if dirty.private * 1024 >= len / 16 {
            failures.push(format!("{mode}: the child got private copies of the registered buffer's pages: {numbers}"));
        }
        if dirty.shared * 1024 < len / 2 {
            failures.push(format!("{mode}: the child does not share the buffer's pages: {numbers}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// 3. A child that exits normally after its parent's thread ran psync helpers.
// ---------------------------------------------------------------------------

/// A one-shot transfer (`aio_read`/`aio_write`) on the psync engine with a
/// queue of several blocks starts helper threads in the calling thread's
/// engine. A child forked from that thread which then leaves with `exit()`
/// (Python's `sys.exit`) runs the thread's destructors, and so drops an
/// engine whose helpers exist only in the parent: it must not join them
/// (std panics when a thread it joins is gone, which aborts inside a
/// destructor), and must exit 0.
#[test]
fn a_child_leaving_with_exit_after_psync_helpers_ran_exits_cleanly() {
    let _g = serial();
    let dir = TempDir::new("fork-exit");
    let path = dir.file("helpers.bin");
    let config = HandleConfig {
        engine: Some(EngineKind::Psync),
        block_size: 64 * 1024,
        queue_depth: 4,
        ..HandleConfig::default()
    };
    let mut data = pattern(33, 1 << 20);
    for direction in [deepnvme::Direction::Write, deepnvme::Direction::Read] {
        deepnvme::test_support::calls::transfer_once(&config, request(direction, FileTarget::Path(&path), 0, heap_desc(&mut data)))
            .unwrap_or_else(|e| panic!("one-shot {direction:?}: {e}"));
    }
    assert_bytes_eq(&data, &pattern(33, 1 << 20), "one-shot round trip");
    let helpers = thread_names().iter().filter(|comm| comm.starts_with("deepnvme-psync")).count();
    assert!(helpers > 0, "the transfer started no psync helper, so this test would test nothing");
    // SAFETY: the child only calls exit(), which runs this thread's
    // destructors (the point) and the process's atexit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: ends the child as Python's sys.exit() would.
        unsafe { libc::exit(0) };
    }
    let code = wait_child(pid, Duration::from_secs(60), "a child leaving with exit()");
    assert_eq!(code, 0, "the child's exit() did not end cleanly");
}

// ---------------------------------------------------------------------------
// 4. A descendant with its ancestor's pid.
// ---------------------------------------------------------------------------

/// Runs `body` as the first process of a new pid namespace, where
/// `getpid()` is 1 whoever its parent was: its exit code (`body`'s, 101
/// when it panicked, 102 when it is not pid 1), or `None` when this process
/// may not make a pid namespace.
fn in_new_pid_namespace(what: &str, body: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: no memory touched; only this process's later children are
    // put in the new namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL | libc::ENOSPC | libc::EUSERS)) {
            return None;
        }
        panic!("{what}: unshare(CLONE_NEWPID): {e}");
    }
    let pid = fork_child(|| if std::process::id() == 1 { body() } else { 102 });
    Some(wait_child(pid, Duration::from_secs(60), what))
}

/// A handle made in a process with pid 1, used in its child that also has
/// pid 1 (a nested pid namespace): the pid alone says "same process", and
/// a call would wait for worker threads the child does not have. The
/// handle must count the fork, as `threads::StartedIn` does, and refuse.
#[test]
fn a_handle_refuses_in_a_descendant_that_has_its_creators_pid() {
    let _g = serial();
    let engine = uring_or_psync();
    let dir = TempDir::new("fork-same-pid");
    let path = dir.file("same-pid.bin");
    // The outer child makes the namespaces, so this test process keeps its own.
    let outer = fork_child(move || {
        let made_in_pid_1 = in_new_pid_namespace("the handle's creator", move || {
            let h = handle_with(engine, 64 * 1024, 4, false, true, 2);
            let data = pattern(64, 1 << 20);
            let src = Pinned::with(&data);
            if ds::pwrite(&h, src.desc(), FileTarget::Path(&path), 0, false).map_err(|e| e.to_string()) != Ok(1) {
                return 10;
            }
            std::thread::sleep(Duration::from_millis(50)); // the workers go idle before the fork
            let descendant = in_new_pid_namespace("the descendant with pid 1", move || {
                match h.wait() {
                    // Dropping `h` here would join threads that do not exist:
                    // the child leaves with _exit (fork_child) either way.
                    Ok(_) => 20,
                    Err(e) if e.to_string().contains("fork") => 0,
                    Err(_) => 21,
                }
            });
            descendant.unwrap_or(30)
        });
        made_in_pid_1.unwrap_or(40)
    });
    match wait_child(outer, Duration::from_secs(120), "the namespace maker") {
        0 => {}
        40 => skip("no pid namespaces here (unshare(CLONE_NEWPID) refused): the same-pid fork test did not run"),
        30 => panic!("a pid namespace could be made once but not nested: the same-pid fork test did not run"),
        10 => panic!("the handle made in pid 1 could not write"),
        20 => panic!("a handle made in pid 1 answered wait() in its child, also pid 1: forked() compared the pid only"),
        21 => panic!("a handle's refusal in a same-pid child does not say fork"),
        code => panic!("the same-pid fork test failed (exit code {code})"),
    }
}
