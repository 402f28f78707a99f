//! Misuse never corrupts memory and never hangs: a caller's descriptor
//! closed and reused before `wait()`, O_APPEND descriptors, a handle used
//! after fork(), locked memory freed while an op uses it, RLIMIT_FSIZE
//! (EFBIG), thousands of handles, and closed stdout/stderr. Real files
//! (O_DIRECT under the target dir), real io_uring, real mlock.
//!
//! Every test here holds `SERIAL`: the fork tests must not fork while another
//! test thread holds a lock, and the leak checks count the whole process's
//! descriptors, threads and locked memory.
//!
//! A binary of its own (not a module of `tests/core/`): it forks, lowers
//! RLIMIT_FSIZE and counts the whole process's descriptors, threads and
//! locked memory (see SERIAL above).

use deepnvme::test_support as common;

use std::io::Read;
use std::os::fd::FromRawFd;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::OpRequest;
use deepnvme::{
    BufferDesc, Direction, EngineKind, Error, FileTarget, HandleConfig, IoHandle, PinnedMemoryManager,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[track_caller]
fn transfer_errno(e: &Error) -> i32 {
    match e {
        Error::Transfer(t) => t.errno,
        Error::Many { first, .. } => transfer_errno(first),
        other => panic!("expected a transfer error, got: {other}"),
    }
}

fn transfer_offset(e: &Error) -> u64 {
    match e {
        Error::Transfer(t) => t.file_offset,
        Error::Many { first, .. } => transfer_offset(first),
        other => panic!("expected a transfer error, got: {other}"),
    }
}

/// Runs `body` in a forked child that is killed by SIGALRM after
/// `timeout_s` (so a hang is a failure, never a hung test). The child's
/// `Err` message comes back through a pipe; the test fails with it.
fn run_in_child(what: &str, timeout_s: u32, body: impl FnOnce() -> Result<(), String>) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: the child only runs `body` (every test in this file holds
    // SERIAL, so no other test thread holds a lock) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: closes the child's copy of the pipe's read end; alarm
        // touches no memory.
        unsafe {
            libc::close(fds[0]);
            libc::alarm(timeout_s);
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
            let text = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("panicked: {text}"))
        });
        let code = match outcome {
            Ok(()) => 0,
            Err(msg) => {
                // SAFETY: writing our own bytes to our pipe.
                unsafe { libc::write(fds[1], msg.as_ptr() as *const libc::c_void, msg.len()) };
                1
            }
        };
        // SAFETY: _exit in the forked child: no destructors or unwinding run there.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: closes a descriptor this code owns and no longer uses.
    unsafe { libc::close(fds[1]) };
    let mut msg = String::new();
    // SAFETY: we own the read end.
    let _ = unsafe { std::fs::File::from_raw_fd(fds[0]) }.read_to_string(&mut msg);
    let mut status = 0;
    // SAFETY: waits for this test's own child; the status pointer is a live local or null.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        if sig == libc::SIGALRM {
            panic!("{what}: the child hung (killed by SIGALRM after {timeout_s} s)");
        }
        panic!("{what}: the child died of signal {sig}");
    }
    let code = libc::WEXITSTATUS(status);
    assert!(code == 0, "{what}: the child failed (exit {code}): {msg}");
}

/// Makes the handle's only worker busy for a while (a large async write to
/// a scratch file), so an op submitted next has not started when the test
/// changes things under it.
fn keep_worker_busy(h: &IoHandle, dir: &Path, tag: &str, busy: &Pinned) {
    let path = dir.join(format!("busy-{tag}.bin"));
    ds::pwrite(h, busy.desc(), FileTarget::Path(&path), 0, true).unwrap();
}

// ---------------------------------------------------------------------------
// 1. A caller's descriptor closed (and its number reused) before wait().
// ---------------------------------------------------------------------------

