//! Back-to-back ops streaming through one worker ring (`QueuedRuns` in
//! `handle.rs`, `UringEngine::stream`): queued ops start in the slots their
//! predecessors free, land right, keep their order where they share written
//! bytes, and fail alone.

use crate::test_support::*;
use crate::engine::EngineKind;
use crate::{FileTarget, IoHandle};

const OP: usize = 256 << 10;
const OPS: usize = 64;

/// A one-worker io_uring handle in DeepSpeed's overlap mode: every op of
/// a test goes through the same ring. `None` where io_uring is unavailable
/// or streaming is switched off (said on stderr).
fn streaming_handle() -> Option<IoHandle> {
    if !engines().contains(&EngineKind::Uring) {
        return None;
    }
    if !crate::knobs::settings().op_stream {
        skip("op streaming not tested: DEEPNVME_OP_STREAM=0");
        return None;
    }
    Some(handle_with(EngineKind::Uring, 64 << 10, 8, false, true, 1))
}

#[test]
fn back_to_back_ops_stream_through_one_ring_and_land_right() {
    let Some(h) = streaming_handle() else { return };
    let dir = TempDir::new("stream");
    let path = dir.file("many.bin");
    let data = pattern(21, OP * OPS);
    let src = Pinned::with(&data);
    // Several rounds: the first op of a round may find the queue empty.
    for round in 0..4 {
        for i in 0..OPS {
            h.pwrite(src.narrow(i * OP, OP), FileTarget::Path(&path), (i * OP) as i64, true).unwrap();
        }
        assert_eq!(h.wait().unwrap(), OPS, "round {round}: every write finished");
    }
    assert_bytes_eq(&read_file(&path), &data, "file after 64 streamed writes");
    let dst = Pinned::new(OP * OPS);
    for i in (0..OPS).rev() {
        h.pread(dst.narrow(i * OP, OP), FileTarget::Path(&path), (i * OP) as i64, true).unwrap();
    }
    assert_eq!(h.wait().unwrap(), OPS);
    assert_bytes_eq(dst.as_slice(), &data, "64 streamed reads");
    let (overlapped, held) = h.stream_counts();
    assert!(overlapped > 0, "no op ever started while an earlier one was in flight");
    assert_eq!(held, 0, "ops on distinct bytes were held back for order");
}

#[test]
fn ops_on_the_same_bytes_keep_their_submission_order() {
    let Some(h) = streaming_handle() else { return };
    let dir = TempDir::new("stream-order");
    let filler_path = dir.file("filler.bin");
    let path = dir.file("same.bin");
    let filler = Pinned::with(&pattern(1, OP * 16));
    let first = pattern(2, OP);
    let second = pattern(3, OP);
    let (a, b) = (Pinned::with(&first), Pinned::with(&second));
    let back = Pinned::new(OP);
    // (a read is checked against the file's size when it is submitted)
    write_file(&path, &pattern(9, OP));
    for round in 0..20 {
        // Keep the ring busy so the next ops queue up behind the filler.
        for i in 0..16 {
            h.pwrite(filler.narrow(i * OP, OP), FileTarget::Path(&filler_path), (i * OP) as i64, true).unwrap();
        }
        // Write, overwrite, read back: the same bytes, one after another.
        h.pwrite(a.desc(), FileTarget::Path(&path), 0, true).unwrap();
        h.pwrite(b.desc(), FileTarget::Path(&path), 0, true).unwrap();
        h.pread(back.desc(), FileTarget::Path(&path), 0, true).unwrap();
        assert_eq!(h.wait().unwrap(), 19);
        assert_bytes_eq(back.as_slice(), &second, &format!("round {round}: read after two writes"));
        assert_bytes_eq(&read_file(&path), &second, &format!("round {round}: file after two writes"));
    }
    let (_, held) = h.stream_counts();
    assert!(held > 0, "a write and a later op on the same bytes were never held apart");

    // Reads of the same bytes need no order among themselves.
    let readers = streaming_handle().unwrap();
    let outs: Vec<Pinned> = (0..16).map(|_| Pinned::new(OP)).collect();
    for _ in 0..4 {
        for out in &outs {
            readers.pread(out.desc(), FileTarget::Path(&path), 0, true).unwrap();
        }
        assert_eq!(readers.wait().unwrap(), outs.len());
    }
    for out in &outs {
        assert_bytes_eq(out.as_slice(), &second, "a read among reads of the same bytes");
    }
    let (overlapped, held) = readers.stream_counts();
    assert_eq!(held, 0, "reads of the same bytes were held apart");
    assert!(overlapped > 0, "reads of the same bytes never overlapped");
}

