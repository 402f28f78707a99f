//! What `deepnvme stripe` does to a set: create it (markers in each member
//! folder, then the manifest), describe it or one of its files, remove it.
//! Errors are sentences for a person (the CLI prints them as they are).

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::layout::Layout;
use super::manifest::{self, check_unit, Manifest, MANIFEST_NAME, MARKER_NAME};
use super::mark::{self, Mark};

/// The stripe unit `create` uses unless told otherwise: 1 MiB, DeepSpeed's
/// default block size (docs/perf/striping.md compares units).
const DEFAULT_UNIT: u64 = 1 << 20;

/// How to make a set.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Bytes of a file on one member before the next member's turn.
    pub unit: u64,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions { unit: DEFAULT_UNIT }
    }
}

fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn canonical_dir(path: &Path, what: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(path).map_err(|e| format!("{what} {}: cannot create it: {e}", path.display()))?;
    let real = std::fs::canonicalize(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if !real.is_dir() {
        return Err(format!("{what} {} is not a folder", path.display()));
    }
    Ok(real)
}

fn probe_xattrs(dir: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let probe = dir.join(format!(".deepnvme-stripe-probe-{}", std::process::id()));
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&probe)?;
    let result = mark::write(f.as_raw_fd(), &Mark { id: "0".repeat(16), extent: 0, relpath: PathBuf::from("probe") });
    drop(f);
    let _ = std::fs::remove_file(&probe);
    result
}

/// The member folder of some stripe set that `dir` is, or is inside.
fn member_folder_holding(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join(MARKER_NAME).exists()).map(Path::to_path_buf)
}

