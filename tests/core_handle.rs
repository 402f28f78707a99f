//! Handle semantics on real files: op counts of sync/async/wait, caller
//! descriptors (never closed), descriptors the handle opens (always closed),
//! dropping a handle with ops in flight, the inline path, blocking calls
//! from several threads, and `validate=True` output (in a child process).
//!
//! The descriptor-counting tests need a quiet descriptor table, so every
//! test in this file holds `SERIAL`.
//!
//! A binary of its own (not a module of `tests/core/`): it counts this
//! process's open descriptors (/proc/self/fd) around handles, so no test of
//! another file may open or close any meanwhile.

use deepnvme::test_support as common;

use std::sync::Mutex;

use common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::OpRequest;
use deepnvme::{Direction, EngineKind, FileTarget};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn sync_async_and_wait_counts() {
    let _g = serial();
    let dir = TempDir::new("counts");
    for engine in engines() {
        for par in [1usize, 2] {
            let h = handle_with(engine, 8192, 4, false, false, par);
            let bufs: Vec<Pinned> = (0..4).map(|i| Pinned::with(&pattern(i, 40_000))).collect();
            let f = |i: usize| dir.file(&format!("{engine:?}-{par}-{i}.bin"));

            assert_eq!(h.wait().unwrap(), 0, "wait with nothing pending returns 0");
            assert_eq!(h.wait().unwrap(), 0, "and again");

            // A queue of two async ops.
            assert_eq!(ds::pwrite(&h, bufs[0].desc(), FileTarget::Path(&f(0)), 0, true).unwrap(), 0, "async returns 0");
            assert_eq!(ds::pwrite(&h, bufs[1].desc(), FileTarget::Path(&f(1)), 0, true).unwrap(), 0);
            assert_eq!(h.pending_ops(), 2);
            assert_eq!(h.wait().unwrap(), 2);
            assert_eq!(h.pending_ops(), 0);
            assert_eq!(h.wait().unwrap(), 0);

            // A queue of three, mixing reads and writes.
            let r0 = Pinned::new(40_000);
            let r1 = Pinned::new(40_000);
            assert_eq!(ds::pread(&h, r0.desc(), FileTarget::Path(&f(0)), 0, true).unwrap(), 0);
            assert_eq!(ds::pwrite(&h, bufs[2].desc(), FileTarget::Path(&f(2)), 0, true).unwrap(), 0);
            assert_eq!(ds::pread(&h, r1.desc(), FileTarget::Path(&f(1)), 0, true).unwrap(), 0);
            assert_eq!(h.wait().unwrap(), 3);
            assert_bytes_eq(r0.as_slice(), bufs[0].as_slice(), "queued read 0");
            assert_bytes_eq(r1.as_slice(), bufs[1].as_slice(), "queued read 1");
            assert_bytes_eq(&read_file(&f(2)), bufs[2].as_slice(), "queued write 2");

            // A blocking call counts the async ops submitted before it.
            ds::pwrite(&h, bufs[3].desc(), FileTarget::Path(&f(3)), 0, true).unwrap();
            ds::pwrite(&h, bufs[0].desc(), FileTarget::Path(&f(3)), 40_000, true).unwrap();
            let n = ds::pwrite(&h, bufs[1].desc(), FileTarget::Path(&f(3)), 80_000, false).unwrap();
            assert_eq!(n, 3, "sync returns every op it completed, earlier async ones included");
            assert_eq!(h.wait().unwrap(), 0, "nothing left after a blocking call");
            let want: Vec<u8> = [&bufs[3], &bufs[0], &bufs[1]].iter().flat_map(|b| b.as_slice().to_vec()).collect();
            assert_bytes_eq(&read_file(&f(3)), &want, "three writes into one file");

            // submit() with is_async, as pread(..., async=True) does.
            let f3 = f(3);
            let req = request(Direction::Read, FileTarget::Path(&f3), 40_000, r0.desc());
            assert_eq!(ds::submit(&h, req, true).unwrap(), 0);
            assert_eq!(ds::submit(&h, request(Direction::Read, FileTarget::Path(&f(3)), 80_000, r1.desc()), false).unwrap(), 2);
            assert_bytes_eq(r0.as_slice(), bufs[0].as_slice(), "submit async read");
            assert_bytes_eq(r1.as_slice(), bufs[1].as_slice(), "submit sync read");
        }
    }
}

