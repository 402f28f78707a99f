//! Stripe sets (`deepnvme::stripe`): files under one folder whose bytes are
//! on several member folders, moved by the handle as one logical file.
//!
//! Every test runs on member folders on real block devices where root can
//! make them (ext4 on fresh loop devices with direct I/O over sparse files
//! in the target directory: losetup, mkfs.ext4, mount; removed on drop),
//! and says loudly when it cannot, then runs on member folders on the
//! checkout's own file system instead.
//! Striped bytes are checked byte for byte against an independent reading
//! of the member files (the layout's arithmetic written out again here,
//! not the core's).
//!
//! * basics: locked and plain memory, aligned and unaligned offsets and
//!   lengths, both engines, through paths and caller fds; placeholders are
//!   sparse and have the logical size; member files hold their units.
//! * a model: random async and blocking reads and writes on overlapping
//!   memory and three striped files (and one plain file), compared with a
//!   model applied in submission order after every wait.
//! * what DeepSpeed does to swap folders: rmtree, makedirs, rewrite with the
//!   same names (old member bytes emptied), os.path.getsize.
//! * FastPersist's unaligned tail appended by plain `write(2)`: read back
//!   through the handle, and kept when the file is striped further; a file
//!   saved twice that way on members with 4 KiB logical blocks (4Kn).
//! * members that disagree: marker missing (drive not mounted), member file
//!   truncated, set made again over files, the manifest's unit edited:
//!   clear errors naming the member.
//! * a member failing mid-op (its file made immutable, or its ext4 forced
//!   read-only): the op fails naming the member file, offset and errno, and
//!   every byte written before is still there.
//! * blocking ops on plain memory streamed through bounce windows, and a
//!   child of fork() reading and writing striped files with its own handle.
//!
//! A binary of its own: it mounts devices and forks.

use deepnvme::test_support as common;

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use common::*;
use deepnvme::test_support::calls as ds;
use deepnvme::stripe::{self, CreateOptions};
use deepnvme::{EngineKind, Error, FileTarget, LockedBuffer};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// One device-making test at a time (losetup --find picks one device).
static DEVICES: Mutex<()> = Mutex::new(());

// ------------------------------------------------------------- test beds --

/// A loop device (direct I/O, over a sparse file) with ext4, mounted;
/// unmounted and detached on drop. (Not zram: this kernel's zram stores
/// the wrong bytes for O_DIRECT writes from memory that is 512-aligned but
/// not page-aligned, which it accepts; see docs/striping.md.)
struct Device {
    dev: String,
    mount: PathBuf,
}

fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Device {
    /// `Ok(Err(why))`: this machine cannot make one (not root, no loop, no mkfs.ext4).
    /// `sector`: the loop device's logical block size (4096: a 4Kn drive,
    /// whose O_DIRECT offsets and lengths are 4 KiB multiples).
    fn make(mount: PathBuf, image: PathBuf, size: u64, sector: u32) -> Result<Result<Device, String>, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(Err("not root (losetup, mkfs and mount need it)".into()));
        }
        if !Path::new("/dev/loop-control").exists() {
            return Ok(Err("no /dev/loop-control (no loop driver)".into()));
        }
        for tool in ["mkfs.ext4", "losetup"] {
            if Command::new(tool).arg("-V").output().is_err() {
                return Ok(Err(format!("{tool} is not installed")));
            }
        }
        File::create(&image).and_then(|f| f.set_len(size)).map_err(|e| format!("{}: {e}", image.display()))?;
        let sector = sector.to_string();
        let dev = sh("losetup", &["--find", "--show", "--direct-io=on", "--sector-size", &sector, image.to_str().unwrap()])?
            .trim()
            .to_string();
        let d = Device { dev, mount };
        sh("mkfs.ext4", &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", &d.dev])?;
        fs::create_dir_all(&d.mount).map_err(|e| e.to_string())?;
        sh("mount", &["-o", "noatime,errors=remount-ro", &d.dev, d.mount.to_str().unwrap()])?;
        Ok(Ok(d))
    }

    /// The kernel's name of the device (`loop3`).
    fn name(&self) -> String {
        self.dev.trim_start_matches("/dev/").to_string()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = sh("umount", &[self.mount.to_str().unwrap()]);
        let _ = sh("losetup", &["-d", &self.dev]);
        let _ = fs::remove_dir(&self.mount);
    }
}

/// A stripe set: its folder, its member folders, and what they are on.
struct Bed {
    root: PathBuf,
    members: Vec<PathBuf>,
    unit: usize,
    /// What the members are on, for messages.
    kind: String,
    devices: Vec<Device>,
    _dir: TempDir,
}

impl Bed {
    /// A set of `n` members with stripe unit `unit`, on loop devices when
    /// possible (`want_devices`), else on folders of the checkout's disk.
    fn new(tag: &str, n: usize, unit: usize, want_devices: bool) -> Bed {
        Bed::on_sectors(tag, n, unit, want_devices, 512)
    }

    /// As `new`, the devices with logical blocks of `sector` bytes.
    fn on_sectors(tag: &str, n: usize, unit: usize, want_devices: bool, sector: u32) -> Bed {
        let dir = TempDir::new(tag);
        let mut devices = Vec::new();
        let mut kind = "folders on the checkout's file system".to_string();
        if want_devices {
            let _g = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
            for i in 0..n {
                match Device::make(dir.path().join(format!("dev{i}")), dir.path().join(format!("disk{i}.img")), 512 << 20, sector) {
                    Ok(Ok(z)) => devices.push(z),
                    Ok(Err(why)) => {
                        skip(&format!("{tag}: stripe members on real devices not tested: {why}; using folders"));
                        devices.clear();
                        break;
                    }
                    Err(failure) => panic!("{tag}: making a loop device with ext4: {failure}"),
                }
            }
            if !devices.is_empty() {
                kind = format!("ext4 on {}", devices.iter().map(Device::name).collect::<Vec<_>>().join(", "));
            }
        }
        let members: Vec<PathBuf> = (0..n)
            .map(|i| match devices.get(i) {
                Some(z) => z.mount.join("stripe"),
                None => dir.path().join(format!("member{i}")),
            })
            .collect();
        let root = dir.path().join("nvme");
        stripe::Manifest::create(&root, &members, &CreateOptions { unit: unit as u64 }).expect("stripe create");
        let root = fs::canonicalize(&root).unwrap();
        let members = members.iter().map(|m| fs::canonicalize(m).unwrap()).collect();
        Bed { root, members, unit, kind, devices, _dir: dir }
    }

