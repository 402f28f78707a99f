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
    /// `read` or `write`, for messages.
    pub fn verb(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
        }
    }
}

/// What a failed transfer was doing: enough to find the bad bytes again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferError {
    /// Which way the bytes were going.
    pub direction: Direction,
    /// The file, where the op knows it (an op on a caller's fd has none).
    pub path: Option<PathBuf>,
    /// The descriptor the transfer used.
    pub fd: i32,
    /// Where in the file the failed bytes start.
    pub file_offset: u64,
    /// How many bytes the failed transfer asked for.
    pub len: usize,
    /// A positive errno. `ENODATA` marks an unexpected end of file.
    pub errno: i32,
    /// Extra context, such as "end of file after 512 of 4096 bytes".
    pub detail: Option<String>,
}

impl TransferError {
    /// The same error naming `path`, unless it already names one.
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
#[non_exhaustive]
pub enum Error {
    /// A transfer (or part of one) failed.
    Transfer(TransferError),
    /// Opening, stat-ing or re-opening a file failed.
    File {
        /// The file.
        path: PathBuf,
        /// What was being done ("open", "stat", ...).
        action: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// Locking memory failed; carries the size and the RLIMIT_MEMLOCK values.
    Lock {
        /// How many bytes were to be locked.
        bytes: usize,
        /// `mlock`'s errno.
        errno: i32,
        /// RLIMIT_MEMLOCK's soft limit, in bytes.
        limit_soft: u64,
        /// RLIMIT_MEMLOCK's hard limit, in bytes.
        limit_hard: u64,
    },
    /// Allocating memory failed.
    Alloc {
        /// How many bytes were asked for.
        bytes: usize,
        /// The system's error.
        source: io::Error,
    },
    /// The request is not valid (sizes, offsets, knobs).
    InvalidArgument(String),
    /// An async op on memory that must bounce would take the process's
    /// bounce memory past its budget (`DEEPNVME_BOUNCE_MAX_MB`).
    BounceBudget {
        /// The op ("pwrite of 4096 bytes at offset 0 of /x").
        op: String,
        /// Bytes its bounce buffer needs.
        needed: usize,
        /// Bytes held by ops not yet finished.
        in_use: usize,
        /// The budget, in bytes.
        budget: usize,
    },
    /// An engine (io_uring, threads) could not be set up.
    Engine(String),
    /// A copy between a caller buffer and a bounce buffer failed (torch glue).
    Copy(String),
    /// A tensor's storage was replaced (`set_`, `resize_`, `.data =`) or
    /// freed while its op was in flight: nothing was copied into or out of it.
    StorageReplaced {
        /// The op.
        op: String,
        /// The address and length the op was given.
        given: (usize, usize),
        /// The address and length the tensor has now.
        now: (usize, usize),
    },
    /// A panic caught at a front end's boundary (a bug): nothing unwinds
    /// into C++ or Python.
    Internal {
        /// The call that panicked.
        call: String,
        /// The panic's message.
        panic: String,
    },
    /// GPUDirect Storage (cuFile/CUDA) failure or absence.
    Gds(GdsError),
    /// Several ops failed in one `wait()`; the first is shown, the rest counted.
    Many {
        /// The first failure.
        first: Box<Error>,
        /// How many more ops failed.
        more: usize,
    },
    /// A blocking call gave up waiting because a signal handler raised
    /// (Ctrl-C: KeyboardInterrupt). The ops stay pending in the handle, with
    /// their buffers held; the next `wait()` (or the handle's drop) finishes
    /// them. A Python front end has the exception set and raises it.
    Interrupted(String),
}

/// The core's result: [`Error`] names file, offset and errno.
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
            Error::BounceBudget { op, needed, in_use, budget } => write!(
                f,
                "invalid argument: {op}: bouncing it needs {needed} bytes of host memory, and {in_use} of the {budget} \
                 bytes that bounce buffers may use are in use by ops not yet finished; wait() for earlier ops, use \
                 locked memory (new_cpu_locked_tensor, pin_memory()), or raise {} (MiB)",
                crate::knobs::BOUNCE_MAX_MB_ENV
            ),
            Error::Engine(m) => write!(f, "I/O engine: {m}"),
            Error::Copy(m) => write!(f, "buffer copy failed: {m}"),
            Error::StorageReplaced { op, given, now } => write!(
                f,
                "buffer copy failed: {op}: the tensor had its storage replaced while the op was in flight (set_, \
                 resize_ or .data =): it was {} bytes at {:#x}, it is now {} bytes at {:#x}; no byte was copied to \
                 or from its new memory",
                given.1, given.0, now.1, now.0
            ),
            Error::Internal { call, panic } => write!(f, "I/O engine: internal error in {call}: {panic}"),
            Error::Gds(m) => write!(f, "GPUDirect Storage: {m}"),
            Error::Many { first, more } => write!(f, "{first} (and {more} more failed ops)"),
            Error::Interrupted(m) => write!(f, "interrupted: {m}"),
        }
    }
}

