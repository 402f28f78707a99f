//! The `filesystem` section, for each folder: whether DeepSpeed can create
//! it (it does, with `os.makedirs`), the mount holding it (from
//! /proc/self/mountinfo: type, source, options; read-only named as such),
//! whether O_DIRECT works there (a real aligned write and read, and whether
//! the kernel honours it: ext4 `data=journal` silently buffers it), the
//! `statx` O_DIRECT alignment against the aio block size, and free space
//! against the swap files that folder gets. tmpfs (RAM), overlayfs (a
//! container's layer), network and FUSE file systems are named, with what
//! to use instead.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::report::Finding;
use super::{Context, Target};
use crate::args::{fmt_size, fmt_size_approx};
use crate::core_api::{self, LockMode, PageAlignedBuffer};
use crate::info::{probe_dio, Dio};

const SECTION: &str = "filesystem";

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub dev: (u32, u32),
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    /// The mount's options and the super block's, comma-separated.
    pub options: String,
}

impl Mount {
    /// The value of option `key=` (e.g. overlayfs's `upperdir`).
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.split(',').find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo: `id parent maj:min root mount_point options [optional...] - fstype source super_options`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (maj, min) = l.get(2)?.split_once(':')?;
            Some(Mount {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                mount_point: PathBuf::from(unescape(l.get(4)?)),
                fstype: r.first()?.to_string(),
                source: unescape(r.get(1).unwrap_or(&"")),
                options: format!("{},{}", l.get(5).unwrap_or(&""), r.get(2).unwrap_or(&"")),
            })
        })
        .collect()
}

/// The mount that holds `path` (an existing path): the last mount listed
/// (the one on top) of the file's device whose mount point contains it.
pub fn mount_of(path: &Path) -> Option<Mount> {
    let path = std::fs::canonicalize(path).ok()?;
    let dev = std::fs::metadata(&path).ok()?.dev();
    // SAFETY: major/minor only decode the number.
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?);
    let holds = |m: &&Mount| path.starts_with(&m.mount_point);
    let best = |same_dev: bool| {
        mounts
            .iter()
            .filter(holds)
            .filter(|m| !same_dev || m.dev == (maj, min))
            .max_by_key(|m| m.mount_point.as_os_str().len())
            .cloned()
    };
    // btrfs subvolumes report another st_dev than mountinfo: then the
    // longest mount point alone decides.
    best(true).or_else(|| best(false))
}

/// Free bytes for an unprivileged writer (`f_bavail`), and the total.
pub fn space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills a zeroed struct from a valid C string.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) != 0 {
            return None;
        }
        Some((s.f_bavail as u64 * s.f_frsize as u64, s.f_blocks as u64 * s.f_frsize as u64))
    }
}