#[test]
fn a_caller_fd_closed_and_reused_before_wait_still_writes_the_original_file() {
    let _g = serial();
    let dir = TempDir::new("fd-reuse");
    let busy = Pinned::with(&pattern(1, 32 << 20));
    let len = 256 * 1024;
    for engine in engines() {
        let h = handle_with(engine, 1 << 20, 8, false, false, 1);
        // (file offset, memory offset, length, O_DIRECT): aligned, and with
        // unaligned edges (a buffered twin for the head and tail).
        for (case, (off, mem, n, direct)) in
            [(0usize, 0usize, len, true), (1, 1, len - 3, true), (4096, 0, len, false), (7, 3, len - 11, false)]
                .into_iter()
                .enumerate()
        {
            let what = format!("{engine:?} case {case} off={off} len={n} O_DIRECT={direct}");
            let a = dir.file(&format!("a-{engine:?}-{case}.bin"));
            let b = dir.file(&format!("b-{engine:?}-{case}.bin"));
            let a0 = pattern(10 + case as u64, 2 * len);
            let b0 = pattern(20 + case as u64, 2 * len);
            write_file(&a, &a0);
            write_file(&b, &b0);
            let src = Pinned::with(&pattern(30 + case as u64, len + 8));
            let fd_a = open_fd(&a, libc::O_WRONLY | if direct { libc::O_DIRECT } else { 0 });
            keep_worker_busy(&h, dir.path(), &format!("{engine:?}-{case}"), &busy);
            ds::pwrite(&h, src.narrow(mem, n), FileTarget::Fd(fd_a), off as i64, true).unwrap();
            // The caller closes its fd; the number now names file B.
            let fd_b = open_fd(&b, libc::O_WRONLY | if direct { libc::O_DIRECT } else { 0 });
            // SAFETY: both descriptors are this test's own.
            assert!(unsafe { libc::dup2(fd_b, fd_a) } == fd_a, "dup2");
            close_fd(fd_b);
            assert_eq!(h.wait().unwrap(), 2, "{what}");
            let mut want = a0.clone();
            want[off..off + n].copy_from_slice(&src.as_slice()[mem..mem + n]);
            assert_bytes_eq(&read_file(&a), &want, &format!("{what}: file A has the bytes"));
            assert_bytes_eq(&read_file(&b), &b0, &format!("{what}: file B (now on the old fd number) is untouched"));
            assert!(fd_is_open(fd_a), "{what}: the caller's fd is never closed");
            close_fd(fd_a);
        }
    }
}

#[test]
fn reading_through_a_caller_fd_reused_before_wait_reads_the_original_file() {
    let _g = serial();
    let dir = TempDir::new("fd-reuse-read");
    let busy = Pinned::with(&pattern(2, 32 << 20));
    for engine in engines() {
        let h = handle_with(engine, 1 << 20, 8, false, false, 1);
        let a = dir.file(&format!("a-{engine:?}.bin"));
        let b = dir.file(&format!("b-{engine:?}.bin"));
        write_file(&a, &pattern(40, 128 * 1024));
        write_file(&b, &pattern(41, 128 * 1024));
        let fd_a = open_fd(&a, libc::O_RDONLY | libc::O_DIRECT);
        let dst = Pinned::new(64 * 1024 + 2);
        keep_worker_busy(&h, dir.path(), &format!("r-{engine:?}"), &busy);
        ds::pread(&h, dst.narrow(1, 64 * 1024 + 1), FileTarget::Fd(fd_a), 4097, true).unwrap();
        let fd_b = open_fd(&b, libc::O_RDONLY | libc::O_DIRECT);
        // SAFETY: both descriptors are this test's own.
        assert!(unsafe { libc::dup2(fd_b, fd_a) } == fd_a, "dup2");
        close_fd(fd_b);
        assert_eq!(h.wait().unwrap(), 2);
        assert_bytes_eq(&dst.as_slice()[1..], &pattern(40, 128 * 1024)[4097..4097 + 64 * 1024 + 1], &format!("{engine:?}: read from A"));
        close_fd(fd_a);
    }
}

// ---------------------------------------------------------------------------
// 2. O_APPEND descriptors (DeepSpeed's FastFileWriter).
// ---------------------------------------------------------------------------

