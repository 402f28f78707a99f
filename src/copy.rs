//! Copying a file by its logical bytes, so that a copy of a stripe set's
//! file holds its bytes.
//!
//! A placeholder holds none of its bytes (they are in the member files), so
//! a byte copy (`cp`, `shutil.copy2`) of one gives zeros, and a copy with
//! its attributes names the original's member files instead of holding
//! bytes of its own. DeepSpeed copies the optimizer's swap files into a
//! checkpoint and back with `shutil.copytree`: [`copy_file`] is what its
//! copies go through on a stripe set (the Python package hands it to
//! `copytree`), and `deepnvme stripe cp`.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::config::HandleConfig;
use crate::error::{Error, Result};
use crate::file::FileTarget;
use crate::handle::IoHandle;
use crate::pinned::LockedBuffer;
use crate::stripe;

/// How many bytes a copy moves per read and write.
const CHUNK: usize = 64 << 20;

fn file_error(path: &Path, action: &'static str, source: std::io::Error) -> Error {
    Error::File { path: path.to_path_buf(), action, source }
}

/// Whether a copy from `src` to `dst` needs [`copy_file`]: `src` is a
/// stripe set's placeholder, or `dst` is one, or (`into_a_set`: DeepSpeed's
/// load of its swap files, whose copies must stay on the drives) `dst`
/// lies in a set. Any other copy may go any way: a plain file copied into a
/// set by another program stays a plain file there, readable by anything.
/// (The Python package's question.)
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn copy_needs_logical_bytes(src: &Path, dst: &Path, into_a_set: bool) -> Result<bool> {
    let real = std::fs::canonicalize(src).map_err(|e| file_error(src, "resolve", e))?;
    if stripe::is_placeholder(&real).map_err(|e| file_error(&real, "read the stripe mark of", e))? {
        return Ok(true);
    }
    if into_a_set && stripe::in_a_set(dst) {
        return Ok(true);
    }
    match std::fs::canonicalize(dst) {
        // A destination it cannot read the mark of is not one deepnvme made.
        Ok(real) => Ok(stripe::is_placeholder(&real).unwrap_or(false)),
        Err(_) => Ok(false),
    }
}

