//! The engine per file (`src/engine/choice.rs`): ops on files on tmpfs and
//! ramfs run on the psync engine even on an io_uring handle, unless the
//! engine was chosen explicitly; ops on the repository's disk (ext4 under
//! `target/`) keep io_uring. Real mounts, real rings: the handle's own
//! counters say which engine moved the bytes, and the kernel's `iou-wrk`
//! threads show the reason for the rule.
//!
//! A binary of its own (not a module of `tests/core/`): it counts this
//! process's threads (/proc/self/task) to see the kernel's `iou-wrk` workers;
//! another file's rings would add to them.

use deepnvme::test_support as common;

use std::ffi::CString;
use std::path::{Path, PathBuf};

use common::*;
// Async writes of raw pinned memory, counted by wait(): DeepSpeed's calls.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::PuntingFs;
use deepnvme::{EngineKind, FileTarget, HandleConfig, IoHandle, Stats};

/// A fresh mount of `fstype` on a new directory, unmounted on drop.
struct Mount {
    dir: TempDir,
}

impl Mount {
    fn new(fstype: &str, opts: &str) -> Result<Mount, String> {
        let dir = TempDir::new(fstype);
        let target = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let kind = CString::new(fstype).unwrap();
        let data = CString::new(opts).unwrap();
        // SAFETY: valid C strings.
        let rc = unsafe {
            libc::mount(kind.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, data.as_ptr() as *const libc::c_void)
        };
        if rc != 0 {
            return Err(format!("mount -t {fstype} -o {opts} failed: {}", std::io::Error::last_os_error()));
        }
        Ok(Mount { dir })
    }
    fn file(&self, name: &str) -> PathBuf {
        self.dir.file(name)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; MNT_DETACH so a stray descriptor cannot keep it mounted.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Runs, per handle: a blocking write and read of a locked buffer larger
/// than the inline limit (the workers), async writes back to back (a
/// worker ring's stream), a bounced read, a one-block blocking read (the
/// calling thread), each checked byte for byte. Returns what the handle
/// counted meanwhile.
fn exercise(h: &IoHandle, dir: &dyn Fn(&str) -> PathBuf) -> Stats {
    let before = h.stats();
    let big = Pinned::with(&pattern(1, 4 << 20));
    let path = dir("big.bin");
    assert_eq!(h.write_from(big.as_slice(), FileTarget::Path(&path), 0).unwrap(), 1);
    let mut back = Pinned::new(4 << 20);
    assert_eq!(h.read_into(back.as_mut_slice(), FileTarget::Path(&path), 0).unwrap(), 1);
    assert_bytes_eq(back.as_slice(), big.as_slice(), "blocking read of a blocking write");

    let parts: Vec<Pinned> = (0..4).map(|i| Pinned::with(&pattern(10 + i, 1 << 20))).collect();
    let streamed = dir("streamed.bin");
    for (i, p) in parts.iter().enumerate() {
        ds::pwrite(h, p.desc(), FileTarget::Path(&streamed), (i << 20) as i64, true).unwrap();
    }
    assert_eq!(h.wait().unwrap(), 4);
    let mut whole = vec![0u8; 4 << 20];
    h.read_into(&mut whole, FileTarget::Path(&streamed), 0).unwrap();
    for (i, p) in parts.iter().enumerate() {
        assert_bytes_eq(&whole[i << 20..(i + 1) << 20], p.as_slice(), "async writes back to back, bounced read");
    }
    let mut small = Pinned::new(4096);
    h.read_into(small.as_mut_slice(), FileTarget::Path(&streamed), 8192).unwrap();
    assert_bytes_eq(small.as_slice(), &parts[0].as_slice()[8192..12288], "one-block read");
    let after = h.stats();
    Stats {
        io_uring_runs: after.io_uring_runs - before.io_uring_runs,
        psync_runs: after.psync_runs - before.psync_runs,
        ..after
    }
}

fn handle(engine: Option<EngineKind>) -> IoHandle {
    IoHandle::new(HandleConfig {
        block_size: 256 << 10,
        queue_depth: 8,
        overlap_events: true,
        intra_op_parallelism: 2,
        engine,
        ..HandleConfig::default()
    })
    .expect("creating a handle")
}

/// The kernel worker threads io_uring runs for this process, by name
/// (`iou-wrk-<submitting thread>`).
fn iou_workers() -> std::collections::HashSet<String> {
    thread_names().into_iter().filter(|comm| comm.starts_with("iou-wrk")).collect()
}

fn fs_of(path: &Path) -> Option<PuntingFs> {
    let f = std::fs::File::open(path).unwrap();
    deepnvme::test_support::punting_fs(std::os::fd::AsRawFd::as_raw_fd(&f))
}

#[test]
fn files_on_tmpfs_and_ramfs_use_psync_and_the_disk_keeps_io_uring() {
    if let Err(why) = deepnvme::diag::io_uring_status() {
        if std::env::var_os("DEEPNVME_TEST_REQUIRE_URING").is_some() {
            panic!("io_uring is unavailable ({why}) but DEEPNVME_TEST_REQUIRE_URING is set");
        }
        skip(&format!("the engine per file is not tested: io_uring is unavailable here: {why}"));
        return;
    }
    let explicit = std::env::var("DEEPNVME_ENGINE").ok().filter(|v| !v.trim().is_empty());
    let mounts: Vec<(PuntingFs, Mount)> = [(PuntingFs::Tmpfs, "tmpfs", "size=64m,mode=0700"), (PuntingFs::Ramfs, "ramfs", "mode=0700")]
        .into_iter()
        .filter_map(|(fs, kind, opts)| match Mount::new(kind, opts) {
            Ok(m) => Some((fs, m)),
            Err(why) => {
                skip(&format!("{} not tested: {why} (needs CAP_SYS_ADMIN)", fs.name()));
                None
            }
        })
        .collect();

    // The disk under target/: io_uring, whatever ran before.
    let disk = TempDir::new("file-engine-disk");
    assert_eq!(fs_of(disk.path()), None, "target/ is on a file system io_uring punts for: run the tests on a disk");
    let h = handle(None);
    let on_disk = exercise(&h, &|n| disk.file(n));
    if explicit.is_none() {
        assert_eq!(h.engine_kind(), EngineKind::Uring);
        assert!(on_disk.io_uring_runs >= 6, "the disk's ops ran on io_uring: {on_disk}");
        // Only the one-block read runs on the calling thread's pread.
        assert!(on_disk.psync_runs <= 2, "the disk's ops left io_uring: {on_disk}");
    }

    for (fs, m) in &mounts {
        let probe = m.file("probe.bin");
        std::fs::write(&probe, b"x").unwrap();
        assert_eq!(fs_of(&probe), Some(*fs), "statfs of a fresh {} mount", fs.name());
        let f = std::fs::File::open(&probe).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);

        // A default handle: io_uring, yet every run on this file system is psync's.
        let h = handle(None);
        let stats = exercise(&h, &|n| m.file(n));
        match &explicit {
            None => {
                assert_eq!(h.engine_kind(), EngineKind::Uring, "the handle's engine stays io_uring");
                assert_eq!(stats.io_uring_runs, 0, "{}: no op ran on io_uring: {stats}", fs.name());
                assert!(stats.psync_runs >= 8, "{}: the ops ran on psync: {stats}", fs.name());
                assert_eq!(deepnvme::test_support::engine_for_file(None, fd).unwrap(), (EngineKind::Psync, Some(*fs)));
            }
            Some(v) => skip(&format!("DEEPNVME_ENGINE={v} is set: the default handle keeps that engine on {}", fs.name())),
        }

        // Asked for by name, io_uring moves the bytes there too, through
        // the kernel's worker threads: the reason for the rule.
        let h = handle(Some(EngineKind::Uring));
        let workers_before = iou_workers();
        let stats = exercise(&h, &|n| m.file(n));
        let new_workers = iou_workers().difference(&workers_before).count();
        assert!(stats.io_uring_runs >= 6, "{}: HandleConfig::engine = Uring is obeyed: {stats}", fs.name());
        assert!(stats.psync_runs <= 2, "{}: only the one-block read left io_uring: {stats}", fs.name());
        assert!(new_workers > 0, "{}: io_uring handed this handle's requests to iou-wrk threads", fs.name());
        assert_eq!(deepnvme::test_support::engine_for_file(Some(EngineKind::Uring), fd).unwrap(), (EngineKind::Uring, None));
    }
    let f = std::fs::File::create(disk.file("probe.bin")).unwrap();
    let expect_disk = deepnvme::diag::default_engine().unwrap();
    assert_eq!(deepnvme::test_support::engine_for_file(None, std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap(), (expect_disk, None));
}
