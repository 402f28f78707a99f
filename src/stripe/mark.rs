//! The mark on a placeholder: an extended attribute (`user.deepnvme.stripe`)
//! that says the file is striped, by which set, where its member files
//! are (its path under the set when it was made, so a renamed placeholder
//! still finds them) and how many of its first bytes are striped (its
//! extent). Bytes past the extent are the placeholder's own: what another
//! program appended, such as FastPersist's unaligned tail written with
//! plain `open(path, "ab")`.
//!
//! A file without the mark is a plain file, even inside a stripe set.
//! Changes to the mark are made under `flock` on the placeholder, so
//! processes that extend one file at once agree.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const XATTR: &[u8] = b"user.deepnvme.stripe\0";
const VERSION: &str = "1";

/// What a placeholder's mark says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub id: String,
    pub extent: u64,
    /// The member files' path under each member folder.
    pub relpath: PathBuf,
}

impl Mark {
    fn format(&self) -> Vec<u8> {
        let mut v = format!("{VERSION} {} {} ", self.id, self.extent).into_bytes();
        v.extend_from_slice(self.relpath.as_os_str().as_bytes());
        v
    }

    fn parse(bytes: &[u8]) -> Option<Mark> {
        let mut parts = bytes.splitn(4, |&b| b == b' ');
        let version = parts.next()?;
        let id = std::str::from_utf8(parts.next()?).ok()?;
        let extent = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let relpath = parts.next()?;
        if version != VERSION.as_bytes() || relpath.is_empty() {
            return None;
        }
        let relpath = PathBuf::from(std::ffi::OsStr::from_bytes(relpath));
        Some(Mark { id: id.to_string(), extent, relpath })
    }
}

/// The mark of the file open on `fd`: `Ok(None)` when it has none (or its
/// file system keeps no user attributes); an unreadable mark is an error.
pub fn read(fd: RawFd) -> io::Result<Option<Mark>> {
    let mut buf = [0u8; 4096];
    let Some(n) = get_attr(fd, XATTR, &mut buf)? else { return Ok(None) };
    Mark::parse(&buf[..n])
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "its stripe mark (user.deepnvme.stripe) is not one deepnvme wrote"))
}

/// Marks the file open on `fd`.
pub fn write(fd: RawFd, mark: &Mark) -> io::Result<()> {
    set_attr(fd, XATTR, &mark.format())
}

/// Attribute `name` (NUL-terminated) of the file open on `fd` into `buf`:
/// its length, or `None` when the file has none or its file system keeps
/// no user attributes.
fn get_attr(fd: RawFd, name: &[u8], buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: fgetxattr writes at most `buf.len()` bytes into `buf`; the name is NUL-terminated.
    let n = unsafe { libc::fgetxattr(fd, name.as_ptr() as *const libc::c_char, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(n as usize))
}

/// Sets attribute `name` (NUL-terminated) of the file open on `fd`.
fn set_attr(fd: RawFd, name: &[u8], value: &[u8]) -> io::Result<()> {
    // SAFETY: reads `value.len()` bytes of `value`; the name is NUL-terminated.
    let rc = unsafe {
        libc::fsetxattr(fd, name.as_ptr() as *const libc::c_char, value.as_ptr() as *const libc::c_void, value.len(), 0)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How a placeholder comes to have member files that are another's: said
/// by every message about it.
pub const FOREIGN_MEMBERS_CAUSE: &str = "a copy of a striped file made with its extended attributes (cp -a, \
     rsync -X, shutil.copy2, or a checkpoint's offloaded tensors saved by an earlier deepnvme), which shares that \
     file's member files, or it was renamed and a new file written at its old name took its member files over";

/// The attribute on each member file naming the placeholder (its inode)
/// whose bytes it holds: a placeholder copied with its attributes (`cp -a`,
/// `shutil.copy2`, `rsync -X`), or one renamed and then replaced by a new
/// file of its old name (which takes the member files over), finds member
/// files that are not its own, and says so instead of moving another
/// file's bytes.
const OWNER_XATTR: &[u8] = b"user.deepnvme.stripe.owner\0";

/// Tags the member file open on `fd` as holding the bytes of placeholder
/// inode `owner`. A file system without user attributes is not an error
/// (its member files are then not checked).
pub fn tag_owner(fd: RawFd, owner: u64) -> io::Result<()> {
    match set_attr(fd, OWNER_XATTR, owner.to_string().as_bytes()) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Ok(()),
        done => done,
    }
}

/// The placeholder inode whose bytes the member file open on `fd` holds;
/// `None` when it has no tag (made by an older deepnvme, or on a file
/// system without user attributes).
pub fn owner(fd: RawFd) -> io::Result<Option<u64>> {
    let mut buf = [0u8; 32];
    let Some(n) = get_attr(fd, OWNER_XATTR, &mut buf)? else { return Ok(None) };
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "its owner tag (user.deepnvme.stripe.owner) is not one deepnvme wrote"))
}

/// The mark of the file at `path` (for tools walking a set).
pub fn read_path(path: &Path) -> io::Result<Option<Mark>> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: opens a path for reading its attributes only; closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mark = read(fd);
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    mark
}

/// An exclusive `flock` on a placeholder, let go on drop.
pub struct Locked(RawFd);

impl Locked {
    pub fn take(fd: RawFd) -> io::Result<Locked> {
        loop {
            // SAFETY: flock on a descriptor the caller holds open for the guard's life.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
                return Ok(Locked(fd));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: unlocks what `take` locked; the descriptor is still open.
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_with_spaces_in_paths() {
        let m = Mark { id: "0123456789abcdef".into(), extent: 12345, relpath: PathBuf::from("a b/c d.swp") };
        assert_eq!(Mark::parse(&m.format()), Some(m));
        assert_eq!(Mark::parse(b"2 0123456789abcdef 0 x"), None);
        assert_eq!(Mark::parse(b"1 0123456789abcdef zero x"), None);
    }
}
