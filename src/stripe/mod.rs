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
//! lock), `file.rs` (an op's members: opening, checks, growing), `plan.rs`
//! (an op's segments on the members, errors naming them), `admin.rs` (what
//! the CLI does: create, inspect, remove).

mod admin;
mod file;
mod layout;
mod manifest;
mod mark;
mod plan;

pub use admin::{
    check_xattrs, create, file_info, remove, set_info, CreateOptions, FileInfo, MemberInfo, RemoveReport, SetInfo,
    DEFAULT_UNIT,
};
pub(crate) use file::{attach, StripedFile};
pub use layout::Layout;
pub use manifest::{Manifest, Marker, MANIFEST_NAME, MARKER_NAME};
pub(crate) use plan::{plan_striped, StripePlan};
