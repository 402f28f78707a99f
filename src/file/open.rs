//! Opening an op's file the way DeepSpeed does, with a buffered twin for
//! what cannot go direct, and closing what the op opened.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Direction, Error, Result};

use super::stat::{
    fd_flags, fd_size, fd_unseekable_kind, is_file_or_block_device, is_regular_file, stat_for_io, unseekable_kind,
    DioAlignment, FileIdentity,
};

/// Where an op's bytes go.
#[derive(Clone, Copy, Debug)]
pub enum FileTarget<'a> {
    /// A file the op opens, and closes when it finishes.
    Path(&'a Path),
    /// A descriptor the caller owns; the op never closes it. At submit the
    /// op takes its own open file description of it (without O_APPEND), so
    /// the caller may close the fd before `wait()`.
    Fd(RawFd),
}

impl std::fmt::Display for FileTarget<'_> {
    /// The path, or "fd N": how every message names an op's target.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileTarget::Path(p) => write!(f, "{}", p.display()),
            FileTarget::Fd(fd) => write!(f, "fd {fd}"),
        }
    }
}

/// The descriptors of one op.
#[derive(Debug)]
pub struct OpenFile {
    path: Option<PathBuf>,
    /// Opened with O_DIRECT; `None` when the file system refused it.
    direct_fd: Option<RawFd>,
    /// Without O_DIRECT, for what cannot go direct. Opened on demand by
    /// [`OpenFile::buffered_fd`] (before any worker runs).
    buffered_fd: Option<RawFd>,
    /// The descriptor the op opened first: on the path, or its own open
    /// file description of a caller's descriptor (see
    /// [`OpenFile::from_caller_fd`]).
    origin_fd: RawFd,
    /// The caller's descriptor number, when the op was given one. Only used
    /// to name the target in messages: by the time the op runs, the caller
    /// may have closed it and the number may name another file.
    caller_fd: Option<RawFd>,
    /// Descriptors this op opened, closed on drop.
    owned: Vec<RawFd>,
    dio: Option<DioAlignment>,
    /// The size `statx` gave with the alignment, when the op opened the file.
    size_at_open: Option<u64>,
    /// Device and inode, from the same `statx` (direct descriptors only).
    identity: Option<FileIdentity>,
    /// Access mode (`O_RDONLY`/`O_WRONLY`/`O_RDWR`) for the buffered twin.
    /// For a caller's descriptor it is that descriptor's own mode: the twin
    /// must never grant what the caller's fd does not (a write through a
    /// read-only fd has to fail with EBADF, not succeed through the twin).
    twin_access: libc::c_int,
    /// What another layer keeps with the file (a stripe set's member
    /// files, see `Companion`).
    companion: Option<Box<dyn Companion>>,
}

/// State another layer keeps with an op's file and drops with it: the
/// member files of a stripe set's placeholder (the stripe module). The
/// file layer only closes them with its own descriptors.
pub(crate) trait Companion: std::fmt::Debug + Send {
    /// Closes the descriptors it owns, reporting the first failure's errno.
    fn close_owned(&mut self) -> std::result::Result<(), i32>;
    fn as_any(&self) -> &dyn std::any::Any;
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

fn cpath(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::InvalidArgument(format!("file name {:?} contains a NUL byte", path.display()))
    })
}

/// `open(2)`, retried when a signal interrupts it (EINTR), unless a Python
/// signal handler raised meanwhile: Ctrl-C then ends an open that waits
/// (for a lease holder to let go, a device, a network file system), as
/// [`Error::Interrupted`] (see [`open_error`]).
pub(crate) fn open_raw(path: &Path, flags: i32, mode: libc::mode_t) -> io::Result<RawFd> {
    let c = cpath(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    loop {
        // SAFETY: `c` is a valid C string.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
        if fd >= 0 {
            return above_stdio(fd);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
        if let Err(raised) = crate::rt::interpreter::check_signals() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, SignalRaised(raised.to_string())));
        }
    }
}

/// An open that a signal handler's exception ended (see [`open_raw`]).
#[derive(Debug)]
struct SignalRaised(String);

impl std::fmt::Display for SignalRaised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SignalRaised {}

/// The error of a failed open of `path`: [`Error::Interrupted`] when a
/// signal handler raised during it (the front end raises that exception),
/// else one naming the file, what was done and the errno.
fn open_error(path: &Path, action: &'static str, source: io::Error) -> Error {
    match source.get_ref().and_then(|e| e.downcast_ref::<SignalRaised>()) {
        Some(SignalRaised(text)) => Error::Interrupted(format!("opening {}: {text}", path.display())),
        None => Error::File { path: path.to_path_buf(), action, source },
    }
}

