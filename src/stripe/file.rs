//! One op's view of a striped file: the set it belongs to, its member
//! files opened the way the op opened the placeholder, the checks that
//! members agree with the manifest and the mark, and (for a write past the
//! striped extent) growing the file under the placeholder's lock.
//!
//! A member that disagrees is an error naming it, before any byte moves:
//! a member folder without its marker (a drive not mounted), one of
//! another set, a member file on another device than its marker, a member
//! file shorter than the file's extent needs (truncated or replaced), a
//! manifest of another set than the file's mark (made again over existing
//! files).
//!
//! Growing a file's extent for a write and reading its logical bytes back
//! are `extent.rs`'s.

use std::collections::HashMap;
use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Direction, Error, Result};
use crate::file::{open_raw, stat_for_io, DioAlignment, OpenFile};
use crate::rt::sync::Mutex;

use super::layout::Layout;
use super::manifest::{self, LoadError, Manifest, MANIFEST_NAME, MARKER_NAME};
use super::mark::{self, Locked, Mark};

/// One member's file, as an op holds it.
#[derive(Debug)]
pub(crate) struct MemberFile {
    pub path: PathBuf,
    pub direct_fd: Option<RawFd>,
    pub buffered_fd: Option<RawFd>,
    pub dio: Option<DioAlignment>,
    /// On a file system io_uring punts for (tmpfs, ramfs).
    pub punts: Option<crate::engine::choice::PuntingFs>,
}

/// A striped file, as one op sees it.
#[derive(Debug)]
pub(crate) struct StripedFile {
    pub manifest: Arc<Manifest>,
    pub layout: Layout,
    pub mark: Mark,
    /// Logical bytes `[0, extent)` are in the members; the rest are the
    /// placeholder's own.
    pub extent: u64,
    /// The placeholder's real path (for messages and tools).
    pub logical: PathBuf,
    pub members: Vec<MemberFile>,
    /// The O_DIRECT alignment every member meets; `None` when one has none.
    pub dio: Option<DioAlignment>,
    /// The placeholder's inode: its member files are tagged with it.
    placeholder_ino: Option<u64>,
    access: libc::c_int,
    owned: Vec<RawFd>,
}

impl crate::file::Companion for StripedFile {
    fn close_owned(&mut self) -> std::result::Result<(), i32> {
        StripedFile::close_owned(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for StripedFile {
    fn drop(&mut self) {
        for &fd in &self.owned {
            // SAFETY: descriptors this op opened and nobody else holds.
            unsafe { libc::close(fd) };
        }
    }
}

pub(super) fn err(path: &Path, action: &'static str, source: io::Error) -> Error {
    Error::File { path: path.to_path_buf(), action, source }
}

pub(super) fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// The real path of the file open on `fd` (symbolic links resolved), or
/// `fallback` made absolute.
fn real_path(fd: RawFd, fallback: Option<&Path>) -> Option<PathBuf> {
    if let Ok(p) = std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        if p.is_absolute() {
            return Some(p);
        }
    }
    let p = fallback?;
    if p.is_absolute() {
        Some(p.to_path_buf())
    } else {
        std::env::current_dir().ok().map(|d| d.join(p))
    }
}

pub(super) fn fd_size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fstat fills a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_size as u64)
    }
}

