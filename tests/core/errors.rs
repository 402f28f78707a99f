//! Error paths on real files and a real (tiny) file system. Every error is
//! returned (never an abort, never a silent success) and its message names
//! the file, the offset and the errno or reason.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::{Direction, EngineKind, Error, FileTarget, HandleConfig, IoHandle};

#[track_caller]
fn assert_mentions(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "error message lacks {p:?}: {msg}");
    }
}

#[track_caller]
fn transfer_errno(e: &Error) -> i32 {
    match e {
        Error::Transfer(t) => t.errno,
        Error::Many { first, .. } => transfer_errno(first),
        other => panic!("expected a transfer error, got: {other}"),
    }
}

#[test]
fn opening_a_missing_file_names_it_and_the_errno() {
    let dir = TempDir::new("missing");
    let missing = dir.file("does-not-exist.bin");
    let no_dir = dir.path().join("no-such-dir").join("x.bin");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 2);
        let buf = Pinned::new(4096);
        let checks: Vec<(deepnvme::Result<usize>, &Path, &str)> = vec![
            (ds::pread(&h, buf.desc(), FileTarget::Path(&missing), 0, false), &missing, "opening for read"),
            (ds::pread(&h, buf.desc(), FileTarget::Path(&missing), 512, true), &missing, "opening for read"),
            (ds::pwrite(&h, buf.desc(), FileTarget::Path(&no_dir), 0, false), &no_dir, "opening for write"),
        ];
        for (r, path, action) in checks {
            let e = r.unwrap_err();
            assert!(matches!(&e, Error::File { source, .. } if source.raw_os_error() == Some(libc::ENOENT)), "{e}");
            assert_mentions(&e, &[action, &path.display().to_string(), "No such file or directory", "errno 2"]);
        }
        let e = ds::transfer_inline(&h, request(Direction::Read, FileTarget::Path(&missing), 0, buf.desc())).unwrap_err();
        assert_mentions(&e, &[&missing.display().to_string(), "errno 2"]);
        assert_eq!(h.pending_ops(), 0, "a failed open queues nothing");
        assert_eq!(h.wait().unwrap(), 0);
        assert!(!missing.exists(), "a read never creates the file");
    }
}

#[test]
fn reading_past_the_end_is_an_error_naming_the_sizes() {
    let dir = TempDir::new("eof");
    let path = dir.file("f.bin");
    write_file(&path, &pattern(1, 10_000));
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 2);
        for (off, len) in [(0usize, 10_002usize), (9_999, 2), (10_000, 2), (20_000, 4096), (1, 10_000)] {
            let mut buf = vec![0x11u8; len];
            for is_async in [false, true] {
                let e = ds::pread(&h, heap_desc(&mut buf), FileTarget::Path(&path), off as i64, is_async).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                assert_mentions(
                    &e,
                    &[&path.display().to_string(), &format!("{len} bytes"), &format!("offset {off}"), "(10000 bytes)", "past the end"],
                );
            }
            let e = ds::transfer_inline(&h, request(Direction::Read, FileTarget::Path(&path), off as i64, heap_desc(&mut buf))).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(buf.iter().all(|&b| b == 0x11), "a refused read writes nothing");
        }
        // Exactly up to the end is fine.
        let mut buf = vec![0u8; 4000];
        assert_eq!(ds::pread(&h, heap_desc(&mut buf), FileTarget::Path(&path), 6000, false).unwrap(), 1);
        assert_bytes_eq(&buf, &pattern(1, 10_000)[6000..], "read ending at EOF");
        // Overflowing offset + len is refused too, not wrapped.
        let e = ds::pread(&h, heap_desc(&mut buf), FileTarget::Path(&path), i64::MAX - 10, false).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}

#[test]
fn negative_offsets_are_refused() {
    let dir = TempDir::new("negative");
    let path = dir.file("f.bin");
    write_file(&path, &pattern(2, 8192));
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 1);
        let buf = Pinned::new(4096);
        for direction in [Direction::Read, Direction::Write] {
            for off in [-1i64, -4096, i64::MIN] {
                let e = ds::submit(&h, request(direction, FileTarget::Path(&path), off, buf.desc()), false).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                assert_mentions(&e, &[&format!("file_offset {off}"), "negative", &path.display().to_string()]);
                let e = ds::transfer_inline(&h, request(direction, FileTarget::Path(&path), off, buf.desc())).unwrap_err();
                assert_mentions(&e, &[&format!("file_offset {off}"), "negative"]);
            }
        }
        assert_bytes_eq(&read_file(&path), &pattern(2, 8192), "refused writes wrote nothing");
    }
}