    fn file(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The logical bytes of `rel`, read from the member files and the
    /// placeholder with plain reads (this file's own arithmetic).
    fn logical(&self, rel: &str) -> Vec<u8> {
        let path = self.file(rel);
        let size = fs::metadata(&path).unwrap().len() as usize;
        let extent = (stripe::FileInfo::read(&path).unwrap().expect("a striped file").extent as usize).min(size);
        let n = self.members.len();
        let mut out = vec![0u8; size];
        for (i, chunk) in out[..extent].chunks_mut(self.unit).enumerate() {
            let member = i % n;
            let at = (i / n) * self.unit;
            let f = File::open(self.members[member].join(rel)).unwrap();
            f.read_exact_at(chunk, at as u64).unwrap();
        }
        if size > extent {
            File::open(&path).unwrap().read_exact_at(&mut out[extent..], extent as u64).unwrap();
        }
        out
    }
}

/// Whether a file has any data (SEEK_DATA finds some). Not `st_blocks`: a
/// long xattr mark may take a block of its own.
fn holds_data(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    // SAFETY: lseek on a descriptor this function holds.
    let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    at >= 0
}

fn locked_with(data: &[u8]) -> LockedBuffer {
    let mut b = LockedBuffer::new(data.len()).unwrap();
    b[..].copy_from_slice(data);
    b
}

// ----------------------------------------------------------------- basics --

#[test]
fn striped_files_round_trip_on_both_engines() {
    let bed = Bed::new("stripe-basics", 3, 64 * KIB, true);
    for engine in engines() {
        let h = common::handle_with(engine, 128 * KIB, 16, false, true, 2);
        let name = format!("a-{engine:?}.bin");
        let path = bed.file(&name);
        // Locked memory, aligned: 1 MiB + 3 units.
        let data = pattern(1, MIB + 3 * 64 * KIB);
        let buf = locked_with(&data);
        let pending = h.submit_write(buf, FileTarget::Path(&path), 0).unwrap();
        assert_eq!(h.wait().unwrap(), 1);
        drop(pending);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.len() as usize, data.len(), "the placeholder has the logical size ({})", bed.kind);
        assert!(!holds_data(&path), "the placeholder holds no bytes");
        assert_bytes_eq(&bed.logical(&name), &data, &format!("{engine:?}: member files ({})", bed.kind));
        // Each member holds its units: member 1's first unit is the file's second.
        let m1 = fs::read(bed.members[1].join(&name)).unwrap();
        assert_eq!(&m1[..64 * KIB], &data[64 * KIB..128 * KIB]);
        // Read back into plain memory (bounced), at an odd offset and length.
        let mut back = vec![0u8; 300_002];
        h.read_into(&mut back, FileTarget::Path(&path), 12_345).unwrap();
        assert_bytes_eq(&back, &data[12_345..12_345 + 300_002], "an unaligned read across units");
        // Overwrite an unaligned range from plain memory; the rest stays.
        let patch = pattern(2, 200_004);
        h.write_from(&patch, FileTarget::Path(&path), 70_001).unwrap();
        let mut want = data.clone();
        want[70_001..70_001 + patch.len()].copy_from_slice(&patch);
        assert_bytes_eq(&bed.logical(&name), &want, "after an unaligned write");
        // Grow it with a gap: the gap reads as zeros.
        let far = pattern(3, 4096);
        h.write_from(&far, FileTarget::Path(&path), (2 * MIB) as u64 + 4096).unwrap();
        want.resize(2 * MIB + 4096, 0);
        want.extend_from_slice(&far);
        assert_eq!(fs::metadata(&path).unwrap().len() as usize, want.len());
        let mut all = vec![0u8; want.len()];
        h.read_into(&mut all, FileTarget::Path(&path), 0).unwrap();
        assert_bytes_eq(&all, &want, "the whole file through the handle");
        assert_bytes_eq(&bed.logical(&name), &want, "the whole file from the members");
        // Past the end is refused, as for any file.
        let mut over = vec![0u8; 8192];
        let e = h.read_into(&mut over, FileTarget::Path(&path), want.len() as u64 - 4096).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
    }
}

// ------------------------------------------------------------------ model --

/// A seed per run: DEEPNVME_MODEL_SEED, else the clock's.
fn model_seeds() -> [u64; 2] {
    let random = match std::env::var("DEEPNVME_MODEL_SEED") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().expect("DEEPNVME_MODEL_SEED is a number"),
        _ => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 & 0xFFFF_FFFF,
    };
    eprintln!("stripe model seeds: fixed 20261203, random {random} (DEEPNVME_MODEL_SEED={random} replays it)");
    [20261203, random]
}

enum Mem {
    Locked(LockedBuffer),
    Pinned(Pinned),
    Heap(Vec<u8>),
}

impl Mem {
    fn ptr(&self) -> *mut u8 {
        match self {
            Mem::Locked(b) => b.as_ptr(),
            Mem::Pinned(p) => p.ptr(),
            Mem::Heap(v) => v.as_ptr() as *mut u8,
        }
    }
}

