//! Errors of the core. Every I/O failure names the file, the offset, the
//! length and the errno, so that a message that reaches a DeepSpeed user says
//! what went wrong and where, never just "failed".

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::gds::GdsError;

/// Which way bytes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

impl Direction {
    pub fn verb(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// What a failed transfer was doing: enough to find the bad bytes again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferError {
    pub direction: Direction,
    /// The file, where the op knows it (an op on a caller's fd has none).
    pub path: Option<PathBuf>,
    pub fd: i32,
    pub file_offset: u64,
    pub len: usize,
    /// A positive errno. `ENODATA` marks an unexpected end of file.
    pub errno: i32,
    /// Extra context, such as "end of file after 512 of 4096 bytes".
    pub detail: Option<String>,
}

impl TransferError {
    pub fn with_path(mut self, path: Option<PathBuf>) -> Self {
        if self.path.is_none() {
            self.path = path;
        }
        self
    }
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.path {
            Some(p) => format!("{}", p.display()),
            None => format!("fd {}", self.fd),
        };
        write!(
            f,
            "{} of {} bytes at offset {} of {} failed: {} (errno {})",
            self.direction.verb(),
            self.len,
            self.file_offset,
            target,
            errno_text(self.errno),
            self.errno
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

/// The error type of the whole core.
#[derive(Debug)]
pub enum Error {
    /// A transfer (or part of one) failed.
    Transfer(TransferError),
    /// Opening, stat-ing or re-opening a file failed.
    File { path: PathBuf, action: &'static str, source: io::Error },
    /// Locking memory failed; carries the size and the RLIMIT_MEMLOCK values.
    Lock { bytes: usize, errno: i32, limit_soft: u64, limit_hard: u64 },
    /// Allocating memory failed.
    Alloc { bytes: usize, source: io::Error },
    /// The request is not valid (sizes, offsets, knobs).
    InvalidArgument(String),
    /// An engine (io_uring, threads) could not be set up.
    Engine(String),
    /// A copy between a caller buffer and a bounce buffer failed (torch glue).
    Copy(String),
    /// GPUDirect Storage (cuFile/CUDA) failure or absence.
    Gds(GdsError),
    /// Several ops failed in one `wait()`; the first is shown, the rest counted.
    Many { first: Box<Error>, more: usize },
    /// A blocking call gave up waiting because a signal handler raised
    /// (Ctrl-C: KeyboardInterrupt). The ops stay pending in the handle, with
    /// their buffers held; the next `wait()` (or the handle's drop) finishes
    /// them. A Python front end has the exception set and raises it.
    Interrupted(String),
}

pub type Result<T> = std::result::Result<T, Error>;

#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
fn fmt_limit(v: u64) -> String {
    if v == libc::RLIM_INFINITY as u64 {
        "unlimited".to_string()
    } else {
        format!("{v} bytes")
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Transfer(t) => write!(f, "{t}"),
            Error::File { path, action, source } => match source.raw_os_error() {
                Some(errno) => write!(f, "{action} {} failed: {} (errno {errno})", path.display(), errno_text(errno)),
                None => write!(f, "{action} {} failed: {source}", path.display()),
            },
            Error::Lock { bytes, errno, limit_soft, limit_hard } => write!(
                f,
                "mlock of {bytes} bytes failed: {} (errno {errno}); RLIMIT_MEMLOCK is {} (hard {}). \
                 Raise it (ulimit -l, or memlock in /etc/security/limits.conf) or lock less memory",
                errno_text(*errno),
                fmt_limit(*limit_soft),
                fmt_limit(*limit_hard)
            ),
            Error::Alloc { bytes, source } => write!(f, "allocating {bytes} bytes failed: {source}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Engine(m) => write!(f, "I/O engine: {m}"),
            Error::Copy(m) => write!(f, "buffer copy failed: {m}"),
            Error::Gds(m) => write!(f, "GPUDirect Storage: {m}"),
            Error::Many { first, more } => write!(f, "{first} (and {more} more failed ops)"),
            Error::Interrupted(m) => write!(f, "interrupted: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::File { source, .. } | Error::Alloc { source, .. } => Some(source),
            Error::Many { first, .. } => Some(first.as_ref()),
            Error::Gds(g) => Some(g),
            _ => None,
        }
    }
}

impl From<GdsError> for Error {
    fn from(g: GdsError) -> Self {
        Error::Gds(g)
    }
}

impl From<TransferError> for Error {
    fn from(t: TransferError) -> Self {
        Error::Transfer(t)
    }
}

/// The text of an errno ("No such file or directory"), without the
/// " (os error N)" that `io::Error` appends: messages give the number once.
pub fn errno_text(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.rfind(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The text of a caught panic's payload (`panic!("...")` carries a `&str`
/// or a `String`).
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs `f`; a panic comes back as its text (see [`panic_text`]) instead
/// of unwinding further.
pub(crate) fn catch_unwind_text<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| panic_text(&*payload))
}

/// Runs `f`, turning a panic into `Error::Engine("internal error in
/// {what}: ...")`: nothing may unwind into C++ or Python.
#[cfg_attr(not(feature = "ffi"), allow(dead_code))]
pub(crate) fn catch_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind_text(f).unwrap_or_else(|text| Err(Error::Engine(format!("internal error in {what}: {text}"))))
}

/// The calling thread's errno.
pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}