#[test]
fn writing_through_a_read_only_descriptor_fails_with_ebadf() {
    let dir = TempDir::new("ebadf");
    let path = dir.file("ro.bin");
    let original = pattern(3, 3 * 4096);
    write_file(&path, &original);
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 1);
        for direct in [false, true] {
            let fd = open_fd(&path, libc::O_RDONLY | if direct { libc::O_DIRECT } else { 0 });
            let src = Pinned::with(&pattern(4, 2 * 4096 + 1));
            // Aligned (all direct when the fd is O_DIRECT) and unaligned
            // (needs a buffered descriptor for the edges).
            for (off, len) in [(4096usize, 4096usize), (1, 2 * 4096), (0, 2 * 4096 + 1)] {
                let what = format!("{engine:?} direct={direct} off={off} len={len}");
                let e = ds::pwrite(&h, src.narrow(0, len), FileTarget::Fd(fd), off as i64, false).unwrap_err();
                assert_eq!(transfer_errno(&e), libc::EBADF, "{what}: {e}");
                assert_mentions(&e, &["write of", &format!("fd {fd}"), "offset", "errno 9", "Bad file descriptor"]);
                let Error::Transfer(t) = &e else { unreachable!() };
                assert!(t.file_offset >= off as u64 && t.file_offset < (off + len) as u64, "{what}: offset {} in the range", t.file_offset);
                assert!(fd_is_open(fd), "{what}: the caller's descriptor stays open after a failure");
            }
            close_fd(fd);
            assert_bytes_eq(&read_file(&path), &original, &format!("{engine:?} direct={direct}: nothing written through a read-only fd"));
        }
        // Reading through a write-only descriptor fails the same way.
        let wfd = open_fd(&path, libc::O_WRONLY);
        let dst = Pinned::new(4096);
        let e = ds::pread(&h, dst.desc(), FileTarget::Fd(wfd), 0, false).unwrap_err();
        assert_eq!(transfer_errno(&e), libc::EBADF, "{e}");
        assert_mentions(&e, &["read of", &format!("fd {wfd}"), "offset 0", "errno 9"]);
        close_fd(wfd);
        // A descriptor that is not open at all.
        let e = ds::pwrite(&h, dst.desc(), FileTarget::Fd(987_654), 0, false).unwrap_err();
        assert_mentions(&e, &["fd 987654", "errno 9"]);
    }
}

#[test]
fn transfer_errors_from_the_kernel_name_file_offset_and_errno() {
    // Reading a directory: open and size check pass, the read itself fails.
    let dir = TempDir::new("eisdir");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 1);
        let size = std::fs::metadata(dir.path()).unwrap().len() as usize;
        assert!(size > 0);
        let buf = Pinned::new(size.min(4096));
        let e = ds::pread(&h, buf.desc(), FileTarget::Path(dir.path()), 0, false).unwrap_err();
        assert_eq!(transfer_errno(&e), libc::EISDIR, "{e}");
        assert_mentions(&e, &["read of", &dir.path().display().to_string(), "offset 0", "errno 21"]);
    }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct TinyFs {
    dir: TempDir,
    mounted: bool,
}

impl TinyFs {
    fn mount(size: &str) -> Result<TinyFs, String> {
        let dir = TempDir::new("tinyfs");
        let target = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let opts = CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: valid C strings.
        let rc = unsafe {
            libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, opts.as_ptr() as *const libc::c_void)
        };
        if rc != 0 {
            return Err(format!("mount -t tmpfs -o size={size} failed: {}", std::io::Error::last_os_error()));
        }
        Ok(TinyFs { dir, mounted: true })
    }
    fn file(&self, name: &str) -> PathBuf {
        self.dir.file(name)
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        if self.mounted {
            let target = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid C string; MNT_DETACH so a stray descriptor cannot keep it mounted.
            let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                use std::io::Write;
                let err = std::io::Error::last_os_error();
                let _ = writeln!(std::io::stderr(), "umount {} failed: {err}", self.dir.path().display());
            }
        }
    }
}

