//! Stripe sets: one folder (DeepSpeed's `nvme_path`) whose files keep
//! their bytes on several drives, unit by unit in turn, with no RAID.
//!
//! **Declared by a manifest in the folder** (`.deepnvme-stripe`, written by
//! `deepnvme stripe create`): every process that opens a file under the
//! folder — each rank, the CLI, the Python API, DeepSpeed through either
//! front end — finds the same layout with no setting of its own, it
//! survives restarts, and tools can read it. Each member folder holds a
//! marker naming its set and place, so a drive that is not mounted (its
//! folder missing or empty) is an error naming it, never a file written
//! to the wrong disk.
//!
//! **Files stay files.** A file written under the folder is a placeholder
//! of the logical size (sparse: it holds no bytes), marked with an extended
//! attribute (`mark.rs`), and its bytes are in one file per member, at the
//! same path under each member folder. So DeepSpeed's own handling of its
//! swap files works unchanged: `os.makedirs`, `shutil.rmtree` of old swap
//! folders (a new file of the same name empties the old member files),
//! `os.path.getsize`; and the placeholder's device and inode are the one
//! identity by which the handle orders ops on the logical bytes.
//!
//! Files: `layout.rs` (logical to member offsets), `manifest.rs` (the
//! manifest and member markers), `mark.rs` (the placeholder's mark and
//! lock), `file.rs` (an op's members: opening, checks), `extent.rs` (growing a
//! file's striped extent, reading logical bytes back), `plan.rs`
//! (an op's segments on the members, errors naming them), `admin.rs` (what
//! the CLI does: create, inspect, remove; the public surface is its types,
//! with the operations as their associated functions).

mod admin;
mod extent;
mod file;
mod layout;
mod manifest;
mod mark;
mod plan;

pub use admin::{CreateOptions, FileInfo, MemberInfo, RemoveReport, SetInfo};
pub(crate) use admin::{check_copy_source, in_a_set};
pub use layout::Layout;
pub use manifest::Manifest;

use std::sync::Arc;

use crate::engine::AioParams;
use crate::error::{Direction, Result};
use crate::file::{access_allows, fd_flags, FileTarget, OpenFile};
use crate::op::plan::{IoSpan, OpPlan};
use file::StripedFile;

/// Opens an op's file as `OpenFile::open` does; a stripe set's placeholder
/// comes with its member files opened and checked.
pub(crate) fn open(target: FileTarget<'_>, direction: Direction) -> Result<OpenFile> {
    let mut f = OpenFile::open(target, direction)?;
    if matches!(target, FileTarget::Fd(_)) && !fd_flags(f.any_fd()).is_ok_and(|fl| access_allows(fl, direction)) {
        // Member files are opened by the op: they must never grant what the
        // caller's descriptor does not. The transfer fails with EBADF.
        return Ok(f);
    }
    if let Some(mut striped) = file::attach(&f, direction)? {
        striped.settle_truncation(f.any_fd(), f.size()?)?;
        f.set_companion(striped);
    }
    Ok(f)
}

/// Whether the file at `path` is a stripe set's placeholder (carries the
/// mark); a file missing, or on a file system without user attributes, is
/// not.
pub(crate) fn is_placeholder(path: &std::path::Path) -> std::io::Result<bool> {
    match mark::read_path(path) {
        Ok(mark) => Ok(mark.is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the op's file is a stripe set's placeholder.
pub(crate) fn is_striped(f: &OpenFile) -> bool {
    f.companion::<StripedFile>().is_some()
}

/// Plans an op's slices (`op::plan::plan_op`), on the member files when
/// the file is striped.
pub(crate) fn plan_op(
    direction: Direction,
    f: &mut OpenFile,
    file_offset: u64,
    memory: IoSpan,
    parallelism: usize,
    params: AioParams,
) -> Result<Arc<OpPlan>> {
    if is_striped(f) {
        plan::plan_striped(direction, f, file_offset, memory, parallelism, params)
    } else {
        crate::op::plan::plan_op(direction, f, file_offset, memory, parallelism, params)
    }
}

/// A striped file's logical bytes `[offset, offset + len)`, read plainly
/// (DeepSpeed's `validate`); `None` for a plain file.
pub(crate) fn read_back(f: &OpenFile, offset: u64, len: usize) -> Option<std::io::Result<Vec<u8>>> {
    f.companion::<StripedFile>().map(|s| s.read_back(f.any_fd(), offset, len))
}