/// Random reads and writes, async and blocking, on overlapping ranges of
/// locked, manager-pinned and plain memory and of three striped files and a
/// plain one; after every wait or blocking op, every byte of memory and
/// files is compared with a model that applied the ops in submission order.
#[test]
fn a_model_of_random_ops_on_shared_memory_and_striped_files() {
    const BASE: usize = 3 * MIB;
    const FILE: usize = 2 * MIB + 12 * KIB;
    const OPS: usize = 120;
    let bed = Bed::new("stripe-model", 3, 64 * KIB, true);
    let plain_dir = TempDir::new("stripe-model-plain");
    for seed in model_seeds() {
        for engine in engines() {
            let what = format!("seed {seed}, {engine:?}, members {}", bed.kind);
            let mut rng = Rng::new(seed);
            let h = common::handle_with(engine, 64 * KIB, 8, false, true, 2);
            // Files: three striped, one plain; each written whole first.
            let mut paths = Vec::new();
            let mut files = Vec::new();
            for f in 0..4 {
                let path = if f < 3 { bed.file(&format!("m{seed}-{engine:?}-{f}.bin")) } else { plain_dir.file(&format!("p{seed}-{engine:?}.bin")) };
                let data = pattern(seed ^ (f as u64 + 10), FILE);
                h.write_from(&data, FileTarget::Path(&path), 0).unwrap();
                paths.push(path);
                files.push(data);
            }
            let mut mems = vec![
                Mem::Locked(LockedBuffer::new(BASE).unwrap()),
                Mem::Pinned(Pinned::new(BASE)),
                Mem::Heap(vec![0u8; BASE]),
            ];
            let mut models = Vec::new();
            for (i, m) in mems.iter_mut().enumerate() {
                let init = pattern(seed ^ (i as u64 + 100), BASE);
                // SAFETY: BASE bytes of the base's own memory, nothing in flight.
                unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), m.ptr(), BASE) };
                models.push(init);
            }
            let check = |mems: &[Mem], models: &[Vec<u8>], files: &[Vec<u8>], step: &str| {
                for (i, m) in mems.iter().enumerate() {
                    // SAFETY: nothing is in flight (after a wait).
                    let now = unsafe { std::slice::from_raw_parts(m.ptr(), BASE) };
                    assert_bytes_eq(now, &models[i], &format!("{what}: memory {i} after {step}"));
                }
                for (f, want) in files.iter().enumerate() {
                    let got = if f < 3 { bed.logical(paths[f].file_name().unwrap().to_str().unwrap()) } else { fs::read(&paths[f]).unwrap() };
                    assert_bytes_eq(&got, want, &format!("{what}: file {f} after {step}"));
                }
            };
            let mut pending = 0;
            for step in 0..OPS {
                let kind = rng.range(0, 9);
                if kind >= 8 {
                    h.wait().unwrap();
                    pending = 0;
                    check(&mems, &models, &files, &format!("op {step} (wait)"));
                    continue;
                }
                let (m, f) = (rng.range(0, 2), rng.range(0, 3));
                // Page-aligned; memory and file co-aligned to 512 B only (direct
                // I/O from memory inside a page); anything.
                let shape = rng.range(0, 2);
                let mut len = if shape == 0 { rng.range(1, 40) * 4096 } else { rng.range(1, 300_000) };
                len = (len & !1).clamp(2, FILE);
                let mut start = rng.range(0, BASE - len);
                let mut off = rng.range(0, FILE - len);
                if shape == 0 {
                    (start, off) = (start & !4095, off & !4095);
                } else if shape == 1 {
                    start = (start & !511) | (off & 511);
                }
                let is_async = rng.range(0, 1) == 0;
                let write = kind % 2 == 0;
                // SAFETY: inside base m; the model is compared only after waits.
                let desc = unsafe { deepnvme::BufferDesc::from_raw_parts(mems[m].ptr().add(start), len) };
                let target = FileTarget::Path(&paths[f]);
                let rc = if write {
                    ds::pwrite(&h, desc, target, off as i64, is_async)
                } else {
                    ds::pread(&h, desc, target, off as i64, is_async)
                };
                rc.unwrap_or_else(|e| panic!("{what}: op {step}: {e}"));
                if write {
                    let src = models[m][start..start + len].to_vec();
                    files[f][off..off + len].copy_from_slice(&src);
                } else {
                    let src = files[f][off..off + len].to_vec();
                    models[m][start..start + len].copy_from_slice(&src);
                }
                pending += 1;
                if !is_async {
                    pending = 0;
                    check(&mems, &models, &files, &format!("op {step} (blocking {})", if write { "write" } else { "read" }));
                }
            }
            if pending > 0 {
                h.wait().unwrap();
            }
            check(&mems, &models, &files, "the last wait");
        }
    }
}

// ------------------------------------------------------- DeepSpeed's files --

/// DeepSpeed removes an old swap folder with shutil.rmtree, makes it again
/// with os.makedirs and writes files of the same names: the new files must
/// not see the old member bytes, and os.path.getsize must give their sizes.
#[test]
fn swap_folders_removed_and_made_again_as_deepspeed_does() {
    let bed = Bed::new("stripe-swap-folders", 2, 128 * KIB, false);
    let h = common::handle_with(engines()[0], MIB, 32, false, true, 1);
    let folder = bed.file("zero_stage_3/float16params/rank0");
    for round in 0..2u64 {
        let _ = fs::remove_dir_all(&folder); // shutil.rmtree(..., ignore_errors=True)
        fs::create_dir_all(&folder).unwrap(); // os.makedirs(..., exist_ok=True)
        let len = if round == 0 { 3 * MIB } else { 256 * KIB + 4096 };
        for p in 0..3u64 {
            let rel = format!("zero_stage_3/float16params/rank0/{p}_param.tensor.swp");
            let data = pattern(round * 10 + p, len);
            let buf = locked_with(&data);
            let pending = h.submit_write(buf, FileTarget::Path(&bed.file(&rel)), 0).unwrap();
            h.wait().unwrap();
            drop(pending);
            assert_eq!(fs::metadata(bed.file(&rel)).unwrap().len() as usize, len, "os.path.getsize");
            let mut back = LockedBuffer::new(len).unwrap();
            // SAFETY: the locked buffer outlives the blocking read.
            let desc = unsafe { deepnvme::BufferDesc::from_raw_parts(back.as_ptr(), len) };
            ds::pread(&h, desc, FileTarget::Path(&bed.file(&rel)), 0, false).unwrap();
            assert_bytes_eq(&back[..], &data, &format!("round {round}, {rel}"));
            back.fill(0);
            // The old, longer member files were emptied, not left behind.
            let layout = deepnvme::stripe::Layout { unit: bed.unit as u64, members: 2 };
            for (i, m) in bed.members.iter().enumerate() {
                assert_eq!(fs::metadata(m.join(&rel)).unwrap().len(), layout.member_size(i, len as u64), "member {i} of {rel}");
            }
        }
    }
    let info = stripe::SetInfo::read(&bed.root).unwrap();
    assert_eq!(info.files.len(), 3);
    assert!(info.orphans.is_empty(), "{:?}", info.orphans);
}