#[test]
fn a_full_file_system_is_enospc_never_a_silent_success() {
    let fs = match TinyFs::mount("64k") {
        Ok(fs) => fs,
        Err(why) => {
            skip(&format!("ENOSPC test not run: {why} (needs CAP_SYS_ADMIN)"));
            return;
        }
    };
    let big = Pinned::with(&pattern(5, 1 << 20));
    let mut heap = pattern(6, (1 << 20) + 3);
    let mut i = 0;
    for engine in engines() {
        for par in [1usize, 2] {
            let h = handle_with(engine, 16 * 1024, 4, false, par == 2, par);
            let cases: Vec<(deepnvme::BufferDesc, i64, &str)> = vec![
                (big.desc(), 0, "pinned aligned"),
                (big.narrow(1, 1 << 19), 1, "pinned unaligned"),
                (heap_desc(&mut heap[..(1 << 20) + 2]), 4096, "bounced"),
            ];
            for (buf, off, what) in cases {
                let path = fs.file(&format!("full-{i}.bin"));
                i += 1;
                let what = format!("{engine:?} p={par} {what}");
                let e = ds::pwrite(&h, buf, FileTarget::Path(&path), off, false).unwrap_err();
                assert_eq!(transfer_errno(&e), libc::ENOSPC, "{what}: {e}");
                assert_mentions(&e, &["write of", &path.display().to_string(), "offset", "errno 28", "No space left on device"]);
                // Async: the failure is reported by wait().
                ds::pwrite(&h, buf, FileTarget::Path(&path), off, true).unwrap();
                let e = h.wait().unwrap_err();
                assert_eq!(transfer_errno(&e), libc::ENOSPC, "{what} (async): {e}");
                // Inline read/write path too.
                let e = ds::transfer_inline(&h, request(Direction::Write, FileTarget::Path(&path), off, buf)).unwrap_err();
                assert_eq!(transfer_errno(&e), libc::ENOSPC, "{what} (inline): {e}");
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    // What fits still works on the same file system.
    let h = handle(engines()[0]);
    let ok = fs.file("fits.bin");
    let small = Pinned::with(&pattern(7, 8192 + 5));
    assert_eq!(ds::pwrite(&h, small.desc(), FileTarget::Path(&ok), 0, false).unwrap(), 1);
    assert_bytes_eq(&read_file(&ok), small.as_slice(), "a write that fits");
}

#[test]
fn one_failing_op_among_many_does_not_stop_the_others() {
    let dir = TempDir::new("mixed");
    let ro_path = dir.file("ro.bin");
    write_file(&ro_path, &pattern(8, 8192));
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        let ro = open_fd(&ro_path, libc::O_RDONLY);
        let a = Pinned::with(&pattern(9, 64 * 1024));
        let b = Pinned::with(&pattern(10, 64 * 1024));
        let bad = Pinned::new(8192);
        let fa = dir.file(&format!("{engine:?}-a.bin"));
        let fb = dir.file(&format!("{engine:?}-b.bin"));
        let mut back = vec![0u8; 8192];

        // good, bad, good, good (a read): one failure.
        ds::pwrite(&h, a.desc(), FileTarget::Path(&fa), 0, true).unwrap();
        ds::pwrite(&h, bad.desc(), FileTarget::Fd(ro), 4096, true).unwrap();
        ds::pwrite(&h, b.desc(), FileTarget::Path(&fb), 0, true).unwrap();
        ds::pread(&h, heap_desc(&mut back), FileTarget::Path(&ro_path), 0, true).unwrap();
        assert_eq!(h.pending_ops(), 4);
        let e = h.wait().unwrap_err();
        assert_eq!(transfer_errno(&e), libc::EBADF, "{e}");
        assert!(matches!(e, Error::Transfer(_)), "one failure is reported as itself: {e}");
        assert_mentions(&e, &[&format!("fd {ro}"), "errno 9"]);
        assert_eq!(h.pending_ops(), 0, "wait() finished every op");
        assert_bytes_eq(&read_file(&fa), a.as_slice(), "op before the failure");
        assert_bytes_eq(&read_file(&fb), b.as_slice(), "op after the failure");
        assert_bytes_eq(&back, &pattern(8, 8192), "bounced read after the failure was copied back");

        // Two failures: the first is shown, the rest counted.
        ds::pwrite(&h, bad.desc(), FileTarget::Fd(ro), 0, true).unwrap();
        ds::pwrite(&h, a.desc(), FileTarget::Path(&fa), 1, true).unwrap();
        ds::pwrite(&h, bad.desc(), FileTarget::Fd(ro), 8192, true).unwrap();
        let e = ds::pwrite(&h, b.desc(), FileTarget::Path(&fb), 3, false).unwrap_err();
        assert!(matches!(&e, Error::Many { more: 1, .. }), "{e}");
        assert_mentions(&e, &["errno 9", "(and 1 more failed ops)", &format!("fd {ro}")]);
        // The first failed op (offset 0, 8192 bytes, two slices) is the one shown.
        let Error::Many { first, .. } = &e else { unreachable!() };
        let Error::Transfer(t) = first.as_ref() else { panic!("{first}") };
        assert!(t.file_offset < 8192, "the first failed op is reported first: {t}");
        assert_eq!(read_file(&fa)[1..], *a.as_slice(), "good op between two failures");
        assert_eq!(read_file(&fb)[3..], *b.as_slice(), "the blocking op itself");

        // The handle still works afterwards.
        assert_eq!(h.wait().unwrap(), 0);
        assert_eq!(ds::pwrite(&h, a.desc(), FileTarget::Path(&fb), 0, false).unwrap(), 1);
        close_fd(ro);
    }
}

#[test]
fn bad_knobs_and_engines_are_refused() {
    for (bs, qd, p) in [(0usize, 1usize, 1usize), (4096, 0, 1), (4096, 1, 0), (4096, 40_000, 1), (4096, 1, 5000)] {
        let cfg = HandleConfig {
            block_size: bs,
            queue_depth: qd,
            intra_op_parallelism: p,
            engine: Some(EngineKind::Psync),
            ..HandleConfig::default()
        };
        match IoHandle::new(cfg) {
            Err(Error::InvalidArgument(_)) => {}
            Err(e) => panic!("bs={bs} qd={qd} p={p}: wrong error {e}"),
            Ok(_) => panic!("bs={bs} qd={qd} p={p}: accepted"),
        }
    }
    assert_eq!(EngineKind::parse("io_uring"), Some(EngineKind::Uring));
    assert_eq!(EngineKind::parse(" PSYNC "), Some(EngineKind::Psync));
    assert_eq!(EngineKind::parse("aio"), None);
}

/// Makes a fifo at `path`.
fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// Runs `body` on a thread and fails the test if it has not returned after
/// `limit`. An open of `fifo` that waits for its other end would hang the
/// thread: the fifo is then opened for reading and writing here, which ends
/// such waits, so the test fails instead of hanging.
fn within(limit: std::time::Duration, fifo: &Path, what: &str, body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(limit) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: its message is the failure.
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            let peer = open_fd(fifo, libc::O_RDWR | libc::O_NONBLOCK);
            let _ = worker.join();
            close_fd(peer);
            panic!("{what}: still waiting after {limit:?} (an open waited for the fifo's other end)");
        }
    }
}