pub(super) fn truncate(fd: RawFd, size: u64) -> io::Result<()> {
    loop {
        // SAFETY: ftruncate on a descriptor the op holds open for writing.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Member folders this process found marked as the member they are, and
/// the device each marker is on: (set id, index, the manifest's unit, so
/// that an edited unit is checked again) -> device.
static VERIFIED: Mutex<Option<HashMap<VerifiedMember, u64>>> = Mutex::new(None);

/// (set id, member index, the manifest's unit).
type VerifiedMember = (String, usize, u64);

/// The device of member `index`'s marker, after checking that the marker
/// names this set and this place (once per process and member).
fn verified_member_dev(manifest: &Manifest, index: usize, again: bool) -> Result<u64> {
    let key = (manifest.id.clone(), index, manifest.unit);
    if !again {
        if let Some(cache) = VERIFIED.try_lock() {
            if let Some(dev) = cache.as_ref().and_then(|c| c.get(&key)) {
                return Ok(*dev);
            }
        }
    }
    let dir = &manifest.members[index];
    let marker_path = dir.join(MARKER_NAME);
    let (marker, dev) = manifest::read_marker(dir).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::NotFound => format!(
                "stripe member {index} of {} has no marker {MARKER_NAME}: is its drive mounted? \
                 (`deepnvme stripe inspect {}`)",
                manifest.root.display(),
                manifest.root.display()
            ),
            _ => format!("stripe member {index} of {}: {e}", manifest.root.display()),
        };
        err(&marker_path, "checking stripe member marker", other(why))
    })?;
    if marker.id != manifest.id || marker.index != index || marker.count != manifest.members.len() {
        let why = format!(
            "this folder is member {} of {} of stripe set {} (at {}), but {} lists it as member {index} of {} \
             of set {}",
            marker.index,
            marker.count,
            marker.id,
            marker.set.display(),
            manifest.root.join(MANIFEST_NAME).display(),
            manifest.members.len(),
            manifest.id
        );
        return Err(err(&marker_path, "checking stripe member marker", other(why)));
    }
    if let Some(unit) = marker.unit.filter(|&u| u != manifest.unit) {
        let why = format!(
            "{} says unit = {}, but the set was made with unit {unit} (its member markers say so): the manifest was \
             edited, and every striped file would read scrambled; restore unit = {unit}",
            manifest.root.join(MANIFEST_NAME).display(),
            manifest.unit
        );
        return Err(err(&marker_path, "checking stripe member marker", other(why)));
    }
    if let Some(mut cache) = VERIFIED.try_lock() {
        cache.get_or_insert_with(HashMap::new).insert(key, dev);
    }
    Ok(dev)
}

/// Where the manifest of a file found at `real` is: the nearest folder
/// above it that holds one.
fn manifest_above(real: &Path) -> Option<(PathBuf, Arc<Manifest>, PathBuf)> {
    let root = manifest::find_root(real.parent()?)?;
    let manifest = manifest::load(&root).ok()?;
    let relpath = real.strip_prefix(&root).ok()?.to_path_buf();
    Some((root, manifest, relpath))
}

fn load_error(root: &Path, e: LoadError) -> Error {
    let path = root.join(MANIFEST_NAME);
    match e {
        LoadError::Missing => err(&path, "reading stripe manifest", io::Error::from_raw_os_error(libc::ENOENT)),
        LoadError::Io(e) => err(&path, "reading stripe manifest", e),
        LoadError::Invalid(why) => err(&path, "reading stripe manifest", other(why)),
    }
}

/// Whether `file` is striped, and if so its members opened for the op.
/// A plain file (no mark) is `None`; so is a file on a file system without
/// user extended attributes. A write to an empty, unmarked file under a
/// stripe set's folder makes it a striped file.
pub(super) fn attach(file: &OpenFile, direction: Direction) -> Result<Option<Box<StripedFile>>> {
    if file.identity().is_some_and(|id| id.block_device) {
        return Ok(None);
    }
    let fd = file.any_fd();
    let mark = match mark::read(fd) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(err(&file.display_path(), "reading the stripe mark of", e))
        }
        // Any other failure to read an attribute: a plain file.
        Err(_) => None,
    };
    match mark {
        Some(mark) => open_marked(file, direction, mark).map(|s| Some(Box::new(s))),
        None if direction == Direction::Write && file.size().ok() == Some(0) => mark_new(file),
        None => Ok(None),
    }
}

/// An empty file under a stripe set, about to be written: marks it and
/// empties its member files (left by an earlier file of that name, such as
/// DeepSpeed's swap files after it removed their folder).
fn mark_new(file: &OpenFile) -> Result<Option<Box<StripedFile>>> {
    let fd = file.any_fd();
    let Some(real) = real_path(fd, file.path()) else { return Ok(None) };
    let Some((root, manifest, relpath)) = manifest_above(&real) else { return Ok(None) };
    // A member folder inside the set's own folder would stripe its own files.
    if relpath.as_os_str().is_empty() || relpath.starts_with(MANIFEST_NAME) {
        return Ok(None);
    }
    let _lock = Locked::take(fd).map_err(|e| err(&real, "locking stripe placeholder", e))?;
    if let Ok(Some(mark)) = mark::read(fd) {
        // Another op marked it first.
        drop(_lock);
        return open_marked(file, Direction::Write, mark).map(|s| Some(Box::new(s)));
    }
    if fd_size(fd).map_err(|e| err(&real, "fstat of", e))? != 0 {
        return Ok(None);
    }
    let mark = Mark { id: manifest.id.clone(), extent: 0, relpath };
    let ino = file.order_identity().map(|id| id.ino);
    let mut striped = StripedFile::open_members(manifest, mark, 0, real.clone(), libc::O_WRONLY, true, ino)?;
    mark::write(fd, &striped.mark).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::ENOTSUP) => other(format!(
                "the file system of {} keeps no user extended attributes, which a stripe set's folder needs \
                 (`deepnvme doctor` checks it)",
                root.display()
            )),
            _ => e,
        };
        err(&real, "marking stripe placeholder", why)
    })?;
    striped.extent = 0;
    Ok(Some(Box::new(striped)))
}