/// [`Manifest::create`].
fn create(nvme_path: &Path, members: &[PathBuf], options: &CreateOptions) -> Result<Manifest, String> {
    check_unit(options.unit)?;
    if members.is_empty() {
        return Err("a stripe set needs at least one member folder".into());
    }
    let root = canonical_dir(nvme_path, "the striped folder")?;
    if root.join(MANIFEST_NAME).exists() {
        return Err(format!(
            "{} is already a stripe set ({}); `deepnvme stripe remove` it first",
            root.display(),
            root.join(MANIFEST_NAME).display()
        ));
    }
    if let Some(outer) = root.parent().and_then(manifest::find_root) {
        return Err(format!("{} is inside the stripe set {}: sets cannot nest", root.display(), outer.display()));
    }
    if let Some(member) = member_folder_holding(&root) {
        return Err(format!(
            "{} is inside {}, a member folder of another stripe set: its files would share names with that set's",
            root.display(),
            member.display()
        ));
    }
    probe_xattrs(&root).map_err(|e| {
        format!(
            "{}: its file system does not keep user extended attributes ({e}), which mark striped files; \
             use a folder on ext4, xfs, btrfs or tmpfs",
            root.display()
        )
    })?;
    let mut dirs = Vec::with_capacity(members.len());
    for m in members {
        let real = canonical_dir(m, "member folder")?;
        if real.starts_with(&root) || root.starts_with(&real) {
            return Err(format!(
                "member folder {} and the striped folder {} must not contain one another",
                real.display(),
                root.display()
            ));
        }
        if let Some(set) = manifest::find_root(&real) {
            return Err(format!(
                "member folder {} is inside the stripe set {}: that set would stripe its member files",
                real.display(),
                set.display()
            ));
        }
        if let Some(member) = real.parent().and_then(member_folder_holding) {
            return Err(format!(
                "member folder {} is inside {}, a member folder of another stripe set: the two sets' member files \
                 would share names",
                real.display(),
                member.display()
            ));
        }
        if let Some(other) = dirs.iter().find(|d: &&PathBuf| real.starts_with(d) || d.starts_with(&real)) {
            return Err(format!("member folders {} and {} must be distinct and not nested", other.display(), real.display()));
        }
        if let Ok((marker, _)) = manifest::read_marker(&real) {
            return Err(format!(
                "{} is already member {} of stripe set {} at {}; remove that set first",
                real.display(),
                marker.index,
                marker.id,
                marker.set.display()
            ));
        }
        let busy: Vec<String> = std::fs::read_dir(&real)
            .map_err(|e| format!("member folder {}: {e}", real.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lost+found")
            .collect();
        if !busy.is_empty() {
            return Err(format!(
                "member folder {} is not empty (it holds {}); a member folder holds only deepnvme's files",
                real.display(),
                busy.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        dirs.push(real);
    }
    let id = manifest::new_id().map_err(|e| format!("getrandom: {e}"))?;
    let manifest = Manifest { root: root.clone(), id, unit: options.unit, members: dirs };
    for (i, dir) in manifest.members.iter().enumerate() {
        write_atomically(&dir.join(MARKER_NAME), &manifest.marker(i).format())
            .map_err(|e| format!("writing {}: {e}", dir.join(MARKER_NAME).display()))?;
    }
    write_atomically(&root.join(MANIFEST_NAME), &manifest.format())
        .map_err(|e| format!("writing {}: {e}", root.join(MANIFEST_NAME).display()))?;
    Ok(manifest)
}

/// A set's manifest, from its folder.
fn manifest_of(nvme_path: &Path) -> Result<Manifest, String> {
    let root = std::fs::canonicalize(nvme_path).map_err(|e| format!("{}: {e}", nvme_path.display()))?;
    match manifest::load(&root) {
        Ok(m) => Ok((*m).clone()),
        Err(manifest::LoadError::Missing) => Err(format!("{} is not a stripe set (no {MANIFEST_NAME})", root.display())),
        Err(manifest::LoadError::Io(e)) => Err(format!("{}: {e}", root.join(MANIFEST_NAME).display())),
        Err(manifest::LoadError::Invalid(why)) => Err(format!("{}: {why}", root.join(MANIFEST_NAME).display())),
    }
}

/// Every regular file under `dir` (not following links), as paths
/// relative to `dir`, skipping `skip` names at the top.
fn files_under(dir: &Path, skip: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&rel)) else { continue };
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name();
            if rel.as_os_str().is_empty() && skip.iter().any(|s| name == *s) {
                continue;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(rel.join(&name));
            } else if t.is_file() {
                out.push(rel.join(&name));
            }
        }
    }
    out.sort();
    out
}

/// One member folder, as `inspect` and the doctor see it.
#[derive(Clone, Debug)]
pub struct MemberInfo {
    /// Its place in the stripe order.
    pub index: usize,
    /// The member folder.
    pub path: PathBuf,
    /// `Ok` when its marker names this set and place, else why not.
    pub marker: Result<(), String>,
    /// The device its folder is on (major, minor).
    pub device: Option<(u32, u32)>,
    /// Free bytes on its file system (`statvfs`), when known.
    pub free_bytes: Option<u64>,
    /// Size of its file system, when known.
    pub total_bytes: Option<u64>,
    /// Bytes of member files allocated on it (`st_blocks`).
    pub used_bytes: u64,
}

/// A set as `deepnvme stripe inspect NVME_PATH` shows it.
#[derive(Clone, Debug)]
pub struct SetInfo {
    /// The set's manifest.
    pub manifest: Manifest,
    /// Each member folder, in stripe order.
    pub members: Vec<MemberInfo>,
    /// Striped files under the folder: (path relative to it, logical size).
    pub files: Vec<(PathBuf, u64)>,
    /// Marked files of another set (made again over them).
    pub foreign_files: Vec<PathBuf>,
    /// Member files no placeholder refers to (left when DeepSpeed removed
    /// an old swap folder and made no file of that name since), with bytes.
    pub orphans: Vec<(PathBuf, u64)>,
}

fn statvfs(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills a zeroed struct for a NUL-terminated path.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st) == 0)
            .then(|| (st.f_bavail as u64 * st.f_frsize as u64, st.f_blocks as u64 * st.f_frsize as u64))
    }
}