/// A fifo with no peer, named by path: every op (read and write, blocking,
/// async and inline, direct and bounced) fails at once, naming the file,
/// "fifo" and ESPIPE, never waiting for a writer or reader; nothing is
/// queued. With a peer, it is refused the same way: it has no offsets.
#[test]
fn an_op_on_a_fifo_fails_at_once_naming_it() {
    let dir = TempDir::new("fifo");
    let fifo = dir.file("p");
    mkfifo(&fifo);
    for engine in engines() {
        for peer in [false, true] {
            let what = format!("{engine:?}, peer={peer}");
            // A peer that holds both ends open: an op would then not wait, but must still be refused.
            let peer_fd = peer.then(|| open_fd(&fifo, libc::O_RDWR | libc::O_NONBLOCK));
            let path = fifo.clone();
            let label = what.clone();
            within(std::time::Duration::from_secs(20), &fifo, &what, move || {
                let h = handle_with(engine, 4096, 4, false, false, 2);
                let locked = Pinned::new(4096);
                let mut heap = vec![0u8; 4096];
                let target = || FileTarget::Path(&path);
                let mut results: Vec<(&str, deepnvme::Result<usize>)> = vec![
                    ("pread sync", ds::pread(&h, locked.desc(), target(), 0, false)),
                    ("pread async", ds::pread(&h, locked.desc(), target(), 0, true)),
                    ("pwrite sync", ds::pwrite(&h, locked.desc(), target(), 0, false)),
                    ("pwrite async", ds::pwrite(&h, locked.desc(), target(), 0, true)),
                    ("pread bounced", ds::pread(&h, heap_desc(&mut heap), target(), 0, false)),
                    ("pwrite bounced", ds::pwrite(&h, heap_desc(&mut heap), target(), 0, false)),
                    ("read_into", h.read_into(&mut heap, target(), 0)),
                    ("write_from", h.write_from(&heap, target(), 0)),
                ];
                for direction in [Direction::Read, Direction::Write] {
                    let r = ds::transfer_inline(&h, request(direction, target(), 0, locked.desc())).map(|_| 0);
                    results.push((if direction == Direction::Read { "read" } else { "write" }, r));
                }
                for (call, r) in results {
                    let e = r.expect_err(&format!("{label} {call}: an op on a fifo succeeded"));
                    assert!(matches!(e, Error::File { .. }), "{label} {call}: {e}");
                    assert_mentions(&e, &[&path.display().to_string(), "fifo", "errno 29"]);
                }
                assert_eq!(h.pending_ops(), 0, "{label}: a refused op queued nothing");
                assert_eq!(h.wait().unwrap(), 0, "{label}");
            });
            if let Some(fd) = peer_fd {
                let mut byte = 0u8;
                // SAFETY: reads at most one byte into `byte` from our own descriptor.
                let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
                assert!(n < 0, "{what}: a refused write put bytes in the fifo");
                close_fd(fd);
            }
        }
    }
}

