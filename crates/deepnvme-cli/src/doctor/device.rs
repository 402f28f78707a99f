//! The `device` section, for each folder: the block device under it, from
//! sysfs (`/sys/dev/block/MAJ:MIN`, its whole disk, and through
//! device-mapper, md and loop devices to what they sit on): model,
//! transport (NVMe, virtio, SCSI/SATA, ...), rotational, the I/O scheduler,
//! `nr_requests` against the requests the config keeps in flight, and the
//! I/O limits a cgroup puts on this process for it (`cgroup`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::filesystem::{mount_of, Mount};
use super::report::Finding;
use super::{cgroup, Context, Target};
use crate::args::fmt_size_approx;

const SECTION: &str = "device";

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// A whole disk in /sys/block.
#[derive(Clone, Debug)]
struct Disk {
    name: String,
    sys: PathBuf,
    /// The partition the file system is on, when it is one.
    partition: Option<String>,
}

impl Disk {
    fn attr(&self, rel: &str) -> Option<String> {
        read(self.sys.join(rel))
    }
    fn queue(&self, attr: &str) -> Option<String> {
        self.attr(&format!("queue/{attr}"))
    }
    fn queue_number(&self, attr: &str) -> Option<u64> {
        self.queue(attr)?.parse().ok()
    }
    /// Devices this one is built on (device-mapper, md).
    fn slaves(&self) -> Vec<String> {
        std::fs::read_dir(self.sys.join("slaves"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }
    /// The subsystem of the device behind it: "nvme", "virtio", "scsi", ...
    fn subsystem(&self) -> Option<String> {
        let link = std::fs::read_link(self.sys.join("device/subsystem")).ok()?;
        Some(link.file_name()?.to_string_lossy().into_owned())
    }
}

/// The whole disk holding device `maj:min`.
fn disk_of(maj: u32, min: u32) -> Option<Disk> {
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")).ok()?;
    let name = sys.file_name()?.to_string_lossy().into_owned();
    if sys.join("partition").exists() {
        let parent = sys.parent()?.to_path_buf();
        let disk = parent.file_name()?.to_string_lossy().into_owned();
        Some(Disk { name: disk, sys: parent, partition: Some(name) })
    } else {
        Some(Disk { name, sys, partition: None })
    }
}

fn disk_named(name: &str) -> Option<Disk> {
    let sys = std::fs::canonicalize(format!("/sys/class/block/{name}")).ok()?;
    let dev = read(sys.join("dev"))?;
    let (maj, min) = dev.split_once(':')?;
    disk_of(maj.parse().ok()?, min.parse().ok()?)
}

/// The device number of the file system holding `dir`: its mount's source
/// device when that is a /dev node (btrfs reports anonymous st_dev
/// numbers), an overlay's upper layer's, else `st_dev`.
fn device_number(dir: &Path, mount: Option<&Mount>) -> Option<(u32, u32)> {
    if let Some(m) = mount {
        if m.source.starts_with("/dev/") {
            if let Ok(meta) = std::fs::metadata(&m.source) {
                let rdev = meta.rdev();
                return Some((libc::major(rdev), libc::minor(rdev)));
            }
        }
        if m.fstype == "overlay" {
            if let Some(upper) = m.option("upperdir") {
                let dev = std::fs::metadata(upper).ok()?.dev();
                return Some((libc::major(dev), libc::minor(dev)));
            }
        }
    }
    let dev = std::fs::metadata(dir).ok()?.dev();
    Some((libc::major(dev), libc::minor(dev)))
}

/// What kind of device, with its model, in a phrase; and whether its
/// "rotational" flag means anything (virtio and loop devices say 1 by default).
fn describe(d: &Disk) -> (String, &'static str) {
    let model = d.attr("device/model");
    let sub = d.subsystem();
    let n = &d.name;
    if n.starts_with("nvme") {
        let transport = d.attr("device/transport").unwrap_or_else(|| "pcie".into());
        let fw = d.attr("device/firmware_rev").map(|f| format!(", firmware {f}")).unwrap_or_default();
        (format!("NVMe over {transport}, model {}{fw}", model.as_deref().unwrap_or("unknown")), "nvme")
    } else if sub.as_deref() == Some("virtio") || n.starts_with("vd") {
        let ids = format!(
            "vendor {} device {}",
            d.attr("device/vendor").unwrap_or_else(|| "?".into()),
            d.attr("device/device").unwrap_or_else(|| "?".into())
        );
        (format!("virtio-blk, a virtual disk ({ids})"), "virtio")
    } else if n.starts_with("loop") {
        let back = d.attr("loop/backing_file").unwrap_or_else(|| "?".into());
        let dio = d.attr("loop/dio").unwrap_or_else(|| "0".into());
        (format!("loop device over {back} (direct I/O {})", if dio == "1" { "on" } else { "off" }), "loop")
    } else if n.starts_with("dm-") || n.starts_with("md") {
        let dm = d.attr("dm/name").map(|m| format!(" {m}")).unwrap_or_default();
        let kind = if n.starts_with("dm-") { "device-mapper (LVM, dm-crypt, ...)" } else { "md RAID" };
        (format!("{kind}{dm} over {}", d.slaves().join(", ")), "stacked")
    } else if sub.as_deref() == Some("scsi") || n.starts_with("sd") {
        let vendor = d.attr("device/vendor").map(|v| format!("{v} ")).unwrap_or_default();
        (format!("SCSI/SATA/SAS disk, model {vendor}{}", model.as_deref().unwrap_or("unknown")), "scsi")
    } else if n.starts_with("zram") {
        ("zram, compressed RAM".into(), "memory")
    } else {
        (
            format!(
                "{} device{}",
                sub.as_deref().unwrap_or("block"),
                model.map(|m| format!(", model {m}")).unwrap_or_default()
            ),
            "other",
        )
    }
}

/// `[mq-deadline] none` -> "mq-deadline".
fn active_scheduler(s: &str) -> Option<&str> {
    s.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// What the doctor knows of a folder's device: what the device section
/// reports and the bench's speed finding weighs.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// "nvme", "virtio", "scsi", "loop", "stacked", "memory", "other"; None
    /// without a block device.
    pub kind: Option<&'static str>,
    pub name: String,
    /// The device doing the I/O spins (virtio and loop devices' flag says nothing).
    pub rotational: bool,
    /// The cgroup limits on it.
    pub limits: Vec<cgroup::Limit>,
    /// The GB/s a device of its kind moves at the least, and why (see [`floor`]).
    pub floor: Option<(f64, String)>,
    found: Found,
}

#[derive(Clone, Debug, Default)]
enum Found {
    /// The folder's device number could not be read.
    #[default]
    Unreadable,
    /// A file system without a block device (tmpfs, NFS, ...).
    NoDisk {
        fstype: String,
        maj: u32,
        min: u32,
    },
    Disk(Located),
}

#[derive(Clone, Debug)]
struct Located {
    /// The whole disk holding the folder, and what it is in a phrase.
    disk: Disk,
    what: String,
    /// `MAJ:MIN` of the file system's device and of its whole disk.
    devices: Vec<String>,
    /// The device that does the I/O: `disk`, or the first device a
    /// device-mapper or md device sits on; and its kind.
    io: Disk,
    io_kind: &'static str,
}

/// An NVMe drive's floor: any PCIe 3 drive moves more than this in 1 MiB
/// transfers, reads and writes.
pub const NVME_FLOOR_GBPS: f64 = 1.0;

/// The floor of a device of `kind` (see docs/doctor.md): an NVMe drive's
/// for NVMe (directly or under device-mapper or md); a loop device's is
/// that of the device under its backing file; other kinds (virtio, SCSI,
/// SATA, zram) have none, their speed being their host's or their model's.
fn floor(io: &Disk, io_kind: &str, depth: u32) -> Option<(f64, String)> {
    match io_kind {
        "nvme" => Some((
            NVME_FLOOR_GBPS,
            format!("an NVMe drive's floor: {} is one, and any PCIe 3 drive moves more in 1 MiB transfers", io.name),
        )),
        "loop" if depth < 4 => {
            let backing = PathBuf::from(io.attr("loop/backing_file")?);
            let under = facts_at(backing.parent()?, depth + 1);
            under.floor.map(|(g, why)| (g, format!("{why}; it holds {}'s backing file", io.name)))
        }
        _ => None,
    }
}

/// The device under `dir` (whole disk and partition numbers, for limits).
pub fn facts(dir: &Path) -> Facts {
    facts_at(dir, 0)
}

fn facts_at(dir: &Path, depth: u32) -> Facts {
    let mount = mount_of(dir);
    let Some((maj, min)) = device_number(dir, mount.as_ref()) else { return Facts::default() };
    let Some(disk) = disk_of(maj, min) else {
        let fstype = mount.map(|m| m.fstype).unwrap_or_else(|| "?".into());
        return Facts { found: Found::NoDisk { fstype, maj, min }, ..Facts::default() };
    };
    let (what, kind) = describe(&disk);
    let first = format!("{maj}:{min}");
    let whole = disk.attr("dev").filter(|d| *d != first);
    let devices: Vec<String> = [first].into_iter().chain(whole).collect();
    let io = match kind {
        "stacked" => disk.slaves().first().and_then(|s| disk_named(s)),
        _ => None,
    }
    .unwrap_or_else(|| disk.clone());
    let io_kind = describe(&io).1;
    Facts {
        kind: Some(kind),
        name: disk.name.clone(),
        rotational: io.queue("rotational").as_deref() == Some("1") && !matches!(io_kind, "virtio" | "loop"),
        limits: cgroup::limits(&devices),
        floor: floor(&io, io_kind, depth),
        found: Found::Disk(Located { disk, what, devices, io, io_kind }),
    }
}

/// "write bytes/s 50 MB/s" etc.
pub fn fmt_limit(l: &cgroup::Limit) -> String {
    match l.bytes_per_s() {
        Some(b) => format!("{} {:.3} GB/s ({} B/s)", l.what.trim_end_matches(" bytes/s"), b as f64 / 1e9, b),
        None => format!("{} {}", l.what, l.value),
    }
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    ctx.per_target(check_target)
}

pub fn check_target(ctx: &Context, t: &Target) -> Vec<Finding> {
    let facts = facts(&t.probe_dir);
    let located = match &facts.found {
        Found::Unreadable => {
            return vec![Finding::warn(SECTION, "device", "unknown")
                .why("the directory's device number could not be read")
                .fix("check that the directory is readable by this user")]
        }
        Found::NoDisk { fstype, maj, min } => {
            return vec![Finding::ok(SECTION, "device", format!("none: {fstype} has no block device ({maj}:{min})"))
                .why("nothing to check below the file system (see the filesystem section)")]
        }
        Found::Disk(located) => located,
    };
    let Located { disk, what, devices, .. } = located;
    let kind = facts.kind.unwrap_or("other");
    let limits = &facts.limits;
    let mut out = Vec::new();
    let size = disk.attr("size").and_then(|s| s.parse::<u64>().ok()).map(|sectors| fmt_size_approx(sectors * 512));
    let part = disk.partition.as_ref().map(|p| format!(" (partition {p})")).unwrap_or_default();
    let summary = format!("{}{part}: {what}{}", disk.name, size.map(|s| format!(", {s}")).unwrap_or_default());
    out.push(match kind {
        "loop" => Finding::warn(SECTION, "device", summary)
            .why(
                "a file used as a disk: its speed is that of the backing file's file system, and without direct I/O \
                  every request also passes through the page cache",
            )
            .fix("put nvme_path on the drive's own file system instead"),
        "memory" => Finding::warn(SECTION, "device", summary)
            .why("compressed RAM, not a drive")
            .fix("put nvme_path on the NVMe drive's own file system"),
        "virtio" => Finding::ok(SECTION, "device", summary)
            .why("a virtual machine's disk: its speed is the host's backing store"),
        _ => Finding::ok(SECTION, "device", summary),
    });
    // Properties below are those of the device that does the I/O.
    let (disk, kind) = (&located.io, located.io_kind);

    if let Some(rot) = disk.queue("rotational") {
        out.push(match (rot.as_str(), kind) {
            ("1", "virtio" | "loop") => Finding::ok(SECTION, "rotational", format!("{}: 1", disk.name))
                .why("virtio and loop devices say 1 unless told otherwise: it says nothing about the disk behind"),
            ("1", _) => Finding::warn(SECTION, "rotational", format!("{}: 1, a spinning disk", disk.name))
                .why("a hard disk moves ~200 MB/s and seeks between swap files: NVMe offload will crawl")
                .fix("put nvme_path on an NVMe (or at least SSD) file system"),
            _ => Finding::ok(SECTION, "rotational", format!("{}: {rot}", disk.name)),
        });
    }

    if let Some(all) = disk.queue("scheduler") {
        let active = active_scheduler(&all).unwrap_or(all.as_str()).to_string();
        let fix = format!("echo none > /sys/block/{}/queue/scheduler (a udev rule keeps it)", disk.name);
        out.push(match (active.as_str(), kind) {
            ("none", _) => Finding::ok(SECTION, "scheduler", "none").why("requests go straight to the device"),
            (s, "nvme") => Finding::warn(SECTION, "scheduler", s.to_string())
                .why("an NVMe drive orders its own queues: a scheduler only adds CPU and latency at high queue depth")
                .fix(fix),
            ("bfq", _) => Finding::warn(SECTION, "scheduler", "bfq")
                .why(
                    "bfq trades throughput for fairness and costs CPU per request: deep queues of large \
                      requests suffer",
                )
                .fix(fix),
            (s, _) => Finding::ok(SECTION, "scheduler", s.to_string()),
        });
    }

    if let Some(nr) = disk.queue_number("nr_requests") {
        let aio = ctx.aio();
        let max_kb = disk.queue_number("max_sectors_kb").unwrap_or(512).max(4);
        let pieces = (aio.block_size as u64).div_ceil(max_kb * 1024);
        let per_worker = aio.queue_depth as u64 * pieces;
        let handles = ctx.config.as_ref().map(|c| c.handles()).filter(|h| *h > 0).unwrap_or(1) as u64;
        let total = per_worker * aio.intra_op_parallelism as u64 * handles;
        let hw = std::fs::read_dir(disk.sys.join("mq")).map(|d| d.count() as u64).unwrap_or(1).max(1);
        let split = if pieces > 1 {
            format!(" ({} B blocks split into {pieces} requests of max_sectors_kb {max_kb})", aio.block_size)
        } else {
            String::new()
        };
        let summary = format!("nr_requests {nr} per hardware queue, {hw} hardware queue(s)");
        let why = format!(
            "queue_depth {} x {pieces} request(s) per block = {per_worker} per worker{split}; {} worker(s) x {handles} \
             handle(s) = {total} in flight in all",
            aio.queue_depth, aio.intra_op_parallelism
        );
        let raise = format!(
            "echo {} > /sys/block/{}/queue/nr_requests (as root; the driver caps it), or lower aio.queue_depth",
            per_worker.max(total.div_ceil(hw)).next_power_of_two(),
            disk.name
        );
        out.push(if per_worker > nr {
            Finding::warn(SECTION, "queue", summary)
                .why(format!(
                    "{why}: one worker alone has more requests than a hardware queue takes, so the rest wait in \
                     the kernel"
                ))
                .fix(raise)
        } else if total > nr * hw {
            Finding::warn(SECTION, "queue", summary)
                .why(format!("{why}: more than all hardware queues take ({}), so some wait in the kernel", nr * hw))
                .fix(raise)
        } else {
            Finding::ok(SECTION, "queue", summary).why(format!("{why}: the device takes them all"))
        });
    }

    if !limits.is_empty() {
        let list: Vec<String> = limits.iter().map(fmt_limit).collect();
        let files: Vec<String> = limits.iter().map(|l| l.file.display().to_string()).collect();
        let lifts: Vec<String> = limits.iter().map(cgroup::Limit::lift).collect();
        out.push(
            Finding::warn(
                SECTION,
                "cgroup limit",
                format!("{}: throttled by a cgroup: {}", disk.name, list.join(", ")),
            )
            .why(format!(
                "this process's cgroup caps its I/O on {} ({}); a job started the same way is capped too, \
                     whatever the drive can do",
                devices.join(", "),
                files.join(", ")
            ))
            .fix(format!(
                "run the job outside that limit: as root {} (or drop the limit where it is set: docker \
                     --device-read-bps/--device-write-bps, systemd IOReadBandwidthMax=/IOWriteBandwidthMax=, the \
                     batch system's I/O limits)",
                lifts.join("; ")
            )),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedulers() {
        assert_eq!(active_scheduler("none [mq-deadline] kyber bfq"), Some("mq-deadline"));
        assert_eq!(active_scheduler("[none] mq-deadline"), Some("none"));
        assert_eq!(active_scheduler("none"), None);
    }

    /// The checkout's own disk is found in sysfs, with a queue.
    #[test]
    fn the_checkouts_disk() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mount = mount_of(dir);
        let (maj, min) = device_number(dir, mount.as_ref()).unwrap();
        if maj == 0 {
            eprintln!("skipped: the checkout is on {:?}, which has no block device", mount.map(|m| m.fstype));
            return;
        }
        let disk = disk_of(maj, min).expect("the device is in /sys/dev/block");
        assert!(disk.sys.join("queue").is_dir(), "{disk:?}");
        assert!(disk.queue_number("nr_requests").is_some_and(|n| n > 0));
    }
}
