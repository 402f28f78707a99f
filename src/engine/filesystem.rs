//! Which file systems io_uring can only punt reads and writes for (to its
//! kernel worker threads), told by an open descriptor's `statfs` type.

use std::os::fd::RawFd;

/// A file system on which io_uring can only hand reads and writes to
/// kernel worker threads (measured: `iou-wrk` threads appear for them, and
/// none for ext4, direct or from the page cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PuntingFs {
    Tmpfs,
    Ramfs,
}

impl PuntingFs {
    pub fn name(self) -> &'static str {
        match self {
            PuntingFs::Tmpfs => "tmpfs",
            PuntingFs::Ramfs => "ramfs",
        }
    }
}

const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// The file system of an open descriptor, when it is one io_uring punts
/// for. `None` also when `fstatfs` fails (the op then keeps its engine).
pub fn punting_fs(fd: RawFd) -> Option<PuntingFs> {
    // SAFETY: fstatfs fills a zeroed struct.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(fd, &mut st) != 0 {
            return None;
        }
        // f_type is a long on some targets and unsigned on others; magics are 32 bits.
        (st.f_type as u64) & 0xffff_ffff
    };
    match magic {
        TMPFS_MAGIC => Some(PuntingFs::Tmpfs),
        RAMFS_MAGIC => Some(PuntingFs::Ramfs),
        _ => None,
    }
}
