//! Reads and writes on a real block device: a loop device over a sparse
//! 64 MiB file in the target directory. Its size comes from BLKGETSIZE64
//! (stat says 0 bytes), so reads inside it work and reads past its end are
//! refused naming the device, the offset and the size; writes past its end
//! fail with the kernel's ENOSPC. Every transfer is
//! checked against pread(2) on the device node and, after an fsync, against
//! the backing file.
//!
//! Needs root, losetup and loop support (/dev/loop-control); without them
//! each test says why and returns. With them, a failing losetup fails.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::{EngineKind, Error, FileTarget, LockedBuffer};

const DEV_SIZE: u64 = 64 << 20;

/// (offset, length) pairs written and read back. All lengths are even, so
/// that intra_op_parallelism 2 accepts them.
const EXTENTS: [(u64, usize); 4] = [
    (0, 1 << 20),                      // the first bytes, aligned
    ((5 << 20) + 3 * 4096, 512 << 10), // aligned, mid-device
    ((17 << 20) + 777, 300_002),       // unaligned start and end: buffered head and tail
    (DEV_SIZE - (1 << 20), 1 << 20),   // the last MiB, ending exactly at the end
];

/// Serialises attach and detach: concurrent `losetup --find` calls in one
/// test binary can pick the same free device.
static LOSETUP: Mutex<()> = Mutex::new(());

/// A loop device over a sparse file, detached (and the file removed) on drop,
/// also when the test panics.
struct LoopDevice {
    dev: PathBuf,
    backing: PathBuf,
    _dir: TempDir,
}

impl LoopDevice {
    /// Attaches a fresh device; `Ok(Err(why))` says why this machine has none
    /// to give (not root, no losetup, no loop driver).
    fn attach(tag: &str) -> Result<Result<LoopDevice, String>, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(Err("not root (losetup needs CAP_SYS_ADMIN)".into()));
        }
        if !Path::new("/dev/loop-control").exists() {
            return Ok(Err("no /dev/loop-control (no loop driver, or a container without it)".into()));
        }
        let dir = TempDir::new(tag);
        let backing = dir.file("disk.img");
        let sparse = File::create(&backing).and_then(|f| f.set_len(DEV_SIZE));
        sparse.map_err(|e| format!("creating {}: {e}", backing.display()))?;
        let _serial = LOSETUP.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = String::new();
        // Direct I/O on the loop device is what a real disk behaves like; an
        // older losetup or a backing file system without O_DIRECT may refuse it.
        for args in [&["--find", "--show", "--direct-io=on"][..], &["--find", "--show"][..]] {
            let out = match Command::new("losetup").args(args).arg(&backing).output() {
                Ok(out) => out,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err("losetup is not installed".into())),
                Err(e) => return Err(format!("running losetup: {e}")),
            };
            if out.status.success() {
                let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                return Ok(Ok(LoopDevice { dev, backing, _dir: dir }));
            }
            last = format!("losetup {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Err(last)
    }

    /// The device for a test, or `None` after saying why the machine has
    /// none; panics when it should have one and attaching failed.
    fn for_test(tag: &str) -> Option<LoopDevice> {
        match LoopDevice::attach(tag) {
            Ok(Ok(dev)) => Some(dev),
            Ok(Err(why)) => {
                skip(&format!("block device test {tag} not run: {why}"));
                None
            }
            Err(failure) => panic!("attaching a loop device: {failure}"),
        }
    }

    fn path(&self) -> &Path {
        &self.dev
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _serial = LOSETUP.lock().unwrap_or_else(|p| p.into_inner());
        let detached = Command::new("losetup").arg("-d").arg(&self.dev).output();
        if !matches!(&detached, Ok(out) if out.status.success()) {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "losetup -d {} failed: {detached:?}", self.dev.display());
        }
    }
}

/// Checks `want` at `offset` with plain pread(2) on the device node (through
/// the page cache, no library code), then, after an fsync of the device,
/// in the backing file: the bytes reached the "disk".
#[track_caller]
fn assert_on_device(dev: &LoopDevice, offset: u64, want: &[u8], what: &str) {
    let node = File::open(dev.path()).expect("opening the device node");
    let mut got = vec![0u8; want.len()];
    node.read_exact_at(&mut got, offset).expect("pread(2) on the device node");
    assert_bytes_eq(&got, want, &format!("{what}: pread(2) of {} at {offset}", dev.path().display()));
    node.sync_all().expect("fsync of the device node");
    File::open(&dev.backing).unwrap().read_exact_at(&mut got, offset).expect("pread(2) of the backing file");
    assert_bytes_eq(&got, want, &format!("{what}: backing file at {offset}"));
}