/// FastPersist writes aligned blocks through an O_DIRECT fd, then appends
/// the unaligned tail with a plain `open(path, "ab")`. The tail is the
/// placeholder's own bytes; the file reads back whole, and striping it
/// further moves the tail into the members first.
#[test]
fn an_unaligned_tail_appended_by_another_program_reads_back() {
    let bed = Bed::new("stripe-tail", 2, 64 * KIB, false);
    let h = common::handle_with(engines()[0], 256 * KIB, 8, false, true, 1);
    let path = bed.file("ckpt/model.pt");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let body = pattern(7, 3 * 64 * KIB + 8192);
    let f = fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
    use std::os::fd::AsRawFd;
    let buf = locked_with(&body);
    // SAFETY: the locked buffer lives until after the wait below.
    let desc = unsafe { deepnvme::BufferDesc::from_raw_parts(buf.as_ptr(), body.len()) };
    ds::pwrite(&h, desc, FileTarget::Fd(f.as_raw_fd()), 0, true).unwrap();
    h.wait().unwrap();
    drop(f);
    let tail = pattern(8, 777);
    use std::io::Write;
    fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&tail).unwrap();
    let mut want = body.clone();
    want.extend_from_slice(&tail);
    let mut back = vec![0u8; want.len() & !1];
    h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
    assert_bytes_eq(&back, &want[..back.len()], "body and tail through the handle");
    assert_bytes_eq(&bed.logical("ckpt/model.pt"), &want, "body and tail");
    // A later aligned write past the tail: the tail moves into the members.
    let more = pattern(9, 64 * KIB);
    let at = 4 * 64 * KIB;
    h.write_from(&more, FileTarget::Path(&path), at as u64).unwrap();
    want.resize(at, 0);
    want.extend_from_slice(&more);
    assert_bytes_eq(&bed.logical("ckpt/model.pt"), &want, "after striping past the tail");
    let info = stripe::FileInfo::read(&path).unwrap().unwrap();
    assert_eq!(info.extent as usize, want.len());
}

/// FastPersist saving one file twice (its writer opens without O_TRUNC): an
/// O_DIRECT write of a 3584-byte body, then the unaligned tail appended by
/// plain `write(2)`, twice. On members with 4 KiB logical blocks (a 4Kn
/// drive) the second save left the striped extent (3584) inside the first
/// 4 KiB of a file now longer than that, so a read across it sent its last
/// member piece, 3584 bytes, with O_DIRECT: EINVAL, and the file could not
/// be read at all.
#[test]
fn a_file_saved_twice_as_fastpersist_does_reads_back_on_4k_sector_members() {
    let bed = Bed::on_sectors("stripe-resave", 2, 64 * KIB, true, 4096);
    if bed.devices.is_empty() {
        return; // said why above: the case needs 4 KiB-sector members
    }
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let path = bed.file("model.pt");
    let mut want = Vec::new();
    for engine in engines() {
        let h = common::handle_with(engine, 1 << 20, 8, false, true, 1);
        for pass in 0..2u64 {
            let body = pattern(10 + pass, 3584);
            let tail = pattern(20 + pass, 293);
            let f = fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
            let buf = locked_with(&body);
            // SAFETY: the locked buffer lives until after the wait below.
            let desc = unsafe { deepnvme::BufferDesc::from_raw_parts(buf.as_ptr(), body.len()) };
            ds::pwrite(&h, desc, FileTarget::Fd(f.as_raw_fd()), 0, true).unwrap();
            h.wait().unwrap_or_else(|e| panic!("{engine:?} pass {pass}: the body's write: {e}"));
            drop(f);
            fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&tail).unwrap();
            if want.len() < body.len() {
                want.resize(body.len(), 0);
            }
            want[..body.len()].copy_from_slice(&body);
            want.extend_from_slice(&tail);
            let mut back = vec![0u8; want.len()];
            h.read_into(&mut back, FileTarget::Path(&path), 0)
                .unwrap_or_else(|e| panic!("{engine:?} pass {pass} on {}: reading the file back: {e}", bed.kind));
            assert_bytes_eq(&back, &want, &format!("{engine:?} pass {pass}: the file through the handle"));
            assert_bytes_eq(&bed.logical("model.pt"), &want, &format!("{engine:?} pass {pass}: the file"));
        }
    }
}

/// Another program truncates a striped file (`os.truncate`), deepnvme's
/// next op sees it, then the file grows again (a preallocating truncate):
/// the bytes past the truncation read as zeros, as on any file, not as the
/// old member bytes, and the members are cut to the truncated size.
#[test]
fn a_truncation_by_another_program_stays_when_the_file_grows_again() {
    let bed = Bed::new("stripe-truncate", 2, 64 * KIB, false);
    let h = common::handle_with(engines()[0], 256 * KIB, 8, false, true, 1);
    let path = bed.file("x.swp");
    let data = pattern(31, 6 * MIB);
    h_write(&bed, "x.swp", &data);
    File::options().write(true).open(&path).unwrap().set_len((3 * MIB) as u64).unwrap();
    let mut peek = vec![0u8; 4096];
    h.read_into(&mut peek, FileTarget::Path(&path), 0).unwrap();
    assert_eq!(stripe::FileInfo::read(&path).unwrap().unwrap().extent, (3 * MIB) as u64, "the mark's extent");
    for (i, m) in bed.members.iter().enumerate() {
        let len = fs::metadata(m.join("x.swp")).unwrap().len();
        assert!(len <= (3 * MIB / 2) as u64, "member {i} kept {len} bytes past the truncation");
    }
    File::options().write(true).open(&path).unwrap().set_len((5 * MIB) as u64).unwrap();
    let mut back = vec![7u8; 5 * MIB];
    h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
    let mut want = data[..3 * MIB].to_vec();
    want.resize(5 * MIB, 0);
    assert_bytes_eq(&back, &want, "the file grown again after a truncation");
}