#[test]
fn ops_on_the_same_memory_keep_their_submission_order() {
    let Some(h) = streaming_handle() else { return };
    let dir = TempDir::new("stream-memory");
    let filler_path = dir.file("filler.bin");
    let (a_path, b_path, c_path) = (dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin"));
    let filler = Pinned::with(&pattern(1, OP * 16));
    let (a, c) = (pattern(11, OP), pattern(12, OP));
    write_file(&a_path, &a);
    write_file(&c_path, &c);
    let buf = Pinned::with(&pattern(13, OP));
    for round in 0..20 {
        let before = buf.as_slice().to_vec();
        for i in 0..16 {
            h.pwrite(filler.narrow(i * OP, OP), FileTarget::Path(&filler_path), (i * OP) as i64, true).unwrap();
        }
        // Write the buffer out, read A into it, write it out again, read C
        // into it: other files each time, one buffer.
        h.pwrite(buf.desc(), FileTarget::Path(&b_path), 0, true).unwrap();
        h.pread(buf.desc(), FileTarget::Path(&a_path), 0, true).unwrap();
        h.pwrite(buf.desc(), FileTarget::Path(&b_path), OP as i64, true).unwrap();
        h.pread(buf.desc(), FileTarget::Path(&c_path), 0, true).unwrap();
        assert_eq!(h.wait().unwrap(), 20);
        let b = read_file(&b_path);
        assert_bytes_eq(&b[..OP], &before, &format!("round {round}: the buffer as it was before the read"));
        assert_bytes_eq(&b[OP..], &a, &format!("round {round}: the buffer as the first read left it"));
        assert_bytes_eq(buf.as_slice(), &c, &format!("round {round}: the buffer after the last read"));
        // The next round starts from other bytes.
        h.pread(buf.desc(), FileTarget::Path(if round % 2 == 0 { &a_path } else { &c_path }), 0, false).unwrap();
    }
}

#[test]
fn an_op_failing_inside_a_stream_fails_alone() {
    let Some(h) = streaming_handle() else { return };
    let dir = TempDir::new("stream-fail");
    let ahead_path = dir.file("ahead.bin");
    let doomed_path = dir.file("doomed.bin");
    let after_path = dir.file("after.bin");
    let ahead = pattern(4, 64 << 20);
    let doomed = pattern(5, OP * 8);
    let after = pattern(6, OP * 8);
    write_file(&ahead_path, &ahead);
    write_file(&doomed_path, &doomed);
    write_file(&after_path, &after);
    // Out of the page cache, so the reads ahead take the device's time.
    drop_file_cache(&ahead_path);
    let ahead_buf = Pinned::new(ahead.len());
    let doomed_buf = Pinned::new(doomed.len());
    let after_buf = Pinned::new(after.len());
    // 64 MiB of reads ahead, then reads of a file that is cut to nothing
    // before the ring gets to them, then reads of another file.
    for i in 0..(ahead.len() / OP) {
        h.pread(ahead_buf.narrow(i * OP, OP), FileTarget::Path(&ahead_path), (i * OP) as i64, true).unwrap();
    }
    for i in 0..8 {
        h.pread(doomed_buf.narrow(i * OP, OP), FileTarget::Path(&doomed_path), (i * OP) as i64, true).unwrap();
        h.pread(after_buf.narrow(i * OP, OP), FileTarget::Path(&after_path), (i * OP) as i64, true).unwrap();
    }
    std::fs::OpenOptions::new().write(true).open(&doomed_path).unwrap().set_len(0).unwrap();
    let err = h.wait().expect_err("reads of a file cut to nothing must fail").to_string();
    assert!(err.contains("doomed.bin") && err.contains("end of file"), "{err}");
    assert_bytes_eq(ahead_buf.as_slice(), &ahead, "the reads ahead of the failing ones");
    assert_bytes_eq(after_buf.as_slice(), &after, "the reads streamed with the failing ones");
    // The handle goes on.
    assert_eq!(h.pread(after_buf.desc(), FileTarget::Path(&after_path), 0, false).unwrap(), 1);
}

/// Drops a file's pages from the page cache (it was written buffered).
fn drop_file_cache(path: &std::path::Path) {
    let fd = open_fd(path, libc::O_RDONLY);
    // SAFETY: plain syscalls on our descriptor.
    unsafe {
        libc::fsync(fd);
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    close_fd(fd);
}

#[test]
fn ops_on_one_file_by_any_name_share_its_identity() {
    use crate::file::OpenFile;
    use crate::Direction;
    let dir = TempDir::new("stream-identity");
    let (path, other) = (dir.file("a.bin"), dir.file("b.bin"));
    write_file(&path, &pattern(7, 8192));
    write_file(&other, &pattern(8, 8192));
    let (hard, soft) = (dir.file("a-hard.bin"), dir.file("a-soft.bin"));
    std::fs::hard_link(&path, &hard).unwrap();
    std::os::unix::fs::symlink(&path, &soft).unwrap();
    let identity = |p: &std::path::Path, d| OpenFile::open(FileTarget::Path(p), d).unwrap().identity();
    let a = identity(&path, Direction::Read);
    if a.is_none() {
        skip("file identity not tested: no O_DIRECT descriptor on this file system");
        return;
    }
    assert_eq!(identity(&path, Direction::Write), a, "the same path opened for write");
    assert_eq!(identity(&hard, Direction::Read), a, "a hard link");
    assert_eq!(identity(&soft, Direction::Read), a, "a symbolic link");
    assert_ne!(identity(&other, Direction::Read), a, "another file");
    // The caller's own descriptor of the file (FastFileWriter's case).
    let fd = open_fd(&path, libc::O_RDWR | libc::O_DIRECT);
    assert_eq!(OpenFile::open(FileTarget::Fd(fd), Direction::Write).unwrap().identity(), a, "a caller's O_DIRECT fd");
    close_fd(fd);
}

#[test]
fn footprints_conflict_only_on_shared_bytes_that_one_of_them_writes() {
    use crate::file::FileIdentity;
    use crate::op::work::Footprint;
    let f = FileIdentity { dev_major: 8, dev_minor: 1, ino: 42, block_device: false };
    let g = FileIdentity { ino: 43, ..f };
    // Each op in its own memory unless said otherwise.
    let mut next_memory = 0usize;
    let mut fp = |file, start, end, writes| {
        next_memory += 1 << 20;
        Footprint { file, start, end, memory: (next_memory, next_memory + 4096), writes }
    };
    assert!(fp(f, 0, 100, true).conflicts_with(&fp(f, 99, 200, false)), "write then read of byte 99");
    assert!(fp(f, 0, 100, false).conflicts_with(&fp(f, 50, 60, true)), "read then write inside it");
    assert!(fp(f, 0, 100, true).conflicts_with(&fp(f, 0, 100, true)), "two writes of the same bytes");
    assert!(!fp(f, 0, 100, true).conflicts_with(&fp(f, 100, 200, true)), "adjacent writes");
    assert!(!fp(f, 0, 100, false).conflicts_with(&fp(f, 0, 100, false)), "two reads");
    assert!(!fp(f, 0, 100, true).conflicts_with(&fp(g, 0, 100, true)), "another file");
    // Block devices: a partition and its disk share bytes under other names.
    let sda = FileIdentity { dev_major: 8, dev_minor: 0, ino: 0, block_device: true };
    let sda1 = FileIdentity { dev_minor: 1, ..sda };
    assert!(fp(sda, 0, 100, true).conflicts_with(&fp(sda1, 1 << 30, (1 << 30) + 100, false)), "disk and partition");
    assert!(!fp(sda, 0, 100, false).conflicts_with(&fp(sda1, 0, 100, false)), "reads of two block devices");
    // Memory: one buffer, other files.
    let on = |file, writes, memory: (usize, usize)| Footprint { file, start: 0, end: 100, memory, writes };
    let m = (1 << 40, (1 << 40) + 4096);
    assert!(on(f, false, m).conflicts_with(&on(g, true, m)), "a read into a buffer, then a write from it");
    assert!(on(f, true, m).conflicts_with(&on(g, false, m)), "a write from a buffer, then a read into it");
    assert!(on(f, false, m).conflicts_with(&on(g, false, (m.1 - 1, m.1 + 10))), "two reads into one byte");
    assert!(!on(f, true, m).conflicts_with(&on(g, true, m)), "two writes from one buffer");
    assert!(!on(f, false, m).conflicts_with(&on(g, false, (m.1, m.1 + 10))), "reads into adjacent memory");
}
