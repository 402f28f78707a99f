//! A zram device of a test's own (root only), for the tests of zram's
//! O_DIRECT quirk (`src/file/device_quirks.rs`): the core's and the CLI's.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{skip, TempDir};

const CONTROL: &str = "/sys/class/zram-control";
const DEV_SIZE: &str = "64M";

/// A zram device of its own, reset and removed on drop (also when the test
/// panics), with an ext4 file system mounted on it once `mount_ext4` ran.
pub struct Zram {
    id: u32,
    mounted: Option<PathBuf>,
    _dir: TempDir,
}

impl Zram {
    /// A fresh device, or `Err(why)` when this machine has none to give.
    pub fn add(tag: &str) -> Result<Zram, String> {
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

    pub fn for_test(tag: &str) -> Option<Zram> {
        Zram::add(tag).map_err(|why| skip(&format!("zram test {tag} not run: {why}"))).ok()
    }

    pub fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.id))
    }

    /// Makes ext4 on the device and mounts it; `None` after saying why not.
    pub fn mount_ext4(&mut self) -> Option<PathBuf> {
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

