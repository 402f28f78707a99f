//! Which file systems io_uring can only punt reads and writes for (to its
//! kernel worker threads), told by an open descriptor's `statfs` type.

use std::os::fd::RawFd;

use crate::file::OpenFile;

/// A file system on which io_uring can only hand reads and writes to
/// kernel worker threads (measured: `iou-wrk` threads appear for them, and
/// none for ext4, direct or from the page cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PuntingFs {
    /// tmpfs (shmem).
    Tmpfs,
    /// ramfs.
    Ramfs,
}

impl PuntingFs {
    /// The file system's name (`tmpfs`, `ramfs`).
    pub fn name(self) -> &'static str {
        match self {
            PuntingFs::Tmpfs => "tmpfs",
            PuntingFs::Ramfs => "ramfs",
        }
    }
}

const TMPFS_MAGIC: u64 = 0x0102_1994;
const RAMFS_MAGIC: u64 = 0x8584_58f6;

/// The file system of the file open on `fd`, when it is one io_uring
/// punts for. `None` also for a block device (its bytes go to the device,
/// whatever holds the node: devtmpfs says tmpfs) and when the calls fail
/// (the op then keeps its engine).
pub fn punting_fs(fd: RawFd) -> Option<PuntingFs> {
    // SAFETY: fstat fills a zeroed struct.
    let block = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT == libc::S_IFBLK
    };
    if block {
        return None;
    }
    statfs_punting(fd)
}

/// [`punting_fs`] for an op's file, without a system call where its
/// `statx` already answers: tmpfs and ramfs are on anonymous devices
/// (major 0), so a file on a real block device is neither.
pub(crate) fn punting_fs_of(file: &OpenFile) -> Option<PuntingFs> {
    match file.identity() {
        Some(id) if id.block_device || id.dev_major != 0 => None,
        Some(_) => statfs_punting(file.any_fd()),
        None if file.is_block_device() => None,
        None => statfs_punting(file.any_fd()),
    }
}

fn statfs_punting(fd: RawFd) -> Option<PuntingFs> {
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
