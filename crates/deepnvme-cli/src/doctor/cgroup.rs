//! I/O limits a cgroup puts on this process for one block device: cgroup
//! v1's `blkio.throttle.{read,write}_{bps,iops}_device` and cgroup v2's
//! `io.max`, in this process's cgroup and every ancestor (a parent's limit
//! applies to its children). What containers (`docker run
//! --device-write-bps`), systemd (`IOWriteBandwidthMax=`) and batch
//! systems set; a job started the same way inherits them.

use std::path::{Path, PathBuf};

/// One limit on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// "read bytes/s", "write bytes/s", "read IOPS", "write IOPS".
    pub what: &'static str,
    pub value: u64,
    /// The file that sets it (write `MAJ:MIN 0` to v1's, `max` to v2's, to lift it).
    pub file: PathBuf,
    /// `MAJ:MIN`.
    pub device: String,
    pub v2: bool,
}

impl Limit {
    pub fn bytes_per_s(&self) -> Option<u64> {
        self.what.ends_with("bytes/s").then_some(self.value)
    }
    /// The command that lifts it (as root).
    pub fn lift(&self) -> String {
        if self.v2 {
            let key = match self.what {
                "read bytes/s" => "rbps",
                "write bytes/s" => "wbps",
                "read IOPS" => "riops",
                _ => "wiops",
            };
            format!("echo '{} {key}=max' > {}", self.device, self.file.display())
        } else {
            format!("echo '{} 0' > {}", self.device, self.file.display())
        }
    }
}

/// This process's cgroup paths: (v1 blkio path, v2 path).
fn own_cgroups() -> (Option<String>, Option<String>) {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "blkio") {
            v1 = Some(path.to_string());
        } else if controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    (v1, v2)
}

/// `dir` and its ancestors up to `root`.
fn chain(root: &Path, rel: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut p = root.join(rel.trim_start_matches('/'));
    loop {
        out.push(p.clone());
        if p == root || !p.pop() || !p.starts_with(root) {
            break;
        }
    }
    out
}

/// The limits on any of `devices` (`MAJ:MIN`).
pub fn limits(devices: &[String]) -> Vec<Limit> {
    let (v1, v2) = own_cgroups();
    let mut out = Vec::new();
    if let Some(rel) = v1 {
        let root = Path::new("/sys/fs/cgroup/blkio");
        for dir in chain(root, &rel) {
            for (file, what) in [
                ("blkio.throttle.read_bps_device", "read bytes/s"),
                ("blkio.throttle.write_bps_device", "write bytes/s"),
                ("blkio.throttle.read_iops_device", "read IOPS"),
                ("blkio.throttle.write_iops_device", "write IOPS"),
            ] {
                let path = dir.join(file);
                for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                    let mut it = line.split_whitespace();
                    let (Some(dev), Some(v)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else {
                        continue;
                    };
                    if devices.iter().any(|d| d == dev) && v > 0 {
                        out.push(Limit { what, value: v, file: path.clone(), device: dev.to_string(), v2: false });
                    }
                }
            }
        }
    }
    if let Some(rel) = v2 {
        for root in [Path::new("/sys/fs/cgroup/unified"), Path::new("/sys/fs/cgroup")] {
            if !root.join("cgroup.controllers").exists() {
                continue;
            }
            for dir in chain(root, &rel) {
                let path = dir.join("io.max");
                for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                    let mut it = line.split_whitespace();
                    let Some(dev) = it.next().filter(|d| devices.iter().any(|x| x == d)) else { continue };
                    for kv in it {
                        let Some((k, v)) = kv.split_once('=') else { continue };
                        let Ok(v) = v.parse::<u64>() else { continue };
                        let what = match k {
                            "rbps" => "read bytes/s",
                            "wbps" => "write bytes/s",
                            "riops" => "read IOPS",
                            "wiops" => "write IOPS",
                            _ => continue,
                        };
                        out.push(Limit { what, value: v, file: path.clone(), device: dev.to_string(), v2: true });
                    }
                }
            }
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_up_to_the_root() {
        let root = Path::new("/sys/fs/cgroup/blkio");
        assert_eq!(chain(root, "/"), vec![root.to_path_buf()]);
        assert_eq!(chain(root, "/a/b"), vec![root.join("a/b"), root.join("a"), root.to_path_buf()]);
    }

    #[test]
    fn lifting_a_limit() {
        let l = Limit {
            what: "write bytes/s",
            value: 1,
            file: "/x/blkio.throttle.write_bps_device".into(),
            device: "7:0".into(),
            v2: false,
        };
        assert_eq!(l.lift(), "echo '7:0 0' > /x/blkio.throttle.write_bps_device");
        let v2 = Limit { v2: true, file: "/x/io.max".into(), ..l };
        assert_eq!(v2.lift(), "echo '7:0 wbps=max' > /x/io.max");
    }
}