/// Copies `from`'s extended attribute `name` onto `to` (what `cp -a`,
/// `shutil.copy2` and `rsync -X` do).
fn copy_xattr(from: &Path, to: &Path, name: &str) {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let (f, t) = (CString::new(from.as_os_str().as_bytes()).unwrap(), CString::new(to.as_os_str().as_bytes()).unwrap());
    let n = CString::new(name).unwrap();
    let mut buf = [0u8; 4096];
    // SAFETY: getxattr writes at most buf.len() bytes; setxattr reads the `len` it was given.
    unsafe {
        let len = libc::getxattr(f.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert!(len > 0, "{}: no {name}", from.display());
        assert_eq!(libc::setxattr(t.as_ptr(), n.as_ptr(), buf.as_ptr().cast(), len as usize, 0), 0);
    }
}

/// A placeholder copied with its attributes shares the original's member
/// files; a placeholder renamed, then replaced by a new file of its old
/// name, has had its member files taken over. A write to either used to
/// change the other file's bytes without a word (a write to the copy
/// overwrote the original); now it is refused naming what happened, and
/// the original keeps its bytes. Reads still give the owner's bytes, said
/// once (DeepSpeed reads its checkpoint's copies of swap files so).
#[test]
fn a_copied_or_taken_over_placeholder_refuses_instead_of_sharing_bytes() {
    let bed = Bed::new("stripe-owner", 2, 64 * KIB, false);
    let h = common::handle_with(engines()[0], 256 * KIB, 8, false, true, 1);
    let (a, b) = (pattern(41, 2 * MIB), pattern(42, 2 * MIB));
    let read = |rel: &str| {
        let mut back = vec![0u8; 2 * MIB];
        h.read_into(&mut back, FileTarget::Path(&bed.file(rel)), 0).map(|_| back)
    };

    h_write(&bed, "orig.pt", &a);
    let backup = bed.file("backup.pt");
    File::create(&backup).unwrap().set_len(a.len() as u64).unwrap();
    copy_xattr(&bed.file("orig.pt"), &backup, "user.deepnvme.stripe");
    let e = h.write_from(&b, FileTarget::Path(&backup), 0).expect_err("a write to the copy").to_string();
    assert!(e.contains("holds the bytes of another file") && e.contains("cp -a"), "{e}");
    assert_bytes_eq(&read("orig.pt").unwrap(), &a, "the original after a write to its copy");
    assert_bytes_eq(&read("backup.pt").unwrap(), &a, "a read of the copy: the original's bytes");

    h_write(&bed, "ckpt.tmp", &a);
    fs::rename(bed.file("ckpt.tmp"), bed.file("ckpt.pt")).unwrap();
    assert_bytes_eq(&read("ckpt.pt").unwrap(), &a, "a renamed placeholder");
    h_write(&bed, "ckpt.tmp", &b);
    let e = h.write_from(&a, FileTarget::Path(&bed.file("ckpt.pt")), 0).expect_err("a write to the renamed file").to_string();
    assert!(e.contains("took its member") && e.contains("ckpt.tmp"), "{e}");
    assert_bytes_eq(&read("ckpt.tmp").unwrap(), &b, "the new file at the old name, after a write to the renamed one");
}

/// `deepnvme::copy_file`, what DeepSpeed's checkpoint copies of its swap
/// files go through (and `stripe cp`): a copy of a striped file holds its
/// logical bytes, out of the set (a plain file) and into it (striped, with
/// member files of its own), and keeps them when the original is rewritten;
/// a copy back over a placeholder (DeepSpeed's load) replaces its bytes
/// whole, longer or shorter. The stripe mark is never copied.
#[test]
fn copies_by_logical_bytes_hold_them_in_and_out_of_the_set() {
    let bed = Bed::new("stripe-copy", 2, 64 * KIB, false);
    let h = common::handle_with(engines()[0], 256 * KIB, 8, false, true, 1);
    let outside = TempDir::new("stripe-copy-out");
    let read = |path: &Path, len: usize| {
        let mut back = vec![0u8; len];
        h.read_into(&mut back, FileTarget::Path(path), 0).unwrap();
        back
    };
    let first = pattern(51, 3 * MIB + 777);
    fs::create_dir_all(bed.file("swap")).unwrap();
    h_write(&bed, "swap/opt.swp", &first);
    let swap = bed.file("swap/opt.swp");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&swap, fs::Permissions::from_mode(0o640)).unwrap();

    let out = outside.path().join("opt.swp");
    assert_eq!(deepnvme::copy_file(&swap, &out).unwrap(), first.len() as u64);
    assert!(stripe::FileInfo::read(&out).unwrap().is_none(), "a copy out of the set is a plain file");
    assert_bytes_eq(&fs::read(&out).unwrap(), &first, "the copy out of the set");
    let (src_meta, out_meta) = (fs::metadata(&swap).unwrap(), fs::metadata(&out).unwrap());
    assert_eq!(out_meta.permissions().mode() & 0o7777, 0o640, "the copy's mode");
    assert_eq!(out_meta.modified().unwrap(), src_meta.modified().unwrap(), "the copy's modification time");

    fs::create_dir_all(bed.file("ckpt")).unwrap();
    let inside = bed.file("ckpt/opt.swp");
    deepnvme::copy_file(&swap, &inside).unwrap();
    let info = stripe::FileInfo::read(&inside).unwrap().expect("a copy into the set is striped");
    assert!(info.problems.is_empty(), "{:?}", info.problems);
    assert!(!holds_data(&inside), "the copy in the set is a placeholder");
    assert_bytes_eq(&bed.logical("ckpt/opt.swp"), &first, "the copy in the set, from its own member files");

    // Training rewrites the swap file: neither copy changes.
    let second = pattern(52, 4 * MIB);
    h_write(&bed, "swap/opt.swp", &second);
    assert_bytes_eq(&fs::read(&out).unwrap(), &first, "the copy out of the set after a rewrite");
    assert_bytes_eq(&bed.logical("ckpt/opt.swp"), &first, "the copy in the set after a rewrite");
    assert_bytes_eq(&read(&inside, first.len()), &first, "the copy in the set, read through the handle");

    // Loading: each copy back over the (longer) swap file gives its bytes, whole.
    for from in [&out, &inside] {
        h_write(&bed, "swap/opt.swp", &second);
        deepnvme::copy_file(from, &swap).unwrap();
        assert_eq!(fs::metadata(&swap).unwrap().len(), first.len() as u64, "the loaded file's size");
        assert_bytes_eq(&bed.logical("swap/opt.swp"), &first, &format!("loaded from {}", from.display()));
        assert_bytes_eq(&read(&swap, first.len()), &first, "loaded, read through the handle");
        h.write_from(&second[..MIB], FileTarget::Path(&swap), 0).expect("a write to the loaded file");
    }
    assert_bytes_eq(&bed.logical("ckpt/opt.swp"), &first, "the copy in the set after loading from it");

    let e = deepnvme::copy_file(&swap, &swap).expect_err("a copy onto itself").to_string();
    assert!(e.contains("same file"), "{e}");
    let e = deepnvme::copy_file(&bed.file("swap/none"), &out).expect_err("a missing source").to_string();
    assert!(e.contains("swap/none") && e.contains("errno 2"), "{e}");
}