#[test]
fn caller_descriptors_are_used_and_never_closed() {
    let _g = serial();
    let dir = TempDir::new("fd");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        for direct in [false, true] {
            let path = dir.file(&format!("{engine:?}-{direct}.bin"));
            let flags = libc::O_WRONLY | libc::O_CREAT | if direct { libc::O_DIRECT } else { 0 };
            let wfd = open_fd(&path, flags);
            let a = Pinned::with(&pattern(1, 8192));
            let b = Pinned::with(&pattern(2, 1002)); // unaligned: needs the buffered twin
            assert_eq!(ds::pwrite(&h, a.desc(), FileTarget::Fd(wfd), 0, true).unwrap(), 0);
            assert_eq!(ds::pwrite(&h, b.desc(), FileTarget::Fd(wfd), 8193, true).unwrap(), 0);
            assert_eq!(h.wait().unwrap(), 2);
            assert!(fd_is_open(wfd), "the handle closed a caller's descriptor (direct={direct})");
            // The caller can keep using it ...
            let c = Pinned::with(&pattern(3, 4096));
            assert_eq!(ds::pwrite(&h, c.desc(), FileTarget::Fd(wfd), 16384, false).unwrap(), 1);
            ds::transfer_inline(&h, request(Direction::Write, FileTarget::Fd(wfd), 20480, a.narrow(0, 4096))).unwrap();
            assert!(fd_is_open(wfd));
            // ... and close it itself.
            close_fd(wfd);
            let mut want = vec![0u8; 20480 + 4096];
            want[..8192].copy_from_slice(a.as_slice());
            want[8193..8193 + 1002].copy_from_slice(b.as_slice());
            want[16384..20480].copy_from_slice(c.as_slice());
            want[20480..].copy_from_slice(&a.as_slice()[..4096]);
            assert_bytes_eq(&read_file(&path), &want, &format!("{engine:?} writes through a caller fd"));

            // Reads through a caller descriptor.
            let rfd = open_fd(&path, libc::O_RDONLY | if direct { libc::O_DIRECT } else { 0 });
            let r = Pinned::new(want.len() - 1);
            assert_eq!(ds::pread(&h, r.narrow(0, 12_000), FileTarget::Fd(rfd), 1, false).unwrap(), 1);
            assert_bytes_eq(&r.as_slice()[..12_000], &want[1..12_001], "read through a caller fd");
            assert!(fd_is_open(rfd));
            close_fd(rfd);
        }
    }
}

#[test]
fn the_handle_closes_every_descriptor_it_opens() {
    let _g = serial();
    let dir = TempDir::new("fdleak");
    let base = open_fd_count();
    for engine in engines() {
        {
            let h = handle_with(engine, 4096, 8, false, false, 2);
            let data = Pinned::with(&pattern(4, 3 * 4096 + 2));
            let path = dir.file("f.bin");
            // Warm up: the inline engine and each worker's engine (io_uring
            // fds) are created lazily, the workers' on their own threads.
            ds::transfer_inline(&h, request(Direction::Write, FileTarget::Path(&path), 0, data.desc())).unwrap();
            ds::pwrite(&h, data.desc(), FileTarget::Path(&path), 0, false).unwrap();
            let with_handle = open_fd_count();
            let mut heap = vec![0u8; 5000];
            for i in 0..60usize {
                let off = (i * 4097) as i64;
                // Aligned (direct only) and unaligned (direct + buffered twin)
                // writes and reads, async and sync, pinned and bounced.
                ds::pwrite(&h, data.desc(), FileTarget::Path(&path), off, i % 2 == 0).unwrap();
                ds::pread(&h, data.narrow(0, 4096), FileTarget::Path(&path), 4096, i % 3 == 0).unwrap();
                ds::pread(&h, heap_desc(&mut heap), FileTarget::Path(&path), off + 1, true).unwrap();
                ds::transfer_inline(&h, request(Direction::Read, FileTarget::Path(&path), off, data.narrow(2, 1000))).unwrap();
                // Failing ops close what they opened too.
                assert!(ds::pread(&h, data.desc(), FileTarget::Path(&dir.file("missing")), 0, false).is_err());
                assert!(ds::pread(&h, data.desc(), FileTarget::Path(&path), off + (1 << 30), true).is_err());
                assert!(ds::pwrite(&h, data.desc(), FileTarget::Path(&path), -1, true).is_err());
                if i % 10 == 9 {
                    h.wait().unwrap();
                    assert_eq!(open_fd_count(), with_handle, "descriptors leaked after {} rounds ({engine:?})", i + 1);
                }
            }
            h.wait().unwrap();
            assert_eq!(open_fd_count(), with_handle, "descriptors leaked ({engine:?})");
        }
        assert_eq!(open_fd_count(), base, "dropping the handle closes its rings ({engine:?})");
    }
}