/// The value of a call that must succeed, or a panic naming the case.
#[track_caller]
fn ok<T>(r: deepnvme::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[track_caller]
fn assert_mentions(e: &Error, parts: &[&str], what: &str) {
    let msg = e.to_string();
    for part in parts {
        assert!(msg.contains(part), "{what}: the message lacks {part:?}: {msg}");
    }
}

fn configs() -> Vec<(EngineKind, usize)> {
    engines().into_iter().flat_map(|e| [(e, 1), (e, 2)]).collect()
}

#[test]
fn locked_buffers_write_and_read_a_block_device_directly() {
    let Some(dev) = LoopDevice::for_test("locked") else { return };
    let target = FileTarget::Path(dev.path());
    // The device takes O_DIRECT, so aligned pieces of locked memory go direct.
    let fd = open_fd(dev.path(), libc::O_RDONLY | libc::O_DIRECT);
    let dio = deepnvme::dio_alignment(fd);
    close_fd(fd);
    assert!(dio.is_some(), "{} reports no direct I/O", dev.path().display());
    let mut seed = 100;
    for (engine, par) in configs() {
        // 128 KiB blocks: every extent is several pieces per worker.
        let h = handle_with(engine, 128 << 10, 8, false, true, par);
        for (offset, len) in EXTENTS {
            let what = format!("{engine:?} p={par} {len} bytes at {offset}");

            // Owned LockedBuffers, asynchronous submit and wait.
            seed += 1;
            let data = pattern(seed, len);
            let mut out = LockedBuffer::new(len).unwrap();
            out.copy_from_slice(&data);
            let pending = ok(h.submit_write(out, target, offset), &format!("{what}: submit_write"));
            assert_eq!(ok(h.wait(), &format!("{what}: write")), 1);
            assert!(pending.take().is_some());
            assert_on_device(&dev, offset, &data, &format!("{what} submit_write"));
            let into = LockedBuffer::new(len).unwrap();
            let pending = ok(h.submit_read(into, target, offset), &format!("{what}: submit_read"));
            assert_eq!(ok(h.wait(), &format!("{what}: read")), 1);
            assert_bytes_eq(&pending.take().unwrap(), &data, &format!("{what}: submit_read"));

            // Manager-pinned memory through BufferDesc, blocking and async.
            seed += 1;
            let data = pattern(seed, len);
            let src = Pinned::with(&data);
            assert_eq!(ok(ds::pwrite(&h, src.desc(), target, offset as i64, false), &format!("{what}: pwrite")), 1);
            assert_on_device(&dev, offset, &data, &format!("{what} pwrite"));
            let dst = Pinned::new(len);
            ok(ds::pread(&h, dst.desc(), target, offset as i64, true), &format!("{what}: pread"));
            assert_eq!(ok(h.wait(), &format!("{what}: async pread")), 1);
            assert_bytes_eq(dst.as_slice(), &data, &format!("{what}: pread"));
        }
        let stats = h.stats();
        assert_eq!(stats.bounced_bytes, 0, "{engine:?} p={par}: locked memory never bounces: {stats:?}");
        assert_eq!(stats.failed_ops, 0, "{stats:?}");
    }
}

/// The device node lives on devtmpfs, which statfs calls tmpfs: the
/// engine per file must look at the device, not at the node's file system.
#[test]
fn a_block_device_keeps_io_uring_though_its_node_is_on_devtmpfs() {
    let Some(dev) = LoopDevice::for_test("engine") else { return };
    if deepnvme::diag::io_uring_status().is_err() || std::env::var_os("DEEPNVME_ENGINE").is_some() {
        skip("the block device's engine not checked: io_uring unavailable or DEEPNVME_ENGINE set");
        return;
    }
    let h = deepnvme::IoHandle::new(deepnvme::HandleConfig { block_size: 256 << 10, ..Default::default() }).unwrap();
    let data = Pinned::with(&pattern(41, 1 << 20));
    ok(ds::pwrite(&h, data.desc(), FileTarget::Path(dev.path()), 0, false), "write");
    assert_on_device(&dev, 0, data.as_slice(), "write through a default handle");
    let s = h.stats();
    assert!(s.io_uring_runs > 0 && s.psync_runs == 0, "the device's op ran on io_uring: {s}");
    let node = File::open(dev.path()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&node);
    assert_eq!(deepnvme::test_support::punting_fs(fd), None, "a block device is not a tmpfs file");
    assert_eq!(deepnvme::test_support::engine_for_file(None, fd).unwrap(), (EngineKind::Uring, None));
}

#[test]
fn plain_vec_buffers_write_and_read_a_block_device_through_a_bounce() {
    let Some(dev) = LoopDevice::for_test("vec") else { return };
    let target = FileTarget::Path(dev.path());
    let mut seed = 200;
    for (engine, par) in configs() {
        let h = handle_with(engine, 128 << 10, 8, false, true, par);
        for (offset, len) in EXTENTS {
            let what = format!("{engine:?} p={par} {len} bytes at {offset}");
            seed += 1;
            let data = pattern(seed, len);
            assert_eq!(ok(h.write_from(&data, target, offset), &format!("{what}: write_from")), 1);
            assert_on_device(&dev, offset, &data, &format!("{what} write_from"));
            let mut back = vec![0u8; len];
            assert_eq!(ok(h.read_into(&mut back, target, offset), &format!("{what}: read_into")), 1);
            assert_bytes_eq(&back, &data, &format!("{what}: read_into"));
        }
        let stats = h.stats();
        let moved: u64 = EXTENTS.iter().map(|&(_, len)| 2 * len as u64).sum();
        assert_eq!(stats.bounced_bytes, moved, "{engine:?} p={par}: a plain Vec bounces: {stats:?}");
    }
}

#[test]
fn caller_descriptors_on_a_block_device_with_and_without_o_direct() {
    let Some(dev) = LoopDevice::for_test("fd") else { return };
    let mut seed = 300;
    for (engine, par) in configs() {
        let h = handle_with(engine, 128 << 10, 8, false, true, par);
        // With O_DIRECT the op learns the size at open; without, when the
        // read is checked: both must see the device's size.
        for extra in [libc::O_DIRECT, 0] {
            let fd = open_fd(dev.path(), libc::O_RDWR | extra);
            for (offset, len) in EXTENTS {
                let what = format!("{engine:?} p={par} O_DIRECT={} {len} bytes at {offset}", extra != 0);
                seed += 1;
                let data = pattern(seed, len);
                let src = Pinned::with(&data);
                ok(ds::pwrite(&h, src.desc(), FileTarget::Fd(fd), offset as i64, false), &format!("{what}: pwrite"));
                assert_on_device(&dev, offset, &data, &what);
                let mut back = vec![0u8; len];
                ok(h.read_into(&mut back, FileTarget::Fd(fd), offset), &format!("{what}: read_into"));
                assert_bytes_eq(&back, &data, &format!("{what}: read_into"));
            }
            let e = h.read_into(&mut [0u8; 4096], FileTarget::Fd(fd), DEV_SIZE).unwrap_err();
            assert_mentions(&e, &[&format!("<fd {fd}>"), &format!("({DEV_SIZE} bytes)")], "a read past the end");
            close_fd(fd);
        }
    }
}

#[test]
fn a_read_past_the_end_of_a_block_device_names_the_device_offset_and_size() {
    let Some(dev) = LoopDevice::for_test("eof") else { return };
    let target = FileTarget::Path(dev.path());
    let name = dev.path().display().to_string();
    for (engine, par) in configs() {
        let h = handle_with(engine, 128 << 10, 8, false, true, par);
        let past = [(DEV_SIZE - 4096, 8192usize), (DEV_SIZE, 4096), (DEV_SIZE + (1 << 30), 4096), (1, DEV_SIZE as usize)];
        for (offset, len) in past {
            let what = format!("{engine:?} p={par} {len} bytes at {offset}");
            let locked = Pinned::new(len);
            let mut plain = vec![0x5au8; len];
            for (buffer, is_async) in [(locked.desc(), false), (locked.desc(), true), (heap_desc(&mut plain), false)] {
                let e = ds::pread(&h, buffer, target, offset as i64, is_async).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e}");
                let parts = [name.clone(), format!("{len} bytes"), format!("offset {offset}"), format!("({DEV_SIZE} bytes)")];
                assert_mentions(&e, &parts.each_ref().map(String::as_str), &what);
                assert_mentions(&e, &["past the end of the device"], &what);
            }
            assert!(plain.iter().all(|&b| b == 0x5a), "{what}: a refused read writes nothing");
            assert_eq!(h.pending_ops(), 0, "{what}: a refused read queues nothing");
        }
        // Reads ending exactly at the end are fine (two bytes: parallelism 2
        // must divide the length).
        for len in [2usize, 4096] {
            let mut got = vec![0x5au8; len];
            assert_eq!(h.read_into(&mut got, target, DEV_SIZE - len as u64).unwrap(), 1);
            assert_bytes_eq(&got, &vec![0u8; len], "the sparse device's last bytes");
        }
    }
}

#[test]
fn a_write_past_the_end_of_a_block_device_is_enospc_naming_the_device() {
    let Some(dev) = LoopDevice::for_test("wend") else { return };
    let target = FileTarget::Path(dev.path());
    let name = dev.path().display().to_string();
    for (engine, par) in configs() {
        let h = handle_with(engine, 128 << 10, 8, false, true, par);
        // The kernel refuses the part at or beyond the end with ENOSPC; the
        // error names the first offset it refused.
        for (offset, len) in [(DEV_SIZE - 4096, 8192usize), (DEV_SIZE, 4096), (DEV_SIZE - 100, 200)] {
            let what = format!("{engine:?} p={par} {len} bytes at {offset}");
            let locked = Pinned::with(&pattern(1, len));
            let plain = pattern(2, len);
            for r in [ds::pwrite(&h, locked.desc(), target, offset as i64, false), h.write_from(&plain, target, offset)] {
                let e = r.expect_err(&what);
                let Error::Transfer(t) = &e else { panic!("{what}: expected a transfer error, got {e}") };
                assert_eq!(t.errno, libc::ENOSPC, "{what}: {e}");
                assert_mentions(&e, &[&name, &format!("offset {DEV_SIZE}"), "errno 28"], &what);
            }
        }
    }
}