#[test]
fn an_o_append_fd_writes_every_piece_at_its_offset() {
    let _g = serial();
    let dir = TempDir::new("append");
    let piece = 64 * 1024;
    let order = [3usize, 0, 5, 2, 1, 4];
    for engine in engines() {
        for direct in [true, false] {
            let what = format!("{engine:?} O_DIRECT={direct}");
            let path = dir.file(&format!("append-{engine:?}-{direct}.bin"));
            let fd = open_fd(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | if direct { libc::O_DIRECT } else { 0 });
            let h = handle_with(engine, 4096, 4, false, true, 4);
            let data = pattern(50, piece * order.len());
            let src = Pinned::with(&data);
            for &i in &order {
                ds::pwrite(&h, src.narrow(i * piece, piece), FileTarget::Fd(fd), (i * piece) as i64, true).unwrap();
            }
            assert_eq!(h.wait().unwrap(), order.len(), "{what}");
            assert_bytes_eq(&read_file(&path), &data, &format!("{what}: explicit offsets on an O_APPEND fd"));
            // Unaligned pieces (buffered edges) too, overwriting in place.
            let data2 = pattern(51, piece * order.len());
            let src2 = Pinned::with(&data2);
            for &i in &order {
                let (off, n) = (i * piece + 1, piece - 4);
                ds::pwrite(&h, src2.narrow(off, n), FileTarget::Fd(fd), off as i64, true).unwrap();
            }
            assert_eq!(h.wait().unwrap(), order.len(), "{what}");
            let mut want = data.clone();
            for &i in &order {
                let r = i * piece + 1..(i + 1) * piece - 3;
                want[r.clone()].copy_from_slice(&data2[r]);
            }
            assert_bytes_eq(&read_file(&path), &want, &format!("{what}: unaligned pieces on an O_APPEND fd"));
            // SAFETY: F_GETFL only reads the flags of a descriptor this code owns.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            assert!(flags & libc::O_APPEND != 0, "{what}: the caller's fd keeps its own flags");
            close_fd(fd);
        }
    }
}

// ---------------------------------------------------------------------------
// 3. fork(): an inherited handle refuses at once; dropping it never hangs.
// ---------------------------------------------------------------------------

fn fork_child_checks(h: IoHandle, dir: &Path, engine: deepnvme::EngineKind) -> Result<(), String> {
    // SAFETY: no arguments, no memory touched.
    let parent = unsafe { libc::getppid() };
    let path = dir.join(format!("child-{engine:?}.bin"));
    let mut heap = vec![7u8; 8192];
    let buf = Pinned::with(&pattern(60, 8192));
    let mut errors: Vec<(String, Error)> = Vec::new();
    let mut expect_err = |call: &str, r: deepnvme::Result<usize>| match r {
        Ok(v) => Err(format!("{call} in the child returned Ok({v}) instead of refusing")),
        Err(e) => {
            errors.push((call.to_string(), e));
            Ok(())
        }
    };
    expect_err("pwrite(async)", ds::pwrite(&h, buf.desc(), FileTarget::Path(&path), 0, true))?;
    expect_err("pread(sync)", ds::pread(&h, buf.desc(), FileTarget::Path(&path), 0, false))?;
    expect_err("wait", h.wait())?;
    expect_err("write_from", h.write_from(&heap, FileTarget::Path(&path), 0))?;
    expect_err("read_into", h.read_into(&mut heap, FileTarget::Path(&path), 0))?;
    expect_err(
        "submit_write",
        h.submit_write(deepnvme::LockedBuffer::new(4096).map_err(|e| e.to_string())?, FileTarget::Path(&path), 0).map(|_| 0),
    )?;
    expect_err(
        "transfer_inline",
        ds::transfer_inline(&h, OpRequest::new(Direction::Write, FileTarget::Path(&path), 0, buf.desc())).map(|_| 0),
    )?;
    for (call, e) in &errors {
        let msg = e.to_string();
        if !(msg.contains("fork") && msg.contains(&format!("process {parent}")) && msg.contains("new handle")) {
            return Err(format!("{call}: the error does not say the handle came from process {parent} before fork: {msg}"));
        }
        if !matches!(e, Error::InvalidArgument(_) | Error::Engine(_)) {
            return Err(format!("{call}: wrong error kind: {e:?}"));
        }
    }
    if path.exists() {
        return Err("a refused call in the child created the file".into());
    }
    // Dropping the inherited handle must not wait for threads that do not
    // exist here.
    drop(h);
    // New handles and new locked memory work in the child.
    let fresh = IoHandle::new(HandleConfig { engine: Some(engine), intra_op_parallelism: 2, ..HandleConfig::default() })
        .map_err(|e| format!("a new handle in the child: {e}"))?;
    let data = pattern(61, 1 << 20);
    let src = Pinned::with(&data);
    ds::pwrite(&fresh, src.desc(), FileTarget::Path(&path), 0, true).map_err(|e| e.to_string())?;
    if fresh.wait().map_err(|e| format!("wait in the child: {e}"))? != 1 {
        return Err("wait in the child did not count the op".into());
    }
    let back = Pinned::new(1 << 20);
    ds::pread(&fresh, back.desc(), FileTarget::Path(&path), 0, false).map_err(|e| e.to_string())?;
    if back.as_slice() != &data[..] {
        return Err("the child's new handle read back different bytes".into());
    }
    Ok(())
}