#[test]
fn dropping_a_handle_finishes_ops_in_flight() {
    let _g = serial();
    let dir = TempDir::new("drop");
    for engine in engines() {
        let path_w = dir.file(&format!("{engine:?}-w.bin"));
        let path_r = dir.file(&format!("{engine:?}-r.bin"));
        let len = 4 << 20;
        let data = Pinned::with(&pattern(6, len));
        write_file(&path_r, &pattern(7, len + 3));
        let mut heap = vec![0u8; len];
        let fds = open_fd_count();
        {
            // Small blocks at depth 1: the ops are still running at drop.
            let h = handle_with(engine, 4096, 1, true, false, 2);
            ds::pwrite(&h, data.desc(), FileTarget::Path(&path_w), 0, true).unwrap();
            ds::pwrite(&h, data.desc(), FileTarget::Path(&path_w), len as i64 + 1, true).unwrap();
            ds::pread(&h, heap_desc(&mut heap), FileTarget::Path(&path_r), 3, true).unwrap();
            assert_eq!(h.pending_ops(), 3);
        }
        let file = read_file(&path_w);
        assert_eq!(file.len(), 2 * len + 1);
        assert_bytes_eq(&file[..len], data.as_slice(), &format!("{engine:?}: first write finished by drop"));
        assert_bytes_eq(&file[len + 1..], data.as_slice(), &format!("{engine:?}: second write finished by drop"));
        assert_bytes_eq(&heap, &pattern(7, len + 3)[3..], &format!("{engine:?}: bounced read copied back by drop"));
        assert_eq!(open_fd_count(), fds, "drop closed the op descriptors and the rings");
    }
}

#[test]
fn inline_transfers_do_not_touch_the_queue() {
    let _g = serial();
    let dir = TempDir::new("inline");
    for engine in engines() {
        let h = handle_with(engine, 1000, 3, false, true, 4);
        let p = dir.file("f.bin");
        let a = Pinned::with(&pattern(8, 64 * 1024));
        ds::pwrite(&h, a.desc(), FileTarget::Path(&p), 0, true).unwrap();
        let b = Pinned::with(&pattern(9, 777));
        // Inline read/write run on this thread, unsplit (777 is not divisible by 4).
        ds::transfer_inline(&h, request(Direction::Write, FileTarget::Path(&dir.file("g.bin")), 5, b.desc())).unwrap();
        assert_eq!(h.pending_ops(), 1, "inline ops are not queued");
        let c = Pinned::new(777);
        ds::transfer_inline(&h, request(Direction::Read, FileTarget::Path(&dir.file("g.bin")), 5, c.desc())).unwrap();
        assert_bytes_eq(c.as_slice(), b.as_slice(), "inline round trip");
        assert_eq!(h.wait().unwrap(), 1);
        assert_bytes_eq(&read_file(&p), a.as_slice(), "queued write");
        assert_eq!(read_file(&dir.file("g.bin")).len(), 5 + 777);
    }
}