/// A marked file: its set's manifest, checked against the mark, and its
/// members, checked against the manifest and the extent.
fn open_marked(file: &OpenFile, direction: Direction, mark: Mark) -> Result<StripedFile> {
    let fd = file.any_fd();
    let shown = file.display_path();
    let real = real_path(fd, file.path()).ok_or_else(|| {
        err(&shown, "finding the stripe set of", other("its real path is unknown (no /proc/self/fd)".into()))
    })?;
    let root = real.parent().and_then(manifest::find_root).ok_or_else(|| {
        let why = format!(
            "it is a striped file of stripe set {}, but no {MANIFEST_NAME} is in its folder or above: the set \
             was removed, or the file was moved out of it",
            mark.id
        );
        err(&real, "finding the stripe set of", other(why))
    })?;
    let manifest = manifest::load(&root).map_err(|e| load_error(&root, e))?;
    if manifest.id != mark.id {
        let why = format!(
            "it was striped by stripe set {}, but {} declares set {}: the set was made again over existing files; \
             remove the file (its bytes are not readable under the new set)",
            mark.id,
            root.join(MANIFEST_NAME).display(),
            manifest.id
        );
        return Err(err(&real, "checking stripe set of", other(why)));
    }
    let size = file.size()?;
    let access = match direction {
        Direction::Read => libc::O_RDONLY,
        Direction::Write => libc::O_WRONLY,
    };
    let ino = file.order_identity().map(|id| id.ino);
    // A truncation is cut from the members (`settle_truncation`, by
    // `stripe::open`) once they are checked as this file's own.
    let extent = size.min(mark.extent);
    StripedFile::open_members(manifest, mark, extent, real, access, false, ino)
}

impl StripedFile {
    /// Opens every member's file for `access`, checking each against the
    /// manifest and the extent. `fresh`: the file is new; member files are
    /// created (with their folders) and emptied.
    fn open_members(
        manifest: Arc<Manifest>,
        mark: Mark,
        extent: u64,
        logical: PathBuf,
        access: libc::c_int,
        fresh: bool,
        placeholder_ino: Option<u64>,
    ) -> Result<StripedFile> {
        let layout = manifest.layout();
        let mut striped = StripedFile {
            layout,
            mark,
            extent,
            logical,
            members: Vec::with_capacity(layout.members),
            dio: None,
            placeholder_ino,
            access,
            owned: Vec::with_capacity(layout.members),
            manifest,
        };
        let mut dio = Some(DioAlignment { offset: 1, memory: 1 });
        for index in 0..layout.members {
            let member = striped.open_member(index, fresh)?;
            dio = match (dio, member.dio) {
                (Some(a), Some(b)) => Some(DioAlignment { offset: a.offset.max(b.offset), memory: a.memory.max(b.memory) }),
                _ => None,
            };
            striped.members.push(member);
        }
        striped.dio = dio;
        Ok(striped)
    }