/// [`SetInfo::read`].
fn set_info(nvme_path: &Path) -> Result<SetInfo, String> {
    let manifest = manifest_of(nvme_path)?;
    let mut files = Vec::new();
    let mut foreign_files = Vec::new();
    let mut referenced = HashSet::new();
    for rel in files_under(&manifest.root, &[MANIFEST_NAME]) {
        let path = manifest.root.join(&rel);
        if let Ok(Some(m)) = mark::read_path(&path) {
            if m.id == manifest.id {
                files.push((rel, std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)));
                referenced.insert(m.relpath);
            } else {
                foreign_files.push(rel);
            }
        }
    }
    let mut members = Vec::new();
    let mut orphans = Vec::new();
    for (index, dir) in manifest.members.iter().enumerate() {
        let marker = match manifest::read_marker(dir) {
            Ok((m, _)) if m.id == manifest.id && m.index == index && m.count == manifest.members.len() => Ok(()),
            Ok((m, _)) => Err(format!("its marker says member {} of {} of set {}", m.index, m.count, m.id)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!("no {MARKER_NAME}: is its drive mounted?")),
            Err(e) => Err(e.to_string()),
        };
        let meta = std::fs::metadata(dir).ok();
        let device = meta.map(|m| (libc::major(m.dev()), libc::minor(m.dev())));
        let (free_bytes, total_bytes) = statvfs(dir).map_or((None, None), |(f, t)| (Some(f), Some(t)));
        let mut used_bytes = 0;
        if marker.is_ok() {
            for rel in files_under(dir, &[MARKER_NAME, "lost+found"]) {
                let bytes = std::fs::metadata(dir.join(&rel)).map(|m| m.blocks() * 512).unwrap_or(0);
                used_bytes += bytes;
                if !referenced.contains(&rel) {
                    orphans.push((dir.join(rel), bytes));
                }
            }
        }
        members.push(MemberInfo { index, path: dir.clone(), marker, device, free_bytes, total_bytes, used_bytes });
    }
    Ok(SetInfo { manifest, members, files, foreign_files, orphans })
}

/// One striped file, as `deepnvme stripe inspect FILE` shows it.
#[derive(Clone, Debug)]
pub struct FileInfo {
    /// The placeholder (canonical path).
    pub path: PathBuf,
    /// The set's folder.
    pub root: PathBuf,
    /// The id of the set that striped it.
    pub id: String,
    /// The set's layout.
    pub layout: Layout,
    /// The logical size (the placeholder's).
    pub size: u64,
    /// Bytes in the members; past it, the placeholder's own.
    pub extent: u64,
    /// Each member file: path, size (None: missing), bytes it must hold.
    pub members: Vec<(PathBuf, Option<u64>, u64)>,
    /// What is wrong with it, if anything (each a sentence).
    pub problems: Vec<String>,
}

/// [`FileInfo::read`].
fn file_info(path: &Path) -> Result<Option<FileInfo>, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(mark) = mark::read_path(&real).map_err(|e| format!("{}: {e}", real.display()))? else { return Ok(None) };
    let root = real
        .parent()
        .and_then(manifest::find_root)
        .ok_or_else(|| format!("{} is marked striped (set {}) but no stripe set is above it", real.display(), mark.id))?;
    let manifest = manifest_of(&root)?;
    let size = std::fs::metadata(&real).map_err(|e| e.to_string())?.len();
    let layout = manifest.layout();
    let mut problems = Vec::new();
    if manifest.id != mark.id {
        problems.push(format!("it was striped by set {}, but the folder's set is {}", mark.id, manifest.id));
    }
    let extent = mark.extent.min(size);
    let members = manifest
        .members
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let p = dir.join(&mark.relpath);
            let have = std::fs::metadata(&p).ok().map(|m| m.len());
            let need = layout.member_size(i, extent);
            match have {
                None => problems.push(format!("member {i} file {} is missing", p.display())),
                Some(h) if h < need => problems.push(format!("member {i} file {} holds {h} bytes, needs {need}", p.display())),
                _ => {}
            }
            (p, have, need)
        })
        .collect();
    Ok(Some(FileInfo { path: real, root: manifest.root.clone(), id: mark.id, layout, size, extent, members, problems }))
}