#[test]
fn blocking_calls_from_many_threads_each_get_their_own_count() {
    let _g = serial();
    let dir = TempDir::new("threads");
    for engine in engines() {
        let h = handle_with(engine, 4096, 8, false, true, 2);
        let threads = 6;
        let per = 15;
        let total: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let h = &h;
                    let dir = &dir;
                    s.spawn(move || {
                        let path = dir.file(&format!("t{t}.bin"));
                        let buf = Pinned::with(&pattern(t as u64, 8192));
                        let mut got = 0;
                        for i in 0..per {
                            // Every third op async: a later blocking call (of
                            // any thread) or the final wait counts it.
                            got += ds::pwrite(h, buf.desc(), FileTarget::Path(&path), (i * 8192) as i64, i % 3 == 1).unwrap();
                        }
                        got += h.wait().unwrap();
                        got
                    })
                })
                .collect();
            handles.into_iter().map(|j| j.join().unwrap()).sum()
        });
        assert_eq!(total, threads * per, "every op counted exactly once across threads");
        for t in 0..threads {
            let want: Vec<u8> = (0..per).flat_map(|_| pattern(t as u64, 8192)).collect();
            assert_bytes_eq(&read_file(&dir.file(&format!("t{t}.bin"))), &want, &format!("thread {t}"));
        }
    }
}

/// Runs in a child process (see `validate_prints_pass_and_fail`).
#[test]
#[ignore = "helper: run by validate_prints_pass_and_fail in a child process"]
fn validate_child() {
    if std::env::var_os("DEEPNVME_VALIDATE_CHILD").is_none() {
        return;
    }
    let dir = TempDir::new("validate");
    let engine = match std::env::var("DEEPNVME_VALIDATE_ENGINE").as_deref() {
        Ok("Psync") => EngineKind::Psync,
        _ => EngineKind::Uring,
    };
    let h = handle_with(engine, 4096, 4, false, false, 1);
    let path = dir.file("v.bin");
    let data = Pinned::with(&pattern(10, 12_345));
    let v = |direction, off, buffer| OpRequest {
        direction,
        target: FileTarget::Path(&path),
        file_offset: off,
        buffer,
        staging: None,
        validate: true,
    };
    // Pass for a write and a read; validation does not change the results.
    assert_eq!(ds::submit(&h, v(Direction::Write, 3, data.desc()), false).unwrap(), 1);
    let back = Pinned::new(12_345);
    assert_eq!(ds::submit(&h, v(Direction::Read, 3, back.desc()), false).unwrap(), 1);
    assert_bytes_eq(back.as_slice(), data.as_slice(), "validated read");
    // Inline path validates too.
    ds::transfer_inline(&h, v(Direction::Read, 3, back.desc())).unwrap();

    // Fail: once the async write has landed, change a byte of the file
    // behind the handle's back; validation in wait() must notice, and the
    // return code must stay unchanged.
    let big = Pinned::with(&pattern(11, 1 << 20));
    let fpath = dir.file("f.bin");
    let req = OpRequest { target: FileTarget::Path(&fpath), ..v(Direction::Write, 0, big.desc()) };
    assert_eq!(ds::submit(&h, req, true).unwrap(), 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read(&fpath).map(|f| f != big.as_slice()).unwrap_or(true) {
        assert!(std::time::Instant::now() < deadline, "async write never landed");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&fpath).unwrap();
        f.write_all_at(&[!big.as_slice()[1000]], 1000).unwrap();
    }
    assert_eq!(h.wait().unwrap(), 1, "a failed validation does not change the return code");
}

#[test]
fn validate_prints_pass_and_fail() {
    let _g = serial();
    let exe = std::env::current_exe().unwrap();
    for engine in engines() {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "validate_child", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("DEEPNVME_VALIDATE_CHILD", "1")
            .env("DEEPNVME_VALIDATE_ENGINE", format!("{engine:?}"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{engine:?} child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "{engine:?}: the child test did not run:\n{stdout}");
        // libtest prints "test validate_child ... " before the first line.
        let lines: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.find("Pass: ").or_else(|| l.find("Fail: ")).map(|i| &l[i..]))
            .collect();
        assert_eq!(lines.len(), 4, "{engine:?}: one line per validated op:\n{stdout}");
        assert!(lines[0].starts_with("Pass: correctness of write of 12345 bytes at offset 3 of ") && lines[0].ends_with("v.bin"), "{}", lines[0]);
        assert!(lines[1].starts_with("Pass: correctness of read of 12345 bytes at offset 3 of "), "{}", lines[1]);
        assert!(lines[2].starts_with("Pass: correctness of read of 12345 bytes"), "{}", lines[2]);
        assert!(
            lines[3].starts_with("Fail: correctness of write of 1048576 bytes at offset 0 of ")
                && lines[3].ends_with("first difference at byte 1000"),
            "{engine:?}: {}",
            lines[3]
        );
    }
}