/// An aligned O_DIRECT write and read of `len` bytes through a new temp
/// file in `dir` (removed at once): open alone can succeed where writes
/// then fail with EINVAL. The error carries the errno when there is one.
fn direct_round_trip(dir: &Path, len: usize) -> Result<(), (String, Option<i32>)> {
    let path = dir.join(format!(".deepnvme-doctor-{}.tmp", std::process::id()));
    let os = |what: String, e: std::io::Error| (format!("{what}: {e}"), e.raw_os_error());
    let result = (|| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .map_err(|e| os("open(O_DIRECT)".into(), e))?;
        let buf = PageAlignedBuffer::new(len, LockMode::None).map_err(|e| (e.to_string(), None))?;
        // SAFETY: the mapping is `len` bytes we own.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), len) };
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8 ^ 0x5a);
        // SAFETY: pwrite/pread of our own buffer and descriptor.
        let wrote = unsafe { libc::pwrite(f.as_raw_fd(), buf.as_ptr() as *const libc::c_void, len, 0) };
        if wrote != len as isize {
            return Err(os(format!("aligned O_DIRECT write of {len} B"), std::io::Error::last_os_error()));
        }
        bytes.fill(0);
        // SAFETY: as above.
        let read = unsafe { libc::pread(f.as_raw_fd(), buf.as_ptr() as *mut libc::c_void, len, 0) };
        if read != len as isize || bytes.iter().enumerate().any(|(i, b)| *b != i as u8 ^ 0x5a) {
            return Err((format!("aligned O_DIRECT read of {len} B did not return the bytes written"), None));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// What kind of file system `fstype` is, for the doctor's purpose.
enum Kind {
    Disk,
    Memory,
    Overlay,
    Remote,
    Limited(&'static str),
}

fn kind(fstype: &str) -> Kind {
    match fstype {
        "tmpfs" | "ramfs" | "devtmpfs" | "hugetlbfs" => Kind::Memory,
        "overlay" | "aufs" | "unionfs" => Kind::Overlay,
        t if t.starts_with("fuse") || t.starts_with("nfs") => Kind::Remote,
        "cifs" | "smb3" | "9p" | "virtiofs" | "ceph" | "glusterfs" | "afs" => Kind::Remote,
        "vfat" | "msdos" => Kind::Limited("vfat keeps files under 4 GiB, so larger swap files fail"),
        "zfs" => Kind::Limited("ZFS before 2.3 ignores O_DIRECT (the ARC caches every transfer)"),
        _ => Kind::Disk,
    }
}

/// The file system's own finding.
fn fs_finding(m: &Mount, where_: &str) -> Finding {
    let what = format!("{} ({} on {})", m.fstype, m.source, m.mount_point.display());
    let elsewhere = format!(
        "point nvme_path (and --dir) at a directory on the NVMe drive's own file system (ext4 or xfs); \
         {where_} is on {}",
        m.fstype
    );
    match kind(&m.fstype) {
        Kind::Disk => Finding::ok(SECTION, "type", what).why("a disk file system"),
        Kind::Memory => Finding::fail(SECTION, "type", what)
            .why(format!(
                "{} keeps files in RAM (and swap): offloading to it uses the memory offload is meant to free, \
                 and nothing reaches an NVMe drive",
                m.fstype
            ))
            .fix(elsewhere),
        Kind::Overlay => {
            let upper = m.option("upperdir").map(|u| format!(" (upper layer {u})")).unwrap_or_default();
            Finding::warn(SECTION, "type", what)
                .why(format!(
                    "an overlay{upper}, as a container's root: files land in the container's writable layer, \
                     with its space and speed, and are lost with the container"
                ))
                .fix(format!(
                    "mount the NVMe file system into the container (docker run -v /nvme:/nvme) and {elsewhere}"
                ))
        }
        Kind::Remote => Finding::warn(SECTION, "type", what)
            .why(format!("{} is a network or FUSE file system: O_DIRECT and speed are the server's", m.fstype))
            .fix(elsewhere),
        Kind::Limited(why) => Finding::warn(SECTION, "type", what).why(why).fix(elsewhere),
    }
}

/// The bytes the run writes in `t`, and what they are.
pub(super) fn needed(ctx: &Context, t: &Target) -> (u64, String) {
    let mut need = 0;
    let mut what = Vec::new();
    if let Some(cfg) = ctx.config.as_ref().filter(|c| c.swaps()) {
        for o in cfg.offloads().filter(|o| o.nvme_path.as_deref() == Some(t.path.as_path())) {
            match cfg.swap_files(&ctx.model, Some(o.block)) {
                Some(e) => {
                    need += e.total();
                    what.push(format!("the swap files (estimate: {})", e.describe()));
                }
                // At least the parameters that fill the swap buffers go to files.
                None if o.block.ends_with("offload_param") => {
                    let b = o.buffer_count * o.buffer_size * cfg.model_dtype_bytes;
                    need += b;
                    what.push(format!(
                        "the parameters that fill the swap buffers ({}; pass --model-params for the whole model)",
                        fmt_size_approx(b)
                    ));
                }
                None => {}
            }
        }
    }
    if ctx.runs("bench") {
        need = need.max(ctx.bench_size);
        what.push(format!("the bench file ({})", fmt_size(ctx.bench_size)));
    }
    if what.is_empty() {
        what.push("a probe file".into());
        need = need.max(1 << 20);
    }
    (need, what.join(" and "))
}

/// Whether this user may create entries in `dir`.
fn writable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: access() reads a valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The folder itself: there, or creatable by DeepSpeed's os.makedirs.
fn folder_finding(t: &Target, mount: Option<&Mount>) -> Option<Finding> {
    if t.probe_dir == t.path {
        return None;
    }
    if t.path.exists() {
        return Some(
            Finding::fail(SECTION, "folder", format!("{} is not a folder", t.path.display()))
                .why(
                    "DeepSpeed's os.makedirs(nvme_path/zero_stage_3/...) fails with FileExistsError or \
                     NotADirectoryError",
                )
                .fix(format!("point {} at a folder", t.key())),
        );
    }
    let summary = format!("{} does not exist yet", t.path.display());
    let read_only = mount.is_some_and(is_read_only);
    Some(match writable(&t.probe_dir) {
        Ok(()) if !read_only => Finding::ok(SECTION, "folder", summary).why(format!(
            "DeepSpeed creates it (os.makedirs, with zero_stage_3/...); {} is writable, and was checked in its place",
            t.probe_dir.display()
        )),
        r => Finding::fail(SECTION, "folder", summary)
            .why(format!(
                "DeepSpeed's os.makedirs cannot create it: {} is {}",
                t.probe_dir.display(),
                if read_only {
                    "on a read-only mount".to_string()
                } else {
                    format!("not writable by this user ({})", r.err().map(|e| e.to_string()).unwrap_or_default())
                }
            ))
            .fix(format!(
                "as root: mkdir -p {0} && chown $USER {0}, or point nvme_path at a folder this user can create",
                t.path.display()
            )),
    })
}

fn is_read_only(m: &Mount) -> bool {
    m.options.split(',').next() == Some("ro")
}

/// ext4's `data=journal` (a mount option, or the file system's default
/// mount options, which mountinfo shows): the kernel then serves O_DIRECT
/// through the page cache.
fn journals_data(m: &Mount) -> bool {
    m.fstype == "ext4" && m.options.split(',').any(|o| o == "data=journal")
}

pub fn check_target(ctx: &Context, t: &Target) -> Vec<Finding> {
    let dir = &t.probe_dir;
    let mut out = Vec::new();
    let mount = mount_of(dir);
    out.extend(folder_finding(t, mount.as_ref()));
    let where_ = t.path.display().to_string();
    match &mount {
        Some(m) => out.push(fs_finding(m, &where_)),
        None => out.push(
            Finding::warn(SECTION, "type", "unknown")
                .why("the directory is in no mount of /proc/self/mountinfo")
                .fix("check that /proc is mounted and the directory exists"),
        ),
    }
    if let Some(m) = mount.as_ref().filter(|m| is_read_only(m)) {
        out.push(
            Finding::fail(
                SECTION,
                "read-only",
                format!("{} is mounted read-only ({} on {})", where_, m.source, m.mount_point.display()),
            )
            .why("DeepSpeed cannot create its swap folder or write a swap file there (EROFS)")
            .fix(format!(
                "as root: mount -o remount,rw {} (and fix its line in /etc/fstab), or point nvme_path at a \
                     writable file system",
                m.mount_point.display()
            )),
        );
        return out;
    }

    // O_DIRECT: the probe the `info` command makes, then a real transfer.
    let dio = probe_dio(dir);
    let unit = match &dio {
        Dio::Aligned { offset, memory, .. } => (*offset).max(*memory).max(core_api::page_size()),
        _ => core_api::page_size(),
    };
    let round_trip = direct_round_trip(dir, unit);
    let full = |errno: Option<i32>| errno == Some(libc::ENOSPC) || errno == Some(libc::EDQUOT);
    let journal = mount.as_ref().is_some_and(journals_data);
    out.push(match (&dio, &round_trip) {
        (Dio::Aligned { .. }, Ok(())) => {
            Finding::ok(SECTION, "O_DIRECT", format!("works (an aligned {unit} B write and read)"))
        }
        (_, Err((why, errno))) if full(*errno) => {
            Finding::warn(SECTION, "O_DIRECT", "not tested: the file system is full")
                .why(why.clone())
                .fix("free space on that file system (see free space below)")
        }
        (_, Err((why, Some(e)))) if *e == libc::EROFS => Finding::fail(SECTION, "O_DIRECT", "not tested: read-only")
            .why(format!("{why}: the file system refuses writes"))
            .fix("remount it read-write, or point nvme_path at a writable file system"),
        (Dio::Unknown(why), _) | (_, Err((why, Some(libc::EACCES | libc::EPERM)))) => {
            Finding::fail(SECTION, "O_DIRECT", "not tested: this user cannot create a file here")
                .why(format!("{why}; DeepSpeed could not write its swap files either"))
                .fix(format!("chown or chmod {where_} for the user that runs the job, or choose another folder"))
        }
        (Dio::Unsupported, Ok(())) if journal => Finding::warn(
            SECTION,
            "O_DIRECT",
            "accepted but not honoured: ext4 mounted data=journal",
        )
        .why(
            "with data=journal ext4 journals file data, so it serves O_DIRECT through the page cache (statx reports \
             no direct-I/O alignment): every swap is a buffered copy, with the RAM of the cache and the speed of \
             journal writeback",
        )
        .fix(format!(
            "mount it data=ordered (the default): change data=journal in /etc/fstab for {}, then umount and mount \
             (ext4 cannot switch on remount); if tune2fs -l shows journal_data in its default mount options, \
             tune2fs -o ^journal_data {}",
            mount.as_ref().map(|m| m.mount_point.display().to_string()).unwrap_or_default(),
            mount.as_ref().map(|m| m.source.clone()).unwrap_or_default()
        )),
        (Dio::Unsupported, Ok(())) => Finding::warn(SECTION, "O_DIRECT", "accepted but not honoured")
            .why(
                "open(O_DIRECT) and aligned transfers work, but statx reports no direct-I/O alignment: the file \
                 system serves them through the page cache (buffered I/O)",
            )
            .fix(format!("use a file system with O_DIRECT (ext4 data=ordered, xfs) for {where_}")),
        (_, r) => Finding::warn(SECTION, "O_DIRECT", "refused by this file system")
            .why(format!(
                "{}; the core then moves data through the page cache (buffered I/O): RAM for the cache, a copy per \
                 transfer, and the speed of writeback",
                r.as_ref().err().map(|e| e.0.clone()).unwrap_or_else(|| "open with O_DIRECT failed with EINVAL".into())
            ))
            .fix(format!("use a file system with O_DIRECT (ext4, xfs) for {where_}")),
    });

    if let Dio::Aligned { offset, memory, statx_memory } = dio {
        let aio = ctx.aio();
        let source = crate::info::dio_alignment_source(memory, statx_memory);
        let summary = format!("file offsets and lengths in multiples of {offset} B, memory of {memory} B ({source})");
        let f = if aio.block_size % offset != 0 {
            Finding::warn(SECTION, "alignment", summary)
                .why(format!(
                    "block_size {} is not a multiple of {offset}: every request's unaligned edge goes through a \
                     buffered bounce",
                    aio.block_size
                ))
                .fix(format!("use a block_size that is a multiple of {offset} (e.g. 1048576)"))
        } else {
            let slices = if aio.intra_op_parallelism > 1 && offset > 1024 {
                format!(
                    "; DeepSpeed pads swapped tensors to 1024 x intra_op_parallelism B, so a worker's slice may start \
                     off a {offset} B boundary, and its edges then go buffered"
                )
            } else {
                String::new()
            };
            Finding::ok(SECTION, "alignment", summary)
                .why(format!("block_size {} is a multiple of it{slices}", aio.block_size))
        };
        out.push(f);
    }

    if let Some(root) = super::stripe::set_root(dir) {
        // A stripe set's files keep their bytes in its members.
        out.push(Finding::ok(SECTION, "free space", "a stripe set: its placeholders hold no bytes").why(format!(
            "files under {} keep their bytes in its members (see the stripe section)",
            root.display()
        )));
    } else if let Some((free, total)) = space(dir) {
        let (need, what) = needed(ctx, t);
        let summary = format!("{} free of {}", fmt_size_approx(free), fmt_size_approx(total));
        let f = if free < need {
            Finding::fail(SECTION, "free space", summary)
                .why(format!(
                    "{} are needed, for {what}: writes past the free space fail with ENOSPC",
                    fmt_size_approx(need)
                ))
                .fix(format!("free space on {where_}'s file system, or point nvme_path (--dir) at one with room"))
        } else {
            Finding::ok(SECTION, "free space", summary).why(format!("room for {what}"))
        };
        out.push(f);
    }
    out
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    ctx.per_target(check_target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    #[test]
    fn mountinfo_lines() {
        let text = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
40 22 0:35 / /mnt/my\\040dir rw,nosuid - tmpfs tmpfs rw,size=65536k
41 22 0:36 / /var/lib/docker/x rw - overlay overlay rw,lowerdir=/l,upperdir=/u/diff,workdir=/u/work";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].dev, (252, 0));
        assert_eq!((m[0].fstype.as_str(), m[0].source.as_str()), ("ext4", "/dev/vda"));
        assert_eq!(m[1].mount_point, Path::new("/mnt/my dir"));
        assert_eq!(m[1].option("size"), Some("65536k"));
        assert_eq!(m[2].option("upperdir"), Some("/u/diff"));
        assert!(m[0].options.contains("discard"));
    }

    #[test]
    fn kinds_name_memory_overlay_and_remote() {
        let mount = |t: &str| Mount {
            dev: (0, 1),
            mount_point: "/m".into(),
            fstype: t.into(),
            source: "s".into(),
            options: String::new(),
        };
        assert_eq!(fs_finding(&mount("ext4"), "/m").status, Status::Ok);
        let tmp = fs_finding(&mount("tmpfs"), "/m");
        assert_eq!(tmp.status, Status::Fail);
        assert!(tmp.why.contains("RAM") && tmp.fix.unwrap().contains("nvme_path"));
        assert_eq!(fs_finding(&mount("overlay"), "/m").status, Status::Warn);
        assert_eq!(fs_finding(&mount("nfs4"), "/m").status, Status::Warn);
        assert_eq!(fs_finding(&mount("fuse.sshfs"), "/m").status, Status::Warn);
    }

    /// The target directory is on a disk file system: the real mount, O_DIRECT round trip and space.
    #[test]
    fn this_checkouts_file_system() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let m = mount_of(dir).expect("the checkout is in a mount");
        assert!(dir.canonicalize().unwrap().starts_with(&m.mount_point));
        let (free, total) = space(dir).unwrap();
        assert!(total > 0 && free <= total);
        if !matches!(kind(&m.fstype), Kind::Memory | Kind::Overlay | Kind::Remote) {
            direct_round_trip(dir, 4096).expect("O_DIRECT on the checkout's file system");
        }
        assert!(std::fs::read_dir(dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".deepnvme-doctor")));
    }
}