/// Whether `path` (a file that may not exist yet) is inside a stripe set:
/// its folder or one above it holds a manifest.
pub(crate) fn in_a_set(path: &Path) -> bool {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::canonicalize(dir).ok().and_then(|d| manifest::find_root(&d)).is_some()
}

/// Why `src` cannot be copied to `dst` (a real or absolute path, in a set
/// or not), checked before the copy touches anything: a striped `src`
/// whose member files are not its own (a copy made with its attributes, a
/// file renamed and its members taken over: its bytes are another file's,
/// or gone), or a file the copy would truncate (`dst`, or the member files
/// `dst` would get in a set) that is `src` or one of its member files (by
/// device and inode, so bind mounts and member folders reached directly
/// count too). An unreadable member is an error too.
pub(crate) fn check_copy_source(src: &Path, dst: &Path) -> Result<(), String> {
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let mut read_from = vec![(src.to_path_buf(), id(src))];
    if let Some(info) = file_info(src)? {
        if let Some(problem) = info.problems.first() {
            return Err(format!("{}: {problem}", info.path.display()));
        }
        let ino = std::fs::metadata(&info.path).map_err(|e| format!("{}: {e}", info.path.display()))?.ino();
        for (i, (member, _, _)) in info.members.iter().enumerate() {
            let f = std::fs::File::open(member).map_err(|e| format!("{}: {e}", member.display()))?;
            use std::os::fd::AsRawFd;
            match mark::owner(f.as_raw_fd()) {
                Ok(Some(owner)) if owner != ino => {
                    return Err(format!(
                        "{} holds no bytes of its own: its stripe member {i} {} holds another file's (inode \
                         {owner}). It is {}; its own bytes are not there to copy",
                        info.path.display(),
                        member.display(),
                        mark::FOREIGN_MEMBERS_CAUSE
                    ))
                }
                Ok(_) => read_from.push((member.clone(), id(member))),
                Err(e) => return Err(format!("{}: reading its owner tag: {e}", member.display())),
            }
        }
    }
    let mut truncated = vec![dst.to_path_buf()];
    let dir = dst.parent().and_then(|d| std::fs::canonicalize(d).ok());
    if let (Some(dir), Some(name)) = (dir, dst.file_name()) {
        if let Some(root) = manifest::find_root(&dir) {
            let path = dir.join(name);
            let rel = path.strip_prefix(&root).unwrap_or(&path);
            truncated.extend(manifest_of(&root)?.members.iter().map(|m| m.join(rel)));
        }
    }
    for t in &truncated {
        if let Some(theirs) = id(t) {
            if let Some((what, _)) = read_from.iter().find(|(_, mine)| *mine == Some(theirs)) {
                return Err(format!(
                    "copying {} to {} would empty {} (the same file as {}) before it is read",
                    src.display(),
                    dst.display(),
                    t.display(),
                    what.display()
                ));
            }
        }
    }
    Ok(())
}

/// What `remove` did.
#[derive(Clone, Debug, Default)]
pub struct RemoveReport {
    /// Striped files (placeholders) deleted.
    pub files_deleted: usize,
    /// Member files deleted.
    pub member_files_deleted: usize,
}