#[test]
fn a_handle_used_after_fork_refuses_at_once_and_drops_without_hanging() {
    let _g = serial();
    let dir = TempDir::new("fork");
    for engine in engines() {
        let h = handle_with(engine, 64 * 1024, 8, false, true, 2);
        // The parent's handle has run ops (its workers and rings exist, and
        // have registered `src` as an io_uring fixed buffer: 1 MiB is past
        // the inline size, so the op ran on the workers).
        let data = pattern(62, 1 << 20);
        let src = Pinned::with(&data);
        let parent_file = dir.file(&format!("parent-{engine:?}.bin"));
        assert_eq!(ds::pwrite(&h, src.desc(), FileTarget::Path(&parent_file), 0, false).unwrap(), 1);
        // Let the parent's threads go idle before forking: a thread caught
        // inside a lock (parking_lot's parking table, malloc's arenas)
        // leaves that lock held forever in the child, whatever the handle
        // does. (fork() in a multithreaded process is only safe when the
        // other threads are quiescent.)
        std::thread::sleep(Duration::from_millis(100));
        let child_dir = dir.path().to_path_buf();
        let mut h = Some(h);
        let child_h = &mut h;
        // The child takes the handle out of its own copy of `h`.
        run_in_child(&format!("{engine:?} fork"), 20, move || fork_child_checks(child_h.take().unwrap(), &child_dir, engine));
        // The parent's handle is untouched by the child.
        let h = h.take().unwrap();
        let data2 = pattern(63, 1 << 20);
        let src2 = Pinned::with(&data2);
        ds::pwrite(&h, src2.desc(), FileTarget::Path(&parent_file), 0, true).unwrap();
        assert_eq!(h.wait().unwrap(), 1);
        assert_bytes_eq(&read_file(&parent_file), &data2, &format!("{engine:?}: parent handle after the child"));
        // Memory registered before the fork still gets the parent's reads:
        // the kernel gave the child copies of the pinned pages and kept the
        // originals (which the rings hold) mapped in the parent.
        assert_eq!(ds::pread(&h, src.desc(), FileTarget::Path(&parent_file), 0, false).unwrap(), 1);
        assert_bytes_eq(src.as_slice(), &data2, &format!("{engine:?}: a read after fork into memory registered before it"));
    }
}

// ---------------------------------------------------------------------------
// 5. Freeing locked memory while an async op uses it.
// ---------------------------------------------------------------------------

