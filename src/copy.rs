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

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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

/// Whether a copy from `src` to `dst` needs [`copy_file`]: either is a
/// stripe set's placeholder (a missing `dst` is not). A plain copy of
/// plain files may go any way. (The Python package's question.)
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn copy_needs_logical_bytes(src: &Path, dst: &Path) -> Result<bool> {
    let real = std::fs::canonicalize(src).map_err(|e| file_error(src, "resolve", e))?;
    if stripe::is_placeholder(&real).map_err(|e| file_error(&real, "read the stripe mark of", e))? {
        return Ok(true);
    }
    match std::fs::canonicalize(dst) {
        Ok(real) => stripe::is_placeholder(&real).map_err(|e| file_error(&real, "read the stripe mark of", e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(file_error(dst, "resolve", e)),
    }
}

/// Copies `src`'s logical bytes (a striped file's from its members, a
/// plain file's as they are) to `dst`, keeping `src`'s permission bits and
/// times, as `shutil.copy2` does for plain files; returns the bytes copied.
///
/// `dst` is a new file: an existing placeholder at `dst` is removed first
/// (its member files go to the new file, which empties them), an existing
/// plain file is truncated. Inside a stripe set the copy is striped, with
/// member files of its own; elsewhere it is a plain file. Nothing of
/// `src`'s stripe mark is copied, so the copy never shares bytes with
/// `src`. `src` and `dst` must be different files.
pub fn copy_file(src: &Path, dst: &Path) -> Result<u64> {
    let src_real = std::fs::canonicalize(src).map_err(|e| file_error(src, "resolve", e))?;
    let meta = std::fs::metadata(&src_real).map_err(|e| file_error(&src_real, "stat", e))?;
    if !meta.is_file() {
        return Err(Error::InvalidArgument(format!("{} is not a regular file: only files are copied", src.display())));
    }
    let dst_real = prepare_destination(&src_real, &meta, dst)?;
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
    let mut offset = 0u64;
    while offset < size {
        let n = usize::try_from(size - offset).unwrap_or(chunk).min(chunk);
        let buf: &mut [u8] = match &mut locked {
            Some(b) => &mut b[..n],
            None => &mut plain[..n],
        };
        handle.read_into(buf, FileTarget::Path(&src_real), offset)?;
        handle.write_from(buf, FileTarget::Path(&dst_real), offset)?;
        offset += n as u64;
    }
    keep_mode_and_times(&dst_real, &meta)?;
    Ok(size)
}

/// Makes `dst` an empty, unmarked file, and returns its real path.
fn prepare_destination(src_real: &Path, src_meta: &std::fs::Metadata, dst: &Path) -> Result<PathBuf> {
    let dst_real = match std::fs::canonicalize(dst) {
        Ok(real) => {
            let m = std::fs::metadata(&real).map_err(|e| file_error(&real, "stat", e))?;
            if m.dev() == src_meta.dev() && m.ino() == src_meta.ino() {
                return Err(Error::InvalidArgument(format!(
                    "{} and {} are the same file: nothing copied",
                    src_real.display(),
                    real.display()
                )));
            }
            // A placeholder goes: a new file of its name takes its member
            // files over and empties them (writing into it would leave its
            // mark claiming the old bytes).
            if stripe::is_placeholder(&real).map_err(|e| file_error(&real, "read the stripe mark of", e))? {
                std::fs::remove_file(&real).map_err(|e| file_error(&real, "remove the placeholder", e))?;
            }
            real
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => dst.to_path_buf(),
        Err(e) => return Err(file_error(dst, "resolve", e)),
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&dst_real)
        .map_err(|e| file_error(&dst_real, "create", e))?;
    Ok(dst_real)
}

/// `dst` gets `src`'s permission bits and access and modification times.
fn keep_mode_and_times(dst: &Path, src: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(src.mode() & 0o7777))
        .map_err(|e| file_error(dst, "set the permissions of", e))?;
    let c = CString::new(dst.as_os_str().as_bytes()).map_err(|_| file_error(dst, "set the times of", std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    let times = [
        libc::timespec { tv_sec: src.atime() as libc::time_t, tv_nsec: src.atime_nsec() as _ },
        libc::timespec { tv_sec: src.mtime() as libc::time_t, tv_nsec: src.mtime_nsec() as _ },
    ];
    // SAFETY: a NUL-terminated path and two timespecs, as utimensat reads them.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) } != 0 {
        return Err(file_error(dst, "set the times of", std::io::Error::last_os_error()));
    }
    Ok(())
}
