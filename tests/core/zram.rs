//! Direct I/O on zram from pinned memory that is 512-byte aligned but not
//! page-aligned (a slice of a locked tensor, as DeepSpeed's swap buffers pack
//! them at 1 KiB multiples). zram reports a memory alignment of 512 but moves
//! the bytes of the page-rounded address (`src/file/device_quirks.rs`), so
//! such memory must bounce there: every byte written is checked with
//! pread(2), every byte read against the source, on the device node itself
//! and on a file of ext4 on it.
//!
//! Needs root and zram (`/sys/class/zram-control`, or `modprobe zram`);
//! without them each test says why and returns. The ext4 half also needs
//! mkfs.ext4 and mount.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::FileTarget;

const CONTROL: &str = "/sys/class/zram-control";
const DEV_SIZE: &str = "64M";
/// Offsets into a page that are 512-byte aligned: the memory zram takes.
const SUB_PAGE_OFFSETS: [usize; 3] = [512, 1024, 3584];
const LEN: usize = 64 << 10;

/// A zram device of its own, reset and removed on drop (also when the test
/// panics), with an ext4 file system mounted on it once `mount_ext4` ran.
struct Zram {
    id: u32,
    mounted: Option<PathBuf>,
    _dir: TempDir,
}

impl Zram {
    /// A fresh device, or `Err(why)` when this machine has none to give.
    fn add(tag: &str) -> Result<Zram, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root (zram devices are made through sysfs)".into());
        }
        if !Path::new(CONTROL).exists() {
            let _ = Command::new("modprobe").arg("zram").arg("num_devices=0").output();
        }
        let id = std::fs::read_to_string(format!("{CONTROL}/hot_add"))
            .map_err(|e| format!("no zram ({CONTROL}/hot_add: {e})"))?;
        let id: u32 = id.trim().parse().map_err(|e| format!("hot_add said {id:?}: {e}"))?;
        let zram = Zram { id, mounted: None, _dir: TempDir::new(tag) };
        std::fs::write(format!("/sys/block/zram{id}/disksize"), DEV_SIZE)
            .unwrap_or_else(|e| panic!("sizing zram{id}: {e}"));
        Ok(zram)
    }

    fn for_test(tag: &str) -> Option<Zram> {
        Zram::add(tag).map_err(|why| skip(&format!("zram test {tag} not run: {why}"))).ok()
    }

    fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.id))
    }

    /// Makes ext4 on the device and mounts it; `None` after saying why not.
    fn mount_ext4(&mut self) -> Option<PathBuf> {
        let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(self.device()).output();
        match mkfs {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!("mkfs.ext4 on {}: {}", self.device().display(), String::from_utf8_lossy(&out.stderr)),
            Err(e) => {
                skip(&format!("ext4 on zram not tested: mkfs.ext4: {e}"));
                return None;
            }
        }
        let at = self._dir.file("mnt");
        std::fs::create_dir_all(&at).expect("mount point");
        let out = Command::new("mount").arg(self.device()).arg(&at).output().expect("running mount");
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
        self.mounted = Some(at.clone());
        Some(at)
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        if let Some(at) = &self.mounted {
            let _ = Command::new("umount").arg(at).output();
        }
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write(format!("{CONTROL}/hot_remove"), self.id.to_string());
    }
}

/// Writes `LEN` bytes from each sub-page offset of pinned memory to offset 0
/// of `target`, checks them with pread(2), then reads them back into the
/// same offset of zeroed pinned memory.
fn round_trip_from_sub_page_memory(target: &Path, what: &str) {
    for engine in engines() {
        for parallelism in [1, 2] {
            let h = handle_with(engine, 1 << 20, 8, false, true, parallelism);
            for off in SUB_PAGE_OFFSETS {
                let case = format!("{what}, {engine:?}, parallelism {parallelism}, memory at page + {off}");
                let data = pattern(off as u64 + parallelism as u64, 2 * LEN);
                let src = Pinned::with(&data);
                let wrote = ds::pwrite(&h, src.narrow(off, LEN), FileTarget::Path(target), 0, false);
                assert_eq!(wrote.unwrap_or_else(|e| panic!("{case}: write: {e}")), 1);
                let mut got = vec![0u8; LEN];
                File::open(target).unwrap().read_exact_at(&mut got, 0).expect("pread(2) of the target");
                assert_bytes_eq(&got, &data[off..off + LEN], &format!("{case}: the bytes written"));

                let dst = Pinned::with(&vec![0u8; 2 * LEN]);
                let read = ds::pread(&h, dst.narrow(off, LEN), FileTarget::Path(target), 0, false);
                assert_eq!(read.unwrap_or_else(|e| panic!("{case}: read: {e}")), 1);
                assert_bytes_eq(&dst.as_slice()[off..off + LEN], &data[off..off + LEN], &format!("{case}: the bytes read"));
                assert!(dst.as_slice()[..off].iter().all(|&b| b == 0), "{case}: bytes before the slice were written");
            }
        }
    }
}

#[test]
fn sub_page_pinned_memory_moves_the_right_bytes_on_a_zram_device() {
    let Some(zram) = Zram::for_test("zram-dev") else { return };
    round_trip_from_sub_page_memory(&zram.device(), "the zram device node");
}

#[test]
fn sub_page_pinned_memory_moves_the_right_bytes_on_ext4_on_zram() {
    let Some(mut zram) = Zram::for_test("zram-ext4") else { return };
    let Some(mnt) = zram.mount_ext4() else { return };
    let file = mnt.join("f.bin");
    std::fs::write(&file, vec![0u8; 2 * LEN]).expect("laying out the file");
    round_trip_from_sub_page_memory(&file, "a file of ext4 on zram");
}