/// Whether some mapping of this process contains `addr`.
fn is_mapped(addr: usize) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines().any(|l| {
        let range = l.split_whitespace().next().unwrap_or("");
        let mut it = range.split('-');
        let lo = usize::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        let hi = usize::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        lo <= addr && addr < hi
    })
}

#[test]
fn freeing_locked_memory_under_an_async_op_defers_the_unmap() {
    let _g = serial();
    let dir = TempDir::new("free-in-flight");
    let n = 4 << 20;
    let path = dir.file("src.bin");
    write_file(&path, &pattern(70, n));
    let m = PinnedMemoryManager::shared();
    let busy = Pinned::with(&pattern(71, 32 << 20));
    for engine in engines() {
        let h = handle_with(engine, 1 << 20, 8, false, false, 1);
        let base_locked = vm_locked_bytes();
        let old = m.alloc(n).unwrap().as_ptr();
        keep_worker_busy(&h, dir.path(), &format!("{engine:?}"), &busy);
        // SAFETY: the op may write into [old, old + n) until wait().
        let desc = unsafe { BufferDesc::from_raw_parts(old, n) };
        ds::pread(&h, desc, FileTarget::Path(&path), 0, true).unwrap();
        assert!(m.free(old), "{engine:?}: free of a region with an op in flight is accepted");
        assert!(!m.is_managed(old, n), "{engine:?}: a freed region is no longer managed for new ops");
        assert!(!m.free(old), "{engine:?}: the second free is refused");
        assert!(is_mapped(old as usize), "{engine:?}: the region stays mapped while the op is in flight");
        let new = m.alloc(n).unwrap().as_ptr();
        assert_ne!(new, old, "{engine:?}: the address of a region in use is not handed out again");
        assert_eq!(vm_locked_bytes(), base_locked + 2 * n, "{engine:?}: both regions locked meanwhile");
        assert_eq!(h.wait().unwrap(), 2, "{engine:?}");
        assert!(!is_mapped(old as usize), "{engine:?}: the last op unmapped the freed region");
        assert_eq!(vm_locked_bytes(), base_locked + n, "{engine:?}: and unlocked it");
        // SAFETY: `new` is ours, n bytes.
        let fresh = unsafe { std::slice::from_raw_parts(new, n) };
        assert!(fresh.iter().all(|&b| b == 0), "{engine:?}: the read never landed in the new allocation");
        assert!(m.free(new));
        assert_eq!(vm_locked_bytes(), base_locked);
    }
}