/// `aio_read`/`aio_write`'s path: a transfer without a handle starts no
/// threads and, called again on the same thread, opens no new ring.
#[test]
fn transfer_once_starts_no_threads_and_reuses_its_engine() {
    let _g = serial();
    let dir = TempDir::new("once");
    let threads = threads_but_io_uring_workers;
    for engine in engines() {
        let config = deepnvme::HandleConfig { engine: Some(engine), queue_depth: 8, ..config(engine) };
        let data = pattern(21, 100_001);
        let path = dir.file(&format!("once-{engine:?}.bin"));
        let mut src = data.clone();
        let write = |buf: &mut Vec<u8>| {
            ds::transfer_once(&config, request(Direction::Write, FileTarget::Path(&path), 3, heap_desc(buf)))
        };
        write(&mut src).unwrap(); // the first call makes the thread's engine
        let (fds, tasks) = (open_fd_count(), threads());
        for _ in 0..20 {
            write(&mut src).unwrap();
            let mut back = vec![0u8; data.len()];
            ds::transfer_once(&config, request(Direction::Read, FileTarget::Path(&path), 3, heap_desc(&mut back)))
                .unwrap();
            assert_bytes_eq(&back, &data, &format!("{engine:?} one-shot round trip"));
        }
        assert_eq!(open_fd_count(), fds, "{engine:?}: one-shot transfers leak no descriptors (the ring is reused)");
        if engine == EngineKind::Uring {
            assert_eq!(threads(), tasks, "one-shot io_uring transfers start no threads");
        }
    }
}

/// `IoHandle::scope`: async ops on borrowed plain memory (aligned and not),
/// every byte checked; an error names the file; a panic inside the scope
/// still waits for the ops before the borrowed memory is released.
#[test]
fn scoped_ops_on_borrowed_memory_finish_before_the_scope_returns() {
    let _g = serial();
    let dir = TempDir::new("scope");
    for engine in engines() {
        let h = handle_with(engine, 64 * 1024, 8, false, true, 2);
        let path = dir.file(&format!("scoped-{engine:?}.bin"));
        let (a, b) = (pattern(1, 1 << 20), pattern(2, (1 << 20) + 4094));
        let written = h
            .scope(|s| {
                s.write(&a, FileTarget::Path(&path), 0).unwrap();
                s.write(&b, FileTarget::Path(&path), 1 << 20).unwrap();
                7
            })
            .unwrap();
        assert_eq!(written, 7);
        let mut want = a.clone();
        want.extend_from_slice(&b);
        assert_bytes_eq(&read_file(&path), &want, &format!("{engine:?}: file after a scope of two writes"));

        // Reads into two halves of one buffer, one of them at an odd address.
        let mut back = vec![0u8; want.len() + 1];
        let (head, tail) = back[1..].split_at_mut(1 << 20);
        h.scope(|s| {
            s.read(head, FileTarget::Path(&path), 0).unwrap();
            s.read(tail, FileTarget::Path(&path), 1 << 20).unwrap();
        })
        .unwrap();
        assert_bytes_eq(&back[1..], &want, &format!("{engine:?}: scoped reads"));

        // An op refused at submit is the closure's error, naming the file;
        // the scope itself then has nothing to wait for.
        let mut past = vec![0u8; 4096];
        let err = h.scope(|s| s.read(&mut past, FileTarget::Path(&path), 1 << 30)).unwrap().unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{engine:?}: error without the file: {err}");

        // A panic after submitting: the read has finished (the bytes are
        // there) by the time the panic reaches the caller.
        let mut late = vec![0u8; 1 << 20];
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.scope(|s| {
                s.read(&mut late, FileTarget::Path(&path), 0).unwrap();
                panic!("after submitting");
            })
        }));
        assert!(caught.is_err());
        assert_eq!(h.pending_ops(), 0, "{engine:?}: ops left pending after a panicking scope");
        assert_bytes_eq(&late, &a, &format!("{engine:?}: read of a panicking scope"));
    }
}
