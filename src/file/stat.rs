//! What the kernel says of an open descriptor: its O_DIRECT alignment
//! (`statx` `STATX_DIOALIGN`, raised where a driver misreports it: see
//! `device_quirks.rs`), its identity (device and inode), its size
//! (`BLKGETSIZE64` for a block device, whose stat says 0), its flags.

use std::io;
use std::os::fd::RawFd;

use crate::error::Direction;

/// What O_DIRECT requires of a file: offsets and lengths must be multiples of
/// `offset`, buffer addresses multiples of `memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DioAlignment {
    /// File offsets and lengths are multiples of this.
    pub offset: usize,
    /// Buffer addresses are multiples of this.
    pub memory: usize,
}

/// Used when the kernel does not report `STATX_DIOALIGN`: 4 KiB satisfies
/// every common logical block size (512 and 4096).
pub const CONSERVATIVE_DIO_ALIGNMENT: DioAlignment = DioAlignment {
    offset: crate::knobs::CONSERVATIVE_DIO_ALIGNMENT,
    memory: crate::knobs::CONSERVATIVE_DIO_ALIGNMENT,
};

/// A descriptor's status flags (`fcntl(F_GETFL)`): access mode, O_DIRECT,
/// O_APPEND. Fails with EBADF for a descriptor that is not open.
pub(crate) fn fd_flags(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(flags)
    }
}

/// Whether a descriptor with status `flags` may move bytes in `direction`.
pub(crate) fn access_allows(flags: libc::c_int, direction: Direction) -> bool {
    let access = flags & libc::O_ACCMODE;
    match direction {
        Direction::Read => access == libc::O_RDONLY || access == libc::O_RDWR,
        Direction::Write => access == libc::O_WRONLY || access == libc::O_RDWR,
    }
}

/// The O_DIRECT alignment of an open file; `None` when the file system says
/// it has no direct I/O.
pub fn dio_alignment(fd: RawFd) -> Option<DioAlignment> {
    stat_for_io(fd).0
}

/// Which file an open descriptor names (device and inode; for a block
/// device, the device itself): two ops on one file through different
/// descriptors or paths have the same identity. (Ops on two block devices
/// are ordered as if one: see `Footprint::conflicts_with`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev_major: u32,
    pub dev_minor: u32,
    pub ino: u64,
    /// A block device (then `dev_*` name the device itself, and `ino` is 0).
    pub block_device: bool,
}

/// One `statx` for what an op needs of a file it just opened: the O_DIRECT
/// alignment (as [`dio_alignment`]), the size (`None` when statx gave
/// none), so that a read's extent check needs no second system call, and
/// the file's identity.
pub(crate) fn stat_for_io(fd: RawFd) -> (Option<DioAlignment>, Option<u64>, Option<FileIdentity>) {
    // SAFETY: statx fills a zeroed struct; the empty path with AT_EMPTY_PATH
    // refers to `fd` itself.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let empty = b"\0";
        let rc = statx(
            fd,
            empty.as_ptr() as *const libc::c_char,
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN | libc::STATX_SIZE | libc::STATX_INO | libc::STATX_TYPE,
            &mut stx,
        );
        // statx always fills the device numbers. A block device is named by
        // the device it is (two device nodes of one disk are one target).
        let is_block =
            rc == 0 && stx.stx_mask & libc::STATX_TYPE != 0 && u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFBLK;
        // statx gives a block device 0 bytes; on an ioctl failure the size
        // is left unknown, and `OpenFile::size` asks again and reports it.
        let size = if is_block {
            block_device_size(fd).ok()
        } else {
            (rc == 0 && stx.stx_mask & libc::STATX_SIZE != 0).then_some(stx.stx_size)
        };
        let identity = match (rc, is_block) {
            (0, true) => Some(FileIdentity {
                dev_major: stx.stx_rdev_major,
                dev_minor: stx.stx_rdev_minor,
                ino: 0,
                block_device: true,
            }),
            (0, false) if stx.stx_mask & libc::STATX_INO != 0 => Some(FileIdentity {
                dev_major: stx.stx_dev_major,
                dev_minor: stx.stx_dev_minor,
                ino: stx.stx_ino,
                block_device: false,
            }),
            _ => None,
        };
        if rc != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
            return (Some(CONSERVATIVE_DIO_ALIGNMENT), size, identity);
        }
        if stx.stx_dio_offset_align == 0 {
            return (None, size, identity);
        }
        let device_major = if is_block { stx.stx_rdev_major } else { stx.stx_dev_major };
        let alignment = DioAlignment {
            offset: stx.stx_dio_offset_align as usize,
            memory: super::device_quirks::memory_alignment(device_major, (stx.stx_dio_mem_align as usize).max(1)),
        };
        (Some(alignment), size, identity)
    }
}

/// statx(2) as a raw system call: glibc's wrapper is from 2.28, and the
/// wheel links against glibc 2.17's symbols only (manylinux2014). Returns 0
/// or -1 with errno set, as the wrapper does (ENOSYS before Linux 4.11).
///
/// # Safety
/// `path` is NUL-terminated and `buf` is valid for writing a `libc::statx`.
pub(crate) unsafe fn statx(
    dirfd: libc::c_int,
    path: *const libc::c_char,
    flags: libc::c_int,
    mask: libc::c_uint,
    buf: *mut libc::statx,
) -> libc::c_int {
    // SAFETY: the caller's contract; the kernel writes at most one statx.
    unsafe { libc::syscall(libc::SYS_statx, dirfd, path, flags, mask, buf) as libc::c_int }
}

pub(super) fn is_file_or_block_device(fd: RawFd) -> bool {
    // SAFETY: fstat fills a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && matches!(st.st_mode & libc::S_IFMT, libc::S_IFREG | libc::S_IFBLK)
    }
}

/// What a file of `mode` is, when it is something an op cannot move bytes
/// at offsets of (a fifo, a socket, a character device): its name in
/// errors. `None` for a regular file, a block device or a directory (which
/// fails later, with EISDIR).
pub(super) fn unseekable_kind(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => Some("a fifo (pipe)"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFCHR => Some("a character device"),
        _ => None,
    }
}

/// [`unseekable_kind`] of an open descriptor (`None` when fstat fails:
/// the op then reports its own error).
pub(super) fn fd_unseekable_kind(fd: RawFd) -> Option<&'static str> {
    // SAFETY: fstat fills a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_mode).and_then(unseekable_kind)
    }
}

pub(super) fn is_regular_file(fd: RawFd) -> bool {
    // SAFETY: fstat fills a zeroed struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFREG
    }
}

/// `BLKGETSIZE64` from <linux/fs.h>, `_IOR(0x12, 114, size_t)`: a block
/// device's size in bytes. This is the asm-generic encoding with an 8-byte
/// size_t (x86_64, aarch64); powerpc, mips and sparc number it differently.
const BLKGETSIZE64: u32 = 0x8008_1272;

/// Size in bytes of the block device open on `fd`.
fn block_device_size(fd: RawFd) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer. The request
    // parameter is c_ulong on glibc and c_int on musl, hence `as _`.
    let rc = unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(size)
    }
}

/// Size of an open file, or of a block device (whose `st_size` is 0), and
/// the call that failed when it cannot be learnt.
pub(super) fn fd_size(fd: RawFd) -> std::result::Result<u64, (&'static str, io::Error)> {
    // SAFETY: fstat fills a zeroed struct.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(("fstat of", io::Error::last_os_error()));
        }
        st
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
        return block_device_size(fd).map_err(|e| ("BLKGETSIZE64 ioctl on", e));
    }
    Ok(st.st_size as u64)
}