/// [`Manifest::remove`].
fn remove(nvme_path: &Path, delete_files: bool) -> Result<RemoveReport, String> {
    let info = set_info(nvme_path)?;
    let root = info.manifest.root.clone();
    if !info.files.is_empty() && !delete_files {
        let some: Vec<String> = info.files.iter().take(3).map(|(p, _)| p.display().to_string()).collect();
        return Err(format!(
            "{} striped files are in {} (such as {}): copy out what you need with `deepnvme stripe cat`, \
             then remove the set with --delete-files",
            info.files.len(),
            root.display(),
            some.join(", ")
        ));
    }
    if let Some(bad) = info.members.iter().find(|m| m.marker.is_err()) {
        return Err(format!(
            "member {} ({}) is not as the manifest says ({}); nothing removed: mount its drive, or delete \
             {} by hand",
            bad.index,
            bad.path.display(),
            bad.marker.as_ref().err().map(String::as_str).unwrap_or(""),
            root.join(MANIFEST_NAME).display()
        ));
    }
    let mut report = RemoveReport::default();
    for (rel, _) in &info.files {
        std::fs::remove_file(root.join(rel)).map_err(|e| format!("{}: {e}", root.join(rel).display()))?;
        report.files_deleted += 1;
    }
    for dir in &info.manifest.members {
        for rel in files_under(dir, &[MARKER_NAME, "lost+found"]) {
            std::fs::remove_file(dir.join(&rel)).map_err(|e| format!("{}: {e}", dir.join(&rel).display()))?;
            report.member_files_deleted += 1;
        }
        // Empty folders left by member files, deepest first.
        let mut subdirs: Vec<PathBuf> = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().filter_map(|e| e.ok()) {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) && e.file_name() != "lost+found" {
                    stack.push(e.path());
                    subdirs.push(e.path());
                }
            }
        }
        subdirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in subdirs {
            let _ = std::fs::remove_dir(d);
        }
        std::fs::remove_file(dir.join(MARKER_NAME)).map_err(|e| format!("{}: {e}", dir.join(MARKER_NAME).display()))?;
    }
    std::fs::remove_file(root.join(MANIFEST_NAME)).map_err(|e| format!("{}: {e}", root.join(MANIFEST_NAME).display()))?;
    Ok(report)
}

// The set's operations hang off its types, so that the public surface stays
// a handful of types (tests/public_api.txt).

impl CreateOptions {
    /// The stripe unit a set gets unless told otherwise (1 MiB).
    pub const DEFAULT_UNIT: u64 = DEFAULT_UNIT;
}

impl Manifest {
    /// The manifest's file name in a set's folder (`.deepnvme-stripe`).
    pub const FILE_NAME: &'static str = MANIFEST_NAME;

    /// Makes `nvme_path` a stripe set over `members` (folders, made if
    /// missing). Every member folder must be empty but for `lost+found`,
    /// and no set may be inside another. Returns the manifest written.
    pub fn create(nvme_path: &Path, members: &[PathBuf], options: &CreateOptions) -> Result<Manifest, String> {
        create(nvme_path, members, options)
    }

    /// Removes the set at `nvme_path`: its member files, markers and
    /// manifest. Striped files still in it are refused unless
    /// `delete_files` (then their placeholders go too); copy out what you
    /// need first (`deepnvme stripe cat`).
    pub fn remove(nvme_path: &Path, delete_files: bool) -> Result<RemoveReport, String> {
        remove(nvme_path, delete_files)
    }

    /// Whether the file system of folder `dir` keeps user extended
    /// attributes (the placeholders' marks need them), by marking a probe
    /// file.
    pub fn check_xattrs(dir: &Path) -> io::Result<()> {
        probe_xattrs(dir)
    }
}

impl SetInfo {
    /// Describes the set at `nvme_path`: members, files, orphaned member
    /// files.
    pub fn read(nvme_path: &Path) -> Result<SetInfo, String> {
        set_info(nvme_path)
    }
}

impl FileInfo {
    /// Describes the striped file at `path`; `Ok(None)` for a plain file.
    pub fn read(path: &Path) -> Result<Option<FileInfo>, String> {
        file_info(path)
    }
}