/// A copy moves 64 MiB at a time: a file of two chunks and an unaligned
/// tail copies whole out of the set and into it, and a plain file copied
/// into the set is striped (not a plain file on the set folder's disk).
#[test]
fn copies_of_several_chunks_and_plain_files_into_the_set() {
    let bed = Bed::new("stripe-copy-big", 2, 64 * KIB, false);
    let outside = TempDir::new("stripe-copy-big-out");
    let data = pattern(61, 2 * 64 * MIB + 12345);
    h_write(&bed, "big.swp", &data);
    let out = outside.path().join("big.swp");
    deepnvme::copy_file(&bed.file("big.swp"), &out).unwrap();
    assert_bytes_eq(&fs::read(&out).unwrap(), &data, "a copy of several chunks out of the set");
    deepnvme::copy_file(&out, &bed.file("big2.swp")).unwrap();
    assert!(stripe::FileInfo::read(&bed.file("big2.swp")).unwrap().is_some(), "a plain file copied into the set is striped");
    assert!(!holds_data(&bed.file("big2.swp")));
    assert_bytes_eq(&bed.logical("big2.swp"), &data, "a copy of several chunks into the set");
    let small = outside.path().join("small.json");
    fs::write(&small, b"{\"step\": 3}").unwrap();
    deepnvme::copy_file(&small, &bed.file("latest")).unwrap();
    assert_eq!(bed.logical("latest"), b"{\"step\": 3}");
    deepnvme::copy_file(&outside.path().join("empty"), &bed.file("e")).expect_err("a missing source");
    fs::write(outside.path().join("empty"), b"").unwrap();
    assert_eq!(deepnvme::copy_file(&outside.path().join("empty"), &bed.file("e")).unwrap(), 0);
    assert_eq!(fs::metadata(bed.file("e")).unwrap().len(), 0);
}