#[test]
fn freeing_locked_memory_under_a_write_keeps_the_written_bytes() {
    let _g = serial();
    let dir = TempDir::new("free-in-flight-w");
    let n = 1 << 20;
    let m = PinnedMemoryManager::shared();
    let busy = Pinned::with(&pattern(72, 32 << 20));
    for engine in engines() {
        let h = handle_with(engine, 1 << 20, 8, false, false, 1);
        let data = pattern(73, n);
        let p = m.alloc(n).unwrap().as_ptr();
        // SAFETY: n bytes of our region.
        unsafe { std::slice::from_raw_parts_mut(p, n) }.copy_from_slice(&data);
        keep_worker_busy(&h, dir.path(), &format!("{engine:?}"), &busy);
        let path = dir.file(&format!("w-{engine:?}.bin"));
        // SAFETY: the memory outlives every op on this desc (each is waited for here).
        ds::pwrite(&h, unsafe { BufferDesc::from_raw_parts(p, n) }, FileTarget::Path(&path), 0, true).unwrap();
        assert!(m.free(p));
        // Reuse pressure: allocations of the same size while the op waits.
        let others: Vec<_> = (0..4).map(|_| m.alloc(n).unwrap().as_ptr()).collect();
        for &o in &others {
            assert_ne!(o, p);
            // SAFETY: writes inside this test's own live mapping, owned by this thread.
            unsafe { std::ptr::write_bytes(o, 0xEE, n) };
        }
        assert_eq!(h.wait().unwrap(), 2);
        assert_bytes_eq(&read_file(&path), &data, &format!("{engine:?}: the write took the bytes of the freed region"));
        for o in others {
            assert!(m.free(o));
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Faults: EFBIG through RLIMIT_FSIZE; thousands of handles.
// ---------------------------------------------------------------------------

fn efbig_child(dir: &Path) -> Result<(), String> {
    const LIMIT: u64 = 1 << 20;
    // SAFETY: this child's own signal disposition and limit; `r` is live.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let r = libc::rlimit { rlim_cur: LIMIT as libc::rlim_t, rlim_max: libc::RLIM_INFINITY };
        if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
            return Err(format!("setrlimit(RLIMIT_FSIZE): {}", std::io::Error::last_os_error()));
        }
    }
    let len = 4 << 20;
    let pinned = Pinned::with(&pattern(80, len + 1));
    let mut heap = pattern(81, len);
    let mut i = 0;
    for engine in engines() {
        for par in [1usize, 2] {
            let h = handle_with(engine, 256 * 1024, 8, false, par == 2, par);
            for (what, desc, off) in [
                ("pinned", pinned.narrow(0, len), 0i64),
                ("pinned unaligned", pinned.narrow(1, len), 1),
                ("bounced", heap_desc(&mut heap), 4096),
            ] {
                for mode in ["sync", "async", "inline"] {
                    i += 1;
                    let path = dir.join(format!("efbig-{i}.bin"));
                    let what = format!("{engine:?} p={par} {what} {mode}");
                    let r = match mode {
                        "sync" => ds::pwrite(&h, desc, FileTarget::Path(&path), off, false),
                        "async" => ds::pwrite(&h, desc, FileTarget::Path(&path), off, true).and_then(|_| h.wait()),
                        _ => ds::transfer_inline(&h, OpRequest::new(Direction::Write, FileTarget::Path(&path), off, desc)).map(|_| 1),
                    };
                    let e = match r {
                        Ok(n) => return Err(format!("{what}: a 4 MiB write under a 1 MiB RLIMIT_FSIZE returned Ok({n})")),
                        Err(e) => e,
                    };
                    let msg = e.to_string();
                    if transfer_errno(&e) != libc::EFBIG || !msg.contains("errno 27") {
                        return Err(format!("{what}: not EFBIG: {msg}"));
                    }
                    if transfer_offset(&e) < LIMIT {
                        return Err(format!("{what}: the failing offset is below the limit: {msg}"));
                    }
                    if !msg.contains(&path.display().to_string()) {
                        return Err(format!("{what}: the error does not name the file: {msg}"));
                    }
                    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                    if size > LIMIT {
                        return Err(format!("{what}: the file grew past the limit ({size} bytes)"));
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn a_file_size_limit_is_efbig_naming_file_and_offset() {
    let _g = serial();
    let dir = TempDir::new("efbig");
    let d = dir.path().to_path_buf();
    run_in_child("RLIMIT_FSIZE", 30, move || efbig_child(&d));
}

fn deepnvme_threads() -> usize {
    thread_names().iter().filter(|comm| comm.starts_with("deepnvme")).count()
}

/// Each deepnvme thread's name, state and kernel wait channel (for a
/// failure message: a thread stuck in exit shows where).
fn deepnvme_thread_states() -> String {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").filter_map(|e| e.ok()) {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).unwrap_or_default();
        let comm = read("comm");
        if comm.starts_with("deepnvme") {
            let state = read("stat").rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("?").to_string();
            out.push(format!("{} {} wchan={}", comm.trim(), state, read("wchan").trim()));
        }
    }
    out.join("; ")
}


/// The descriptors that are io_uring rings.
fn io_uring_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("io_uring"))
        .count()
}

/// A handle's rings (one per worker, one for the ops that run on the
/// calling thread) are made when `new` returns, so what a new handle holds
/// is fixed at once (a caller counting descriptors or forking right after
/// `new` sees every ring, and its ops add none), and dropping it closes them.
#[test]
fn a_new_handle_holds_its_worker_rings_when_new_returns() {
    let _g = serial();
    if !engines().contains(&EngineKind::Uring) {
        return;
    }
    drop(handle_with(EngineKind::Uring, 4096, 4, false, false, 1)); // process-wide probes, once
    for round in 0..20 {
        for par in [1usize, 2, 4] {
            let before = io_uring_fds();
            let h = handle_with(EngineKind::Uring, 4096, 8, false, false, par);
            assert_eq!(io_uring_fds(), before + par + 1, "round {round}: rings right after new() with {par} workers");
            if round == 0 {
                let dir = TempDir::new("rings");
                let path = dir.file("f.bin");
                let data = pattern(7, 64 << 10);
                for bytes in [4096usize, 64 << 10] {
                    h.write_from(&data[..bytes], FileTarget::Path(&path), 0).unwrap();
                    let mut back = vec![0u8; bytes];
                    h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
                    assert_bytes_eq(&back, &data[..bytes], "read back");
                }
                assert_eq!(io_uring_fds(), before + par + 1, "rings after blocking ops with {par} workers");
            }
            drop(h);
            assert_eq!(io_uring_fds(), before, "round {round}: rings after the handle with {par} workers dropped");
        }
    }
}

#[test]
fn thousands_of_handles_leak_no_fds_threads_or_locked_memory() {
    let _g = serial();
    let dir = TempDir::new("many-handles");
    let engines = engines();
    let path = dir.file("f.bin");
    write_file(&path, &pattern(90, 64 * 1024));
    let src = Pinned::with(&pattern(91, 8192));
    // One round first, so lazily made process-wide state (engine probe,
    // log keys) is not counted as a leak.
    for &e in &engines {
        drop(handle_with(e, 4096, 4, false, false, 2));
    }
    // The last test's joined threads may still be listed for a moment
    // (see below): the baseline is the count once it stops falling.
    let mut ours = deepnvme_threads();
    let settle = std::time::Instant::now();
    while settle.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        let now = deepnvme_threads();
        if now == ours {
            break;
        }
        ours = now;
    }
    let (fds, threads, locked) = (open_fd_count(), threads_but_io_uring_workers(), vm_locked_bytes());
    let start = std::time::Instant::now();
    for i in 0..2000usize {
        let engine = engines[i % engines.len()];
        let par = 1 + i % 2;
        let h = handle_with(engine, 4096, 1 + i % 8, i % 3 == 0, i % 5 == 0, par);
        match i % 10 {
            0 => {
                ds::pwrite(&h, src.desc(), FileTarget::Path(&path), (i % 8 * 4096) as i64, true).unwrap();
                if i % 20 == 0 {
                    h.wait().unwrap();
                } // else: dropped with the op in flight
            }
            1 => {
                let mut back = vec![0u8; 4096];
                h.read_into(&mut back, FileTarget::Path(&path), 1).unwrap();
            }
            _ => {}
        }
        drop(h);
    }
    assert!(start.elapsed() < Duration::from_secs(60), "2000 handles took {:?}", start.elapsed());
    assert_eq!(open_fd_count(), fds, "open descriptors after 2000 handles");
    // A joined thread can still be listed in /proc for a moment after its
    // join returned (it is unhashed after it wakes the joiner): give the
    // last ones a moment to go; a leaked thread never does.
    let settle = std::time::Instant::now();
    while deepnvme_threads() != ours && settle.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(deepnvme_threads(), ours, "deepnvme threads after 2000 handles: {}", deepnvme_thread_states());
    // Other test threads waiting on SERIAL may come and go.
    assert!(threads_but_io_uring_workers() <= threads + 4, "threads after 2000 handles: {} (was {threads})", threads_but_io_uring_workers());
    assert_eq!(vm_locked_bytes(), locked, "locked bytes after 2000 handles");
}

// ---------------------------------------------------------------------------
// 7. Logging with stdout and stderr closed.
// ---------------------------------------------------------------------------

fn closed_streams_child(dir: &Path) -> Result<(), String> {
    let engines = engines();
    let mut fds = Vec::new();
    for engine in &engines {
        let b = dir.join(format!("closed-fd-{engine:?}.bin"));
        write_file(&b, &vec![0u8; 70_000]);
        fds.push(open_fd(&b, libc::O_WRONLY));
    }
    // SAFETY: closes this child's stdout and stderr, which is the test.
    unsafe {
        libc::close(1);
        libc::close(2);
    }
    let data = pattern(100, 64 * 1024 + 3);
    let src = Pinned::with(&data);
    for (engine, fd) in engines.into_iter().zip(fds) {
        let h = handle_with(engine, 4096, 4, false, false, 1);
        let a = dir.join(format!("closed-path-{engine:?}.bin"));
        let b = dir.join(format!("closed-fd-{engine:?}.bin"));
        // `validate = true` prints a Pass line on stdout (now closed); the
        // descriptors the op opens would land on the free numbers 1 and 2.
        for (target, off) in [(FileTarget::Path(&a), 1usize), (FileTarget::Fd(fd), 5)] {
            let mut req = OpRequest::new(Direction::Write, target, off as i64, src.desc());
            req.validate = true;
            ds::submit(&h, req, true).map_err(|e| format!("{engine:?} submit: {e}"))?;
            h.wait().map_err(|e| format!("{engine:?} wait: {e}"))?;
            let mut req = OpRequest::new(Direction::Write, target, off as i64, src.desc());
            req.validate = true;
            ds::transfer_inline(&h, req).map_err(|e| format!("{engine:?} inline: {e}"))?;
        }
        close_fd(fd);
        let got = read_file(&a);
        if got.len() != 1 + data.len() || got[1..] != data[..] {
            return Err(format!("{engine:?}: the path target does not hold exactly the bytes written"));
        }
        let mut want = vec![0u8; 70_000];
        want[5..5 + data.len()].copy_from_slice(&data);
        if read_file(&b) != want {
            return Err(format!("{engine:?}: the fd target does not hold exactly the bytes written (a log line landed in it?)"));
        }
    }
    Ok(())
}

#[test]
fn ops_succeed_with_stdout_and_stderr_closed() {
    let _g = serial();
    let dir = TempDir::new("closed-streams");
    let d = dir.path().to_path_buf();
    run_in_child("closed stdout/stderr", 20, move || closed_streams_child(&d));
}

/// An empty tensor has no data pointer (null): its ops make no slice from
/// it (a debug build checks the precondition of every unsafe slice) and
/// return what DeepSpeed's do: 0 for an async submit, then 1 from wait();
/// 1 from a blocking call (the op it finished).
#[test]
fn an_empty_buffer_with_a_null_pointer_moves_nothing_and_counts_as_one_op() {
    let _g = serial();
    let dir = TempDir::new("empty");
    let path = dir.file("e.bin");
    write_file(&path, &pattern(3, 4096));
    for engine in engines() {
        for parallelism in [1, 2] {
            let h = handle_with(engine, 1 << 20, 8, false, true, parallelism);
            // SAFETY: zero bytes at null: nothing is ever read or written.
            let empty = || unsafe { deepnvme::BufferDesc::from_raw_parts(std::ptr::null_mut(), 0) };
            for direction in [Direction::Read, Direction::Write] {
                let req = || request(direction, FileTarget::Path(&path), 0, empty());
                assert_eq!(ds::submit(&h, req(), false).unwrap(), 1, "{engine:?} {direction:?} blocking");
                assert_eq!(ds::submit(&h, req(), true).unwrap(), 0, "{engine:?} {direction:?} async");
                assert_eq!(h.wait().unwrap(), 1, "{engine:?} {direction:?} wait");
                ds::transfer_inline(&h, req()).unwrap();
                let pinned = empty().pinned(true);
                assert_eq!(ds::submit(&h, request(direction, FileTarget::Path(&path), 0, pinned), false).unwrap(), 1);
            }
            assert_bytes_eq(&read_file(&path), &pattern(3, 4096), "the file after empty ops");
        }
    }
}
