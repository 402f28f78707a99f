//! Opening the files an op moves bytes to or from, and learning what
//! O_DIRECT needs from them.
//!
//! DeepSpeed opens with `O_DIRECT` (read: `O_RDONLY`; write:
//! `O_WRONLY|O_CREAT`, mode 0600, no `O_TRUNC`, so a write at an offset keeps
//! the rest of the file). O_DIRECT only accepts offsets, lengths and buffer
//! addresses aligned to what the file system reports (`statx`
//! `STATX_DIOALIGN`); the C++ ignored that and silently wrote nothing. Here an
//! op also gets a second, buffered descriptor for the parts that cannot go
//! direct: unaligned heads and tails, misaligned buffers, and file systems
//! without O_DIRECT at all. A block device's size comes from the
//! `BLKGETSIZE64` ioctl, since stat reports 0 bytes for one.
//!
//! An op's file may carry another layer's state (`Companion`): a stripe
//! set's placeholder carries its member files.
//!
//! Files: `open.rs` (opening, the buffered twin, closing), `stat.rs` (what
//! the kernel reports of a descriptor), `device_quirks.rs` (drivers whose
//! reported memory alignment is wrong).

mod device_quirks;
mod open;
mod stat;

pub(crate) use open::{open_raw, Companion};
pub use open::{FileTarget, OpenFile};
pub use stat::{dio_alignment, DioAlignment, FileIdentity};
pub(crate) use stat::{access_allows, fd_flags, stat_for_io};