/// A source whose bytes are not its own is refused before the destination
/// is touched: a copy made with its attributes (`cp -a`; a checkpoint saved
/// by an earlier deepnvme), a source with a member file missing, and a
/// copy whose member files are the destination's (untagged members, as an
/// older deepnvme left them: writing the destination would empty them
/// before they are read).
#[test]
fn a_copy_from_a_source_without_bytes_of_its_own_is_refused_and_the_destination_kept() {
    let bed = Bed::new("stripe-copy-refused", 2, 64 * KIB, false);
    let outside = TempDir::new("stripe-copy-refused-out");
    let (a, b) = (pattern(71, 2 * MIB), pattern(72, MIB));
    h_write(&bed, "swap.swp", &a);
    let kept = outside.path().join("kept.swp");
    fs::write(&kept, &b).unwrap();

    let attr_copy = bed.file("ckpt.swp");
    File::create(&attr_copy).unwrap().set_len(a.len() as u64).unwrap();
    copy_xattr(&bed.file("swap.swp"), &attr_copy, "user.deepnvme.stripe");
    let e = deepnvme::copy_file(&attr_copy, &kept).expect_err("a copy made with its attributes").to_string();
    assert!(e.contains("holds no bytes of its own") && e.contains("ckpt.swp"), "{e}");
    assert_eq!(fs::read(&kept).unwrap(), b, "the destination after a refused copy");

    h_write(&bed, "gone.swp", &a);
    fs::remove_file(bed.members[1].join("gone.swp")).unwrap();
    let e = deepnvme::copy_file(&bed.file("gone.swp"), &kept).expect_err("a member file missing").to_string();
    assert!(e.contains("gone.swp") && e.contains("missing"), "{e}");
    assert_eq!(fs::read(&kept).unwrap(), b, "the destination after a source with a member missing");

    for m in &bed.members {
        let f = std::ffi::CString::new(m.join("swap.swp").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and attribute name.
        let rc = unsafe { libc::removexattr(f.as_ptr(), c"user.deepnvme.stripe.owner".as_ptr()) };
        assert_eq!(rc, 0, "removing the owner tag of {}", m.display());
    }
    let e = deepnvme::copy_file(&attr_copy, &bed.file("swap.swp")).expect_err("a copy onto its own members").to_string();
    assert!(e.contains("would empty") && e.contains("before it is read"), "{e}");
    assert_bytes_eq(&bed.logical("swap.swp"), &a, "the file whose members the copy shares");

    // A copy onto one of the source's member files, reached by its member
    // folder; and a member file copied back to its placeholder's path (a
    // salvage): each would truncate what it reads.
    let member = bed.members[0].join("swap.swp");
    let e = deepnvme::copy_file(&bed.file("swap.swp"), &member).expect_err("a copy onto its own member").to_string();
    assert!(e.contains("would empty"), "{e}");
    let e = deepnvme::copy_file(&member, &bed.file("swap.swp")).expect_err("a member onto its placeholder").to_string();
    assert!(e.contains("would empty"), "{e}");
    assert_bytes_eq(&bed.logical("swap.swp"), &a, "the file after both refused copies");
    let link = bed.file("link.swp");
    std::os::unix::fs::symlink(bed.file("nowhere.swp"), &link).unwrap();
    let e = deepnvme::copy_file(&bed.file("swap.swp"), &link).expect_err("a link to a missing file").to_string();
    assert!(e.contains("symbolic link to a missing file"), "{e}");
}

// ------------------------------------------------------ stripe create --

/// `stripe create` refuses every layout in which two sets, or a set and
/// its members, would share file names: each case is one set already made
/// over `m0`, `m1` at `set1`, then a second create that must fail naming why.
#[test]
fn stripe_create_refuses_folders_that_would_share_files() {
    let dir = TempDir::new("stripe-create");
    let p = |rel: &str| dir.path().join(rel);
    for d in ["set1", "m0", "m1", "set2", "m2", "full"] {
        fs::create_dir_all(p(d)).unwrap();
    }
    fs::write(p("full/x"), b"x").unwrap();
    let opts = CreateOptions { unit: 64 * KIB as u64 };
    stripe::Manifest::create(&p("set1"), &[p("m0"), p("m1")], &opts).expect("the first set");
    fs::create_dir_all(p("m0/job2")).unwrap();
    fs::create_dir_all(p("set1/inner")).unwrap();
    fs::create_dir_all(p("m1/nvme")).unwrap();
    let cases: [(&str, &str, &[&str], &str); 7] = [
        ("a set inside a set", "set1/inner", &["m2"], "sets cannot nest"),
        ("a member inside a set's folder", "set2", &["set1/inner"], "is inside the stripe set"),
        ("a member inside another set's member", "set2", &["m0/job2", "m2"], "a member folder of another stripe set"),
        ("a set inside another set's member", "m1/nvme", &["m2"], "a member folder of another stripe set"),
        ("a member that is another set's member", "set2", &["m0"], "is already member 0"),
        ("one folder twice", "set2", &["m2", "m2"], "must be distinct"),
        ("a member that holds files", "set2", &["full"], "is not empty"),
    ];
    for (what, root, members, want) in cases {
        let members: Vec<PathBuf> = members.iter().map(|m| p(m)).collect();
        let e = stripe::Manifest::create(&p(root), &members, &opts).expect_err(what);
        assert!(e.contains(want), "{what}: {e}");
        assert!(!p(root).join(".deepnvme-stripe").exists() || root == "set1", "{what}: a manifest was written");
    }
    stripe::Manifest::create(&p("set2"), &[p("m2")], &opts).expect("a set beside the first");
}

// ------------------------------------------------------ members disagree --

fn expect_err(r: deepnvme::Result<impl std::fmt::Debug>, wants: &[&str], what: &str) -> String {
    let e = r.expect_err(what).to_string();
    for w in wants {
        assert!(e.contains(w), "{what}: the error must name {w:?}: {e}");
    }
    e
}

#[test]
fn members_that_disagree_are_errors_naming_them() {
    let bed = Bed::new("stripe-disagree", 3, 64 * KIB, true);
    let h = common::handle_with(engines()[0], 256 * KIB, 8, false, true, 1);
    let data = pattern(11, 5 * 64 * KIB);
    let path = bed.file("a.bin");
    h.write_from(&data, FileTarget::Path(&path), 0).unwrap();
    let mut back = vec![0u8; data.len()];

    // A member's drive missing: its folder is gone (unmounted) or empty.
    let m1 = bed.members[1].to_str().unwrap().to_string();
    let unmounted = match bed.devices.get(1) {
        Some(z) => {
            sh("umount", &[z.mount.to_str().unwrap()]).unwrap();
            None
        }
        None => {
            let away = bed.members[1].with_extension("away");
            fs::rename(&bed.members[1], &away).unwrap();
            Some(away)
        }
    };
    expect_err(h.read_into(&mut back, FileTarget::Path(&path), 0), &[&m1, "drive mounted"], "a read with member 1 gone");
    expect_err(h.write_from(&data, FileTarget::Path(&bed.file("new.bin")), 0), &[&m1, "drive mounted"], "a write with member 1 gone");
    assert!(!bed.members[1].join("new.bin").exists(), "nothing may be written where the member's drive should be");
    match (&unmounted, bed.devices.get(1)) {
        (Some(away), _) => fs::rename(away, &bed.members[1]).unwrap(),
        (None, Some(z)) => {
            sh("mount", &["-o", "noatime", &z.dev, z.mount.to_str().unwrap()]).unwrap();
        }
        _ => unreachable!(),
    }
    h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
    assert_bytes_eq(&back, &data, "after the member came back");

    // A member file truncated.
    let m2file = bed.members[2].join("a.bin");
    let m2bytes = fs::read(&m2file).unwrap();
    fs::OpenOptions::new().write(true).open(&m2file).unwrap().set_len(4096).unwrap();
    expect_err(h.read_into(&mut back, FileTarget::Path(&path), 0), &[m2file.to_str().unwrap(), "truncated"], "a truncated member");
    let info = stripe::FileInfo::read(&path).unwrap().unwrap();
    assert_eq!(info.problems.len(), 1, "{:?}", info.problems);
    fs::write(&m2file, &m2bytes).unwrap();

    // The set made again under the file (another id in the manifest).
    let manifest = bed.root.join(stripe::Manifest::FILE_NAME);
    let text = fs::read_to_string(&manifest).unwrap();
    let old = stripe::Manifest::parse(&text, &bed.root).unwrap().id;
    fs::write(&manifest, text.replace(&old, "00000000000000ff")).unwrap();
    expect_err(h.read_into(&mut back, FileTarget::Path(&path), 0), &[&old, "00000000000000ff", "made again"], "a remade set");
    fs::write(&manifest, &text).unwrap();

    // The manifest's unit edited: every read would be scrambled.
    let unit = format!("unit = {}", 64 * KIB);
    assert!(text.contains(&unit), "{text}");
    fs::write(&manifest, text.replace(&unit, &format!("unit = {}", 128 * KIB))).unwrap();
    expect_err(h.read_into(&mut back, FileTarget::Path(&path), 0), &["was made with unit 65536", "restore unit = 65536"], "an edited unit");
    fs::write(&manifest, &text).unwrap();

    // The manifest removed.
    fs::rename(&manifest, manifest.with_extension("gone")).unwrap();
    expect_err(h.read_into(&mut back, FileTarget::Path(&path), 0), &["no .deepnvme-stripe"], "no manifest");
    fs::rename(manifest.with_extension("gone"), &manifest).unwrap();
    h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
    assert_bytes_eq(&back, &data, "at the end");
}

// ------------------------------------------------------- a member failing --

const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IMMUTABLE_FL: libc::c_long = 0x10;

fn set_immutable(path: &Path, on: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    let mut flags: libc::c_long = 0;
    // SAFETY: the ioctls read and write one long through the pointer.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut flags) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        flags = if on { flags | FS_IMMUTABLE_FL } else { flags & !FS_IMMUTABLE_FL };
        if libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &flags) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A member that fails while a write is in flight (its file made
/// immutable; on a real device, its ext4 forced read-only): the op fails
/// naming the member file, an offset and the errno, and the bytes written
/// before it, of this file and of another, are all still there.
#[test]
fn a_member_failing_mid_op_names_it_and_loses_nothing_written() {
    let bed = Bed::new("stripe-failing", 3, 256 * KIB, true);
    for (how, errno_text) in [("immutable", "Operation not permitted"), ("ext4 read-only", "Read-only file system")] {
        if how == "ext4 read-only" && bed.devices.is_empty() {
            skip("a member's device failing mid-op not tested: no loop devices here");
            continue;
        }
        let h = common::handle_with(engines()[0], MIB, 32, false, true, 2);
        let (a, b) = (format!("{how}-a.bin"), format!("{how}-b.bin"));
        let first = pattern(21, 6 * MIB);
        h.write_from(&first, FileTarget::Path(&bed.file(&a)), 0).unwrap();
        h.write_from(&first, FileTarget::Path(&bed.file(&b)), 0).unwrap();
        let big = locked_with(&pattern(22, 96 * MIB));
        let member_file = bed.members[1].join(&b);
        let mut failed = None;
        let mut big = Some(big);
        for attempt in 0..20u64 {
            let pending = h.submit_write(big.take().unwrap(), FileTarget::Path(&bed.file(&b)), 6 * MIB as u64).unwrap();
            std::thread::sleep(std::time::Duration::from_micros(300 * attempt));
            match how {
                "immutable" => set_immutable(&member_file, true).unwrap(),
                _ => fs::write(format!("/sys/fs/ext4/{}/trigger_fs_error", bed.devices[1].name()), "1").unwrap(),
            }
            let outcome = h.wait();
            big = pending.take();
            if how == "immutable" {
                set_immutable(&member_file, false).unwrap();
            }
            if let Err(e) = outcome {
                failed = Some(e);
                break;
            }
            if how != "immutable" {
                break; // a read-only file system stays read-only
            }
        }
        let Some(e) = failed else {
            skip(&format!("{how}: every write finished before the member failed; mid-op failure not seen"));
            continue;
        };
        let text = e.to_string();
        eprintln!("{how}: the failed write said: {text}");
        assert!(matches!(e, Error::Transfer(_) | Error::Many { .. }), "{how}: {text}");
        for want in [member_file.to_str().unwrap(), "stripe member 1", errno_text, "at offset"] {
            assert!(text.contains(want), "{how}: the error must name {want:?}: {text}");
        }
        // Nothing written before is lost: all of a, and b's first 6 MiB.
        assert_bytes_eq(&bed.logical(&a), &first, &format!("{how}: the other file"));
        assert_bytes_eq(&bed.logical(&b)[..6 * MIB], &first, &format!("{how}: the file's earlier bytes"));
    }
}

// ------------------------------------------- windows, fork, bounded memory --

/// Blocking ops on plain memory larger than a bounce window stream through
/// a few windows (bounded bounce memory), striped as any op; a child of
/// fork() makes its own handle and reads and writes striped files.
#[test]
fn windowed_plain_ops_and_a_forked_child_on_striped_files() {
    let bed = Bed::new("stripe-windows", 2, 256 * KIB, false);
    for engine in engines() {
        let h = common::handle_with(engine, MIB, 8, false, true, 2);
        let name = format!("big-{engine:?}.bin");
        let data = pattern(31, 24 * MIB + 4096);
        h.write_from(&data, FileTarget::Path(&bed.file(&name)), 0).unwrap();
        assert_bytes_eq(&bed.logical(&name), &data, &format!("{engine:?}: a 24 MiB plain write"));
        let mut back = vec![0u8; data.len()];
        h.read_into(&mut back, FileTarget::Path(&bed.file(&name)), 0).unwrap();
        assert_bytes_eq(&back, &data, &format!("{engine:?}: a 24 MiB plain read"));
    }
    let before = pattern(32, 3 * MIB);
    h_write(&bed, "parent.bin", &before);
    // SAFETY: the child only uses the crate (which supports a child of
    // fork(): new handles and I/O) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let h = common::handle_with(EngineKind::Psync, MIB, 8, false, true, 1);
            let mut back = vec![0u8; before.len()];
            if h.read_into(&mut back, FileTarget::Path(&bed.file("parent.bin")), 0).is_err() || back != before {
                return 2;
            }
            let mine = pattern(33, 2 * MIB + 100);
            if h.write_from(&mine, FileTarget::Path(&bed.file("child.bin")), 0).is_err() {
                return 3;
            }
            0
        })
        .unwrap_or(101);
        // SAFETY: leaves the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child failed: status {status}");
    assert_bytes_eq(&bed.logical("child.bin"), &pattern(33, 2 * MIB + 100), "the child's striped write");
}

fn h_write(bed: &Bed, rel: &str, data: &[u8]) {
    let h = common::handle_with(engines()[0], MIB, 8, false, true, 1);
    h.write_from(data, FileTarget::Path(&bed.file(rel)), 0).unwrap();
}