/// Why an op refuses a file of `kind` (see [`unseekable_kind`]): ESPIPE,
/// said in words.
fn not_seekable(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotSeekable,
        format!(
            "it is {kind}, which has no file offsets: deepnvme reads and writes regular files and block \
             devices only (ESPIPE, errno {})",
            libc::ESPIPE
        ),
    )
}

/// Opens `path` for an op's I/O, never waiting for the other end of a
/// fifo: with O_NONBLOCK a fifo opens at once (or, for a write with no
/// reader, fails with ENXIO), and is refused, as are sockets and character
/// devices (see [`unseekable_kind`]). A regular file or block device gets
/// O_NONBLOCK cleared. O_NONBLOCK also turns an open that would wait for a
/// lease holder into EWOULDBLOCK (the lease break is started): that open is
/// made again without it, and waits as a plain open would, Ctrl-C ending it
/// ([`open_raw`]).
fn open_for_io(path: &Path, flags: i32, mode: libc::mode_t) -> io::Result<RawFd> {
    let fd = match open_raw(path, flags | libc::O_NONBLOCK, mode) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => open_raw(path, flags, mode)?,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            // A fifo with no reader, or a socket: say which.
            let kind = std::fs::metadata(path).ok().and_then(|m| unseekable_kind(m.mode() as libc::mode_t));
            return Err(kind.map_or(e, not_seekable));
        }
        Err(e) => return Err(e),
    };
    let close = |e: io::Error| {
        // SAFETY: closes the descriptor this function opened and hands out no more.
        unsafe { libc::close(fd) };
        Err(e)
    };
    if let Some(kind) = fd_unseekable_kind(fd) {
        return close(not_seekable(kind));
    }
    match fd_flags(fd) {
        Ok(flags) if flags & libc::O_NONBLOCK != 0 => {
            // SAFETY: sets the status flags of our own descriptor.
            if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } != 0 {
                return close(io::Error::last_os_error());
            }
            Ok(fd)
        }
        Ok(_) => Ok(fd),
        Err(e) => close(e),
    }
}

/// Moves a descriptor this crate opened off the numbers 0, 1 and 2. A
/// process that closed stdout or stderr would otherwise get its data file
/// on those numbers, and every later line printed "to stdout" (DeepSpeed's
/// `Pass:` and `Elapsed time` lines, anyone's `print`) would land in it.
fn above_stdio(fd: RawFd) -> io::Result<RawFd> {
    if fd > libc::STDERR_FILENO {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor; `fd` is ours to close.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, libc::STDERR_FILENO + 1) };
    let e = io::Error::last_os_error();
    // SAFETY: closes a descriptor this code owns and no longer uses.
    unsafe { libc::close(fd) };
    if high < 0 {
        Err(e)
    } else {
        Ok(high)
    }
}

impl OpenFile {
    /// Opens `target` the way DeepSpeed does, for `direction`.
    pub fn open(target: FileTarget<'_>, direction: Direction) -> Result<OpenFile> {
        match target {
            FileTarget::Path(path) => Self::open_path(path, direction),
            FileTarget::Fd(fd) => Self::from_caller_fd(fd, direction),
        }
    }

    /// Keeps `companion` with the file until the op lets go of it.
    pub(crate) fn set_companion(&mut self, companion: Box<dyn Companion>) {
        self.companion = Some(companion);
    }