    fn open_member(&mut self, index: usize, fresh: bool) -> Result<MemberFile> {
        let dir = self.manifest.members[index].clone();
        let path = dir.join(&self.mark.relpath);
        let writes = self.access != libc::O_RDONLY;
        let opening = if writes { "opening stripe member for write" } else { "opening stripe member for read" };
        let mut flags = self.access | libc::O_DIRECT | if fresh { libc::O_TRUNC } else { 0 };
        let mut verified = false;
        let fd = loop {
            match open_raw(&path, flags, 0o600) {
                Ok(fd) => break fd,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && flags & libc::O_DIRECT != 0 => {
                    // The member's file system has no O_DIRECT.
                    flags &= !libc::O_DIRECT;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && writes && flags & libc::O_CREAT == 0 => {
                    // Never create a member file before knowing its folder is
                    // the member (not an empty mount point of a missing drive).
                    verified_member_dev(&self.manifest, index, true)?;
                    verified = true;
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).map_err(|e| err(parent, "creating stripe member folder", e))?;
                    }
                    flags |= libc::O_CREAT;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // Check the folder first: its message says more.
                    verified_member_dev(&self.manifest, index, true)?;
                    let why = format!(
                        "stripe member {index} has no file for {} (set at {}): it was removed, or the member's \
                         drive was replaced",
                        self.logical.display(),
                        self.manifest.root.display()
                    );
                    return Err(err(&path, opening, other(why)));
                }
                Err(e) => return Err(err(&path, opening, e)),
            }
        };
        self.owned.push(fd);
        self.check_owner(index, &path, fd, fresh)?;
        let (dio, size, identity) = stat_for_io(fd);
        let dio = if flags & libc::O_DIRECT != 0 { dio } else { None };
        // The member file must be on the device its marker is on.
        let marker_dev = verified_member_dev(&self.manifest, index, false)?;
        if let Some(id) = identity {
            let dev = libc::makedev(id.dev_major, id.dev_minor);
            if dev != marker_dev && (verified || verified_member_dev(&self.manifest, index, true)? != dev) {
                let why = format!(
                    "stripe member {index}'s file is on device {}:{}, its marker {} is not: was a drive \
                     mounted over part of the member folder?",
                    id.dev_major,
                    id.dev_minor,
                    self.manifest.members[index].join(MARKER_NAME).display()
                );
                return Err(err(&path, "checking stripe member", other(why)));
            }
        }
        let size = match size {
            Some(s) => s,
            None => fd_size(fd).map_err(|e| err(&path, "fstat of", e))?,
        };
        let need = self.layout.member_size(index, self.extent);
        if size < need {
            let why = format!(
                "stripe member {index} holds {size} bytes of {}, whose first {} striped bytes need {need} there: \
                 the member file was truncated or replaced",
                self.logical.display(),
                self.extent
            );
            return Err(err(&path, "checking stripe member", other(why)));
        }
        let punts = match identity {
            Some(id) if id.dev_major != 0 => None,
            _ => crate::engine::choice::punting_fs(fd),
        };
        let direct = dio.is_some().then_some(fd);
        let buffered = (flags & libc::O_DIRECT == 0).then_some(fd);
        Ok(MemberFile { path, direct_fd: direct, buffered_fd: buffered, dio, punts })
    }

    /// A fresh member file is tagged as this placeholder's; any other must
    /// carry its tag (or none: made by an older deepnvme).
    fn check_owner(&self, index: usize, path: &Path, fd: RawFd, fresh: bool) -> Result<()> {
        let Some(mine) = self.placeholder_ino else { return Ok(()) };
        if fresh {
            return mark::tag_owner(fd, mine).map_err(|e| err(path, "tagging stripe member", e));
        }
        match mark::owner(fd) {
            Ok(Some(owner)) if owner != mine => {
                let why = format!(
                    "stripe member {index} of {} holds the bytes of another file (inode {owner}, not this \
                     placeholder's {mine}): this file is {} (its old name: {})",
                    self.logical.display(),
                    mark::FOREIGN_MEMBERS_CAUSE,
                    self.mark.relpath.display()
                );
                // A write would change the other file's bytes: refused. A
                // read gives that file's bytes (DeepSpeed reads its
                // checkpoint's copies so), said once.
                if self.access != libc::O_RDONLY {
                    return Err(err(path, "checking stripe member", other(format!("{why}; writing it would change that file"))));
                }
                crate::rt::log::info_once(
                    &format!("stripe-shared-{}", self.logical.display()),
                    &format!("{why}; reading that file's bytes (they change when it is written; copy striped files with `deepnvme stripe cp` or `deepnvme.copy2`)"),
                );
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(err(path, "reading the owner tag of stripe member", e)),
        }
    }

    /// Opens each member's buffered descriptor, where it has none yet.
    pub fn open_buffered(&mut self) -> Result<()> {
        for i in 0..self.members.len() {
            if self.members[i].buffered_fd.is_some() {
                continue;
            }
            let path = self.members[i].path.clone();
            let fd = open_raw(&path, self.access, 0).map_err(|e| err(&path, "re-opening stripe member without O_DIRECT", e))?;
            self.owned.push(fd);
            self.members[i].buffered_fd = Some(fd);
        }
        Ok(())
    }

    /// Closes every member descriptor, reporting the first failure (a
    /// deferred write error shows at close()).
    pub fn close_owned(&mut self) -> std::result::Result<(), i32> {
        let mut first = None;
        for fd in self.owned.drain(..) {
            // SAFETY: descriptors this op opened and nobody else holds.
            if unsafe { libc::close(fd) } != 0 {
                let e = crate::error::last_errno();
                if e != libc::EINTR && first.is_none() {
                    first = Some(e);
                }
            }
        }
        for m in &mut self.members {
            m.direct_fd = None;
            m.buffered_fd = None;
        }
        first.map_or(Ok(()), Err)
    }
}