/// Copies `src`'s logical bytes (a striped file's from its members, a
/// plain file's as they are) to `dst`, keeping `src`'s permission bits and
/// times, as `shutil.copy2` does for plain files; returns the bytes copied.
///
/// Inside a stripe set the copy is striped, with member files of its own;
/// elsewhere it is a plain file. An existing placeholder at `dst` is
/// replaced (a new file, which takes its member files over), an existing
/// plain file is truncated. Nothing of `src`'s stripe mark is copied, so
/// the copy never shares bytes with `src`. `dst` is touched only once
/// `src` has been checked and its first bytes read: a striped `src` whose
/// member files are not its own (a copy made with its attributes) is
/// refused, so is copying a file onto itself.
pub fn copy_file(src: &Path, dst: &Path) -> Result<u64> {
    let src_real = std::fs::canonicalize(src).map_err(|e| file_error(src, "resolve", e))?;
    let meta = std::fs::metadata(&src_real).map_err(|e| file_error(&src_real, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::InvalidArgument(format!("{} is not a regular file: only files are copied", src.display())));
    }
    let dst_path = match std::fs::canonicalize(dst) {
        Ok(real) => real,
        // A link to a missing file would be written where the checks below
        // do not look.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && dst.is_symlink() => {
            return Err(file_error(dst, "copy to", std::io::Error::other("it is a symbolic link to a missing file")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::path::absolute(dst).map_err(|e| file_error(dst, "resolve", e))?
        }
        Err(e) => return Err(file_error(dst, "resolve", e)),
    };
    if let Ok(m) = std::fs::metadata(&dst_path) {
        if m.dev() == meta.dev() && m.ino() == meta.ino() {
            return Err(Error::InvalidArgument(format!(
                "{} and {} are the same file: nothing copied",
                src_real.display(),
                dst_path.display()
            )));
        }
    }
    stripe::check_copy_source(&src_real, &dst_path).map_err(|why| Error::InvalidArgument(format!("nothing copied: {why}")))?;
    let source = std::fs::File::open(&src_real).map_err(|e| file_error(&src_real, "open", e))?;
    let size = meta.len();
    let handle = IoHandle::new(HandleConfig {
        block_size: 1 << 20,
        queue_depth: 32,
        intra_op_parallelism: 1,
        ..HandleConfig::default()
    })?;
    let chunk = usize::try_from(size).unwrap_or(CHUNK).clamp(1, CHUNK);
    // Locked memory moves without a copy; plain memory bounces, but works
    // under any RLIMIT_MEMLOCK.
    let mut locked = LockedBuffer::new(chunk).ok();
    let mut plain = if locked.is_none() { vec![0u8; chunk] } else { Vec::new() };
    // The ops go by path (the handle opens them O_DIRECT and errors name
    // them); the descriptors held here check that the paths still name
    // the same files when the copy ends. The destination is made once the
    // source has given its first bytes.
    let mut made = None;
    let mut offset = 0u64;
    let dest = loop {
        let n = usize::try_from(size - offset).unwrap_or(chunk).min(chunk);
        let buf: &mut [u8] = match &mut locked {
            Some(b) => &mut b[..n],
            None => &mut plain[..n],
        };
        if n > 0 {
            handle.read_into(buf, FileTarget::Path(&src_real), offset)?;
        }
        let dest = match made.take() {
            Some(d) => d,
            None => new_destination(&dst_path)?,
        };
        if n > 0 {
            handle.write_from(buf, FileTarget::Path(&dst_path), offset)?;
            offset += n as u64;
        }
        if offset >= size {
            break dest;
        }
        made = Some(dest);
    };
    same_file_still(&source, &src_real, "the source")?;
    same_file_still(&dest, &dst_path, "the copy")?;
    let now = source.metadata().map_err(|e| file_error(&src_real, "stat", e))?.len();
    if now != size {
        return Err(Error::File {
            path: src_real,
            action: "copy",
            source: std::io::Error::other(format!(
                "its size changed from {size} to {now} bytes during the copy: {} holds a mix",
                dst_path.display()
            )),
        });
    }
    keep_mode_and_times(&dest, &dst_path, &meta)?;
    Ok(size)
}

/// Whether `path` still names the file open as `held` (nothing renamed or
/// replaced it while the copy went by path).
fn same_file_still(held: &std::fs::File, path: &Path, what: &str) -> Result<()> {
    let h = held.metadata().map_err(|e| file_error(path, "stat", e))?;
    match std::fs::metadata(path) {
        Ok(m) if m.dev() == h.dev() && m.ino() == h.ino() => Ok(()),
        _ => Err(Error::File {
            path: path.to_path_buf(),
            action: "copy",
            source: std::io::Error::other(format!("{what} was renamed or replaced during the copy")),
        }),
    }
}

/// Makes `dst` (a real or absolute path) an empty, unmarked file open for
/// reading and writing.
fn new_destination(dst: &Path) -> Result<std::fs::File> {
    // A placeholder goes: a new file of its name takes its member files
    // over and empties them (writing into it would leave its mark claiming
    // the old bytes).
    if stripe::is_placeholder(dst).unwrap_or(false) {
        std::fs::remove_file(dst).map_err(|e| file_error(dst, "remove the placeholder", e))?;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(|e| file_error(dst, "create", e))
}

/// `dst` gets `src`'s permission bits and access and modification times.
fn keep_mode_and_times(dst: &std::fs::File, path: &Path, src: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    dst.set_permissions(std::fs::Permissions::from_mode(src.mode() & 0o7777))
        .map_err(|e| file_error(path, "set the permissions of", e))?;
    let times = [
        libc::timespec { tv_sec: src.atime() as libc::time_t, tv_nsec: src.atime_nsec() as _ },
        libc::timespec { tv_sec: src.mtime() as libc::time_t, tv_nsec: src.mtime_nsec() as _ },
    ];
    // SAFETY: a descriptor `dst` holds and two timespecs, as futimens reads them.
    if unsafe { libc::futimens(dst.as_raw_fd(), times.as_ptr()) } != 0 {
        return Err(file_error(path, "set the times of", std::io::Error::last_os_error()));
    }
    Ok(())
}