    /// The companion of type `T`, if the file has one.
    pub(crate) fn companion<T: 'static>(&self) -> Option<&T> {
        self.companion.as_ref()?.as_any().downcast_ref()
    }

    pub(crate) fn companion_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.companion.as_mut()?.as_any_mut().downcast_mut()
    }

    fn open_path(path: &Path, direction: Direction) -> Result<OpenFile> {
        let base = match direction {
            Direction::Read => libc::O_RDONLY,
            Direction::Write => libc::O_WRONLY | libc::O_CREAT,
        };
        let action = match direction {
            Direction::Read => "opening for read",
            Direction::Write => "opening for write",
        };
        let file_err = |source| open_error(path, action, source);
        match open_for_io(path, base | libc::O_DIRECT, 0o600) {
            Ok(fd) => {
                let (dio, size_at_open, identity) = stat_for_io(fd);
                // When the file system reports no direct I/O despite
                // accepting the flag, the buffered twin is opened on demand.
                Ok(OpenFile {
                    path: Some(path.to_path_buf()),
                    direct_fd: dio.map(|_| fd),
                    buffered_fd: None,
                    origin_fd: fd,
                    caller_fd: None,
                    owned: vec![fd],
                    dio,
                    size_at_open,
                    identity,
                    twin_access: base & libc::O_ACCMODE,
                    companion: None,
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // The file system has no O_DIRECT (tmpfs before 6.6, some
                // FUSE and network file systems): move the bytes buffered.
                let fd = open_for_io(path, base, 0o600).map_err(file_err)?;
                // A directory also answers EINVAL; the transfer will then
                // report EISDIR, so only a regular file earns the message.
                if is_regular_file(fd) {
                    crate::rt::log::info_once(
                        "no-odirect",
                        &format!("{} does not support O_DIRECT; using buffered I/O for such files", path.display()),
                    );
                }
                Ok(OpenFile {
                    path: Some(path.to_path_buf()),
                    direct_fd: None,
                    buffered_fd: Some(fd),
                    origin_fd: fd,
                    caller_fd: None,
                    owned: vec![fd],
                    dio: None,
                    size_at_open: None,
                    identity: None,
                    twin_access: base & libc::O_ACCMODE,
                    companion: None,
                })
            }
            Err(e) => Err(file_err(e)),
        }
    }

    /// Takes the op's own open file description of the caller's `fd`, so
    /// that the op keeps writing to (or reading from) the same file even if
    /// the caller closes `fd` and the number is reused before `wait()`.
    ///
    /// A regular file or block device is re-opened through
    /// `/proc/self/fd/N` with the caller's access mode, O_DIRECT and sync
    /// flags, but never O_APPEND: DeepSpeed's FastFileWriter passes an
    /// O_APPEND fd with explicit offsets, and a write on an O_APPEND
    /// description ignores its offset (parallel pieces would land in
    /// completion order). Anything else, or when /proc cannot be used, gets
    /// `fcntl(F_DUPFD_CLOEXEC)`, which shares the caller's description; a
    /// write through a shared O_APPEND description is then refused rather
    /// than misplaced. The caller's fd is never closed; the op's is closed
    /// when the op finishes.
    fn from_caller_fd(fd: RawFd, direction: Direction) -> Result<OpenFile> {
        let name = || PathBuf::from(format!("<fd {fd}>"));
        let flags = fd_flags(fd).map_err(|source| Error::File { path: name(), action: "inspecting caller descriptor", source })?;
        if let Some(kind) = fd_unseekable_kind(fd) {
            // pread/pwrite would fail with ESPIPE, or a write to a pipe
            // nobody reads would wait for ever: refused before any I/O.
            return Err(Error::File { path: name(), action: "checking caller descriptor", source: not_seekable(kind) });
        }
        let access = flags & libc::O_ACCMODE;
        let keep = libc::O_DIRECT | libc::O_DSYNC | libc::O_SYNC;
        let reopened = if is_file_or_block_device(fd) {
            open_raw(Path::new(&format!("/proc/self/fd/{fd}")), access | (flags & keep), 0).ok()
        } else {
            None
        };
        let own = match reopened {
            Some(own) => own,
            None => {
                if direction == Direction::Write && flags & libc::O_APPEND != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "fd {fd} is open with O_APPEND, which would put every write at the end of the file \
                         instead of at its offset, and it cannot be re-opened without O_APPEND \
                         (/proc/self/fd/{fd} is not usable); open it without O_APPEND"
                    )));
                }
                // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor that the op owns.
                let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, libc::STDERR_FILENO + 1) };
                if dup < 0 {
                    let source = io::Error::last_os_error();
                    return Err(Error::File { path: name(), action: "duplicating caller descriptor", source });
                }
                dup
            }
        };
        let (direct_fd, buffered_fd, dio, size_at_open, identity) = if flags & libc::O_DIRECT != 0 {
            match stat_for_io(own) {
                (Some(a), size, identity) => (Some(own), None, Some(a), size, identity),
                (None, size, identity) => (None, None, None, size, identity),
            }
        } else {
            (None, Some(own), None, None, None)
        };
        Ok(OpenFile {
            path: None,
            direct_fd,
            buffered_fd,
            origin_fd: own,
            caller_fd: Some(fd),
            owned: vec![own],
            dio,
            size_at_open,
            identity,
            twin_access: access,
            companion: None,
        })
    }

    /// Opens a buffered descriptor on the same file as the direct one,
    /// through /proc/self/fd so it is the same inode even if the path moved.
    fn open_buffered_twin(&mut self) -> Result<RawFd> {
        let source = self.origin_fd;
        let mode = self.twin_access;
        let proc_path = PathBuf::from(format!("/proc/self/fd/{source}"));
        let fd = match open_raw(&proc_path, mode, 0) {
            Ok(fd) => fd,
            Err(e) => match &self.path {
                Some(p) => open_for_io(p, mode, 0).map_err(|source| open_error(p, "re-opening without O_DIRECT", source))?,
                None => return Err(open_error(&proc_path, "re-opening without O_DIRECT", e)),
            },
        };
        self.owned.push(fd);
        self.buffered_fd = Some(fd);
        Ok(fd)
    }

    /// The O_DIRECT descriptor and its alignment, if the file has one.
    pub fn direct(&self) -> Option<(RawFd, DioAlignment)> {
        Some((self.direct_fd?, self.dio?))
    }

    /// The buffered descriptor, opening it now if needed.
    pub fn buffered_fd(&mut self) -> Result<RawFd> {
        match self.buffered_fd {
            Some(fd) => Ok(fd),
            None => self.open_buffered_twin(),
        }
    }

    /// Any descriptor of the file (for fstat).
    pub fn any_fd(&self) -> RawFd {
        self.origin_fd
    }

    /// The caller's descriptor number, when the op was given one (not a
    /// path): for messages only, never for I/O.
    pub fn caller_fd(&self) -> Option<RawFd> {
        self.caller_fd
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file's device and inode, when the op has a direct descriptor.
    pub fn identity(&self) -> Option<FileIdentity> {
        self.identity
    }

    /// Size of the file or block device: as learnt when the op opened it
    /// (moments ago, in the same `prepare`), else from `fstat` (or
    /// `BLKGETSIZE64`) now.
    pub fn size(&self) -> Result<u64> {
        if let Some(size) = self.size_at_open {
            return Ok(size);
        }
        self.size_now()
    }

    /// Size of the file or block device from `fstat` (or `BLKGETSIZE64`)
    /// now: after writes that grew it since it was opened.
    pub fn size_now(&self) -> Result<u64> {
        fd_size(self.any_fd()).map_err(|(action, source)| Error::File { path: self.display_path(), action, source })
    }

    /// Whether the target is a block device (so that messages say "device").
    pub fn is_block_device(&self) -> bool {
        match self.identity {
            Some(identity) => identity.block_device,
            None => {
                // SAFETY: fstat fills a zeroed struct.
                unsafe {
                    let mut st: libc::stat = std::mem::zeroed();
                    libc::fstat(self.any_fd(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFBLK
                }
            }
        }
    }

    pub fn display_path(&self) -> PathBuf {
        self.path.clone().unwrap_or_else(|| PathBuf::from(format!("<fd {}>", self.caller_fd.unwrap_or(self.origin_fd))))
    }
}

impl OpenFile {
    /// Closes the descriptors this op opened, reporting the first failure:
    /// some file systems (NFS, FUSE) report a deferred write error only at
    /// close(), and a write op must not succeed past it. The caller's fd is
    /// never closed (the op only ever holds its own description of it).
    pub fn close_owned(&mut self) -> std::result::Result<(), i32> {
        let mut first = None;
        for fd in self.owned.drain(..) {
            // SAFETY: we opened these and nobody else holds them.
            if unsafe { libc::close(fd) } != 0 {
                let e = io::Error::last_os_error();
                // EINTR: the descriptor is closed all the same on Linux.
                if e.raw_os_error() != Some(libc::EINTR) && first.is_none() {
                    first = Some(e);
                }
            }
        }
        self.direct_fd = None;
        self.buffered_fd = None;
        if let Some(companion) = &mut self.companion {
            if let Err(errno) = companion.close_owned() {
                first.get_or_insert(io::Error::from_raw_os_error(errno));
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        for &fd in &self.owned {
            // SAFETY: we opened these and nobody else holds them.
            unsafe { libc::close(fd) };
        }
    }
}

impl OpenFile {
    /// The file's identity for ordering ops on it: as the op's `statx`
    /// gave it, else from `fstat` (a file without O_DIRECT). A block device
    /// is named by the device it is.
    pub fn order_identity(&self) -> Option<FileIdentity> {
    if let Some(id) = self.identity() {
        return Some(id);
    }
    // SAFETY: fstat fills a zeroed struct for a descriptor the op holds.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(self.any_fd(), &mut st) == 0).then_some(st)
    }?;
    let block_device = st.st_mode & libc::S_IFMT == libc::S_IFBLK;
    let dev = if block_device { st.st_rdev } else { st.st_dev };
    Some(FileIdentity {
        dev_major: libc::major(dev),
        dev_minor: libc::minor(dev),
        ino: if block_device { 0 } else { st.st_ino },
        block_device,
    })
}
}