impl Error {
    /// A copy's error with the op it was for ("pwrite of N bytes at offset
    /// O of PATH") in front, and without torch's C++ backtrace; other errors
    /// as they are.
    pub(crate) fn in_copy_of(self, what: &dyn Fn() -> String) -> Error {
        match self {
            Error::Copy(m) => Error::Copy(format!("{}: {}", what(), without_backtrace(&m))),
            e => e,
        }
    }
}

/// A c10::Error's text up to its "Exception raised from ..." backtrace.
fn without_backtrace(text: &str) -> &str {
    text.find("\nException raised from").map_or(text, |i| &text[..i]).trim_end()
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

/// Runs `f`, turning a panic into [`Error::Internal`]: nothing may unwind
/// into C++ or Python.
#[cfg_attr(not(feature = "ffi"), allow(dead_code))]
pub(crate) fn catch_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind_text(f).unwrap_or_else(|panic| Err(Error::Internal { call: what.to_string(), panic }))
}

/// The calling thread's errno.
pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// The typed variants print what their strings printed before, word for
    /// word: users and the Python suite match on these messages.
    #[test]
    fn typed_variants_keep_their_messages() {
        let e = Error::StorageReplaced { op: "read of 8 bytes".into(), given: (0x1000, 8), now: (0x2000, 16) };
        assert_eq!(
            e.to_string(),
            "buffer copy failed: read of 8 bytes: the tensor had its storage replaced while the op was in flight \
             (set_, resize_ or .data =): it was 8 bytes at 0x1000, it is now 16 bytes at 0x2000; no byte was \
             copied to or from its new memory"
        );
        let e = Error::BounceBudget { op: "write x".into(), needed: 4096, in_use: 8192, budget: 10000 };
        assert_eq!(
            e.to_string(),
            "invalid argument: write x: bouncing it needs 4096 bytes of host memory, and 8192 of the 10000 bytes \
             that bounce buffers may use are in use by ops not yet finished; wait() for earlier ops, use locked \
             memory (new_cpu_locked_tensor, pin_memory()), or raise DEEPNVME_BOUNCE_MAX_MB (MiB)"
        );
        let e = super::catch_panic("pread", || -> super::Result<()> { panic!("boom") }).unwrap_err();
        assert!(matches!(&e, Error::Internal { call, panic } if call == "pread" && panic == "boom"), "{e:?}");
        assert_eq!(e.to_string(), "I/O engine: internal error in pread: boom");
    }

    #[test]
    fn a_copy_error_gets_its_op_and_loses_the_backtrace() {
        let torch = "copy_() refused.\nException raised from f at x.cpp:1 (most recent call first):\nframe #0: g";
        let e = Error::Copy(torch.into()).in_copy_of(&|| "read of 8 bytes at offset 0 of /f".into());
        assert_eq!(e.to_string(), "buffer copy failed: read of 8 bytes at offset 0 of /f: copy_() refused.");
        let e = Error::Engine("x".into()).in_copy_of(&|| "op".into());
        assert_eq!(e.to_string(), "I/O engine: x", "other errors are left alone");
    }
}