/// A pipe given as a caller's descriptor is refused the same way (a write
/// nobody reads would otherwise wait for ever), naming the fd.
#[test]
fn an_op_on_a_pipe_descriptor_is_refused_naming_it() {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 1);
        let buf = Pinned::with(&pattern(5, 4096));
        for (fd, r) in [
            (fds[1], ds::pwrite(&h, buf.desc(), FileTarget::Fd(fds[1]), 0, false)),
            (fds[1], ds::pwrite(&h, buf.desc(), FileTarget::Fd(fds[1]), 0, true)),
            (fds[0], ds::pread(&h, buf.desc(), FileTarget::Fd(fds[0]), 0, false)),
        ] {
            let e = r.unwrap_err();
            assert!(matches!(e, Error::File { .. }), "{engine:?}: {e}");
            assert_mentions(&e, &[&format!("fd {fd}"), "fifo", "errno 29"]);
        }
        assert_eq!(h.wait().unwrap(), 0);
    }
    close_fd(fds[0]);
    close_fd(fds[1]);
}

/// Opening without waiting for a fifo's other end (O_NONBLOCK) also makes
/// an open that must wait for a lease holder fail with EWOULDBLOCK: the op
/// then waits for the lease as a plain open would, and writes everything
/// once the holder lets go (here, this test, 300 ms later).
#[test]
fn a_write_waits_for_a_read_lease_to_be_given_up() {
    let dir = TempDir::new("lease");
    let path = dir.file("leased.bin");
    write_file(&path, &pattern(6, 8192));
    for engine in engines() {
        let holder = open_fd(&path, libc::O_RDONLY);
        // SAFETY: fcntl on our own descriptor. F_SETOWN 0: the lease break
        // sends no SIGIO (which would end this process).
        let leased = unsafe { libc::fcntl(holder, libc::F_SETLEASE, libc::F_RDLCK) } == 0
            && unsafe { libc::fcntl(holder, libc::F_SETOWN, 0) } == 0;
        if !leased {
            skip(&format!("no read lease here ({}): the lease test did not run", std::io::Error::last_os_error()));
            close_fd(holder);
            return;
        }
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: fcntl on the test's descriptor, which it closes after joining this thread.
            unsafe { libc::fcntl(holder, libc::F_SETLEASE, libc::F_UNLCK) };
        });
        let h = handle_with(engine, 4096, 4, false, false, 2);
        let data = pattern(7, 8192);
        let src = Pinned::with(&data);
        let started = std::time::Instant::now();
        let r = ds::pwrite(&h, src.desc(), FileTarget::Path(&path), 0, false);
        let waited = started.elapsed();
        releaser.join().unwrap();
        close_fd(holder);
        assert_eq!(r.unwrap_or_else(|e| panic!("{engine:?}: a write to a leased file failed: {e}")), 1);
        assert!(waited >= std::time::Duration::from_millis(200), "{engine:?}: the write did not wait for the lease ({waited:?})");
        assert_bytes_eq(&read_file(&path), &data, &format!("{engine:?}: the write after the lease"));
    }
}
