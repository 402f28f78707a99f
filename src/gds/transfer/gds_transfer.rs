//! One GDS transfer (`gds_op_desc_t::run` without torch): the file handle is
//! registered for the op and deregistered when it ends; the bytes are split
//! into up to `parallelism` pieces (`pieces.rs`), each moved by one
//! `cuFileRead` / `cuFileWrite` on a thread of the piece pool
//! (`piece_pool.rs`, kept across transfers) with the device's primary
//! context current; every return value is checked (`io_outcome.rs`) and
//! short counts are resubmitted. The arguments are checked first
//! ([`validate`]).

use std::os::fd::RawFd;

use crate::gds::shim::context::{Ctx, CurrentContext};
use crate::gds::shim::cufile_api::CuFileHandle;
use crate::gds::error::GdsError;
use crate::gds::transfer::fd_handles::FdRegistrations;
use crate::gds::transfer::io_outcome::{interpret, CallOutcome};
use crate::gds::transfer::piece_pool;
use crate::gds::transfer::pieces::{plan_pieces, DevicePiece};
use crate::gds::shim::probe::Gpu;
use crate::gds::driver::registry::RegionMap;
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::{access_allows, fd_flags};

/// How many times in a row a call may be interrupted (EINTR/EAGAIN) without
/// moving a byte before the transfer fails.
const MAX_RETRIES: u32 = 64;

/// One transfer between a file and device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdsTransfer {
    /// `Read`: file to device memory; `Write`: device memory to file.
    pub direction: Direction,
    /// The caller's descriptor (kept open by the caller for the whole call;
    /// never closed here). cuFile wants it opened with `O_DIRECT`.
    pub fd: RawFd,
    /// Where in the file the bytes start.
    pub file_offset: u64,
    /// The device address of the first byte (a CUDA device pointer).
    pub device_ptr: u64,
    /// How many bytes.
    pub len: usize,
    /// The CUDA device that owns `device_ptr` (torch's `tensor.get_device()`).
    pub device_ordinal: i32,
}

/// Checks a transfer's arguments before anything touches cuFile.
pub(crate) fn validate(t: &GdsTransfer, parallelism: usize, block_size: usize) -> Result<()> {
    let bad = |m: String| {
        Err(Error::InvalidArgument(format!(
            "GDS {} at offset {} of fd {}: {m}",
            t.direction.verb(),
            t.file_offset,
            t.fd
        )))
    };
    if parallelism == 0 {
        return bad("parallelism must be at least 1".into());
    }
    if block_size == 0 {
        return bad("block_size must be at least 1".into());
    }
    if t.fd < 0 {
        return bad(format!("invalid file descriptor {}", t.fd));
    }
    if t.device_ordinal < 0 {
        return bad(format!("invalid CUDA device {}", t.device_ordinal));
    }
    if t.len == 0 {
        return Ok(());
    }
    if t.device_ptr == 0 {
        return bad("null device pointer".into());
    }
    if t.device_ptr.checked_add(t.len as u64).is_none() {
        return bad(format!("{:#x} + {} bytes wraps the address space", t.device_ptr, t.len));
    }
    if t.file_offset.checked_add(t.len as u64).is_none_or(|end| end > i64::MAX as u64) {
        return bad(format!("file range {} + {} is beyond the largest file offset", t.file_offset, t.len));
    }
    let flags = match fd_flags(t.fd) {
        Ok(flags) => flags,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EBADF);
            return Err(gds_failure(t, errno, "the file descriptor is not usable".into()));
        }
    };
    if !access_allows(flags, t.direction) {
        let mode = if t.direction == Direction::Read { "reading" } else { "writing" };
        return Err(gds_failure(t, libc::EBADF, format!("the file descriptor is not open for {mode}")));
    }
    Ok(())
}

/// A registered handle shared by the piece threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SharedHandle(CuFileHandle);
// SAFETY: a CUfileHandle_t is an opaque token, not memory Rust reads; cuFile
// lets any thread use it (deregistration is serialised by FILE_HANDLES).
unsafe impl Send for SharedHandle {}
// SAFETY: shared use is concurrent cuFileRead/cuFileWrite on one handle,
// which cuFile allows.
unsafe impl Sync for SharedHandle {}

/// cuFile handles of the fds that transfers in flight use (see `fd_handles.rs`).
static FILE_HANDLES: FdRegistrations<SharedHandle> = FdRegistrations::new();

/// One transfer's use of a registered fd; dropping it ends the use.
struct FileHandle<'a> {
    gpu: &'a Gpu,
    fd: RawFd,
    handle: SharedHandle,
}

impl<'a> FileHandle<'a> {
    fn acquire(gpu: &'a Gpu, fd: RawFd) -> std::result::Result<FileHandle<'a>, GdsError> {
        let handle = FILE_HANDLES.acquire(fd, || gpu.cufile.handle_register(fd, &gpu.cuda).map(SharedHandle))?;
        Ok(FileHandle { gpu, fd, handle })
    }
}

impl Drop for FileHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: FILE_HANDLES calls this once, for the last user of the
        // handle that `acquire` registered, after every transfer using it
        // ended, and drops the entry with it, so it is deregistered once.
        FILE_HANDLES.release(self.fd, |h| unsafe { self.gpu.cufile.handle_deregister(h.0) });
    }
}

/// What every piece of one transfer needs; shared with the pool's threads.
#[derive(Clone, Copy)]
struct PieceJob {
    gpu: &'static Gpu,
    t: GdsTransfer,
    handle: SharedHandle,
    base: u64,
    buf_offset: u64,
    registered: bool,
}

impl PieceJob {
    fn run(&self, piece: DevicePiece) -> std::result::Result<(), TransferError> {
        let write = self.t.direction == Direction::Write;
        let call = if write { "cuFileWrite" } else { "cuFileRead" };
        let mut done = 0usize;
        let mut retries = 0u32;
        while done < piece.len {
            let want = piece.len - done;
            let file_offset = self.t.file_offset + (piece.offset + done) as u64;
            let buf_offset = self.buf_offset + (piece.offset + done) as u64;
            // SAFETY: the caller of run_transfer vouches that device_ptr..+len
            // is live device memory for the call, and base + buf_offset + want
            // stays inside it (the pieces tile [0, len)); the handle stays
            // registered while `run` holds its FileHandle.
            let (ret, errno) = unsafe {
                self.gpu.cufile.io(write, self.handle.0, self.base, want, file_offset as i64, buf_offset as i64)
            };
            let fail = |errno: i32, detail: String| TransferError {
                direction: self.t.direction,
                path: None,
                fd: self.t.fd,
                file_offset,
                len: want,
                errno,
                detail: Some(format!(
                    "{detail} (device {} buffer {:#x}, {} region base {:#x} + offset {buf_offset}; {done} of this \
                     piece's {} bytes done)",
                    self.t.device_ordinal,
                    self.t.device_ptr,
                    if self.registered { "registered" } else { "unregistered" },
                    self.base,
                    piece.len
                )),
            };
            match interpret(call, self.t.direction, ret, errno, want) {
                CallOutcome::Moved(n) => {
                    done += n;
                    retries = 0;
                }
                CallOutcome::Retry => {
                    retries += 1;
                    if retries > MAX_RETRIES {
                        return Err(fail(libc::EINTR, format!("{call} interrupted {MAX_RETRIES} times in a row")));
                    }
                }
                CallOutcome::Failed { errno, detail } => return Err(fail(errno, detail)),
            }
        }
        Ok(())
    }
}

/// The error for the whole transfer `t`.
fn gds_failure(t: &GdsTransfer, errno: i32, detail: String) -> Error {
    Error::Transfer(TransferError {
        direction: t.direction,
        path: None,
        fd: t.fd,
        file_offset: t.file_offset,
        len: t.len,
        errno,
        detail: Some(detail),
    })
}

/// A piece of `t` that failed for a reason of its own (no cuFile status).
fn piece_error_of(t: &GdsTransfer, piece: &DevicePiece, detail: String) -> TransferError {
    TransferError {
        direction: t.direction,
        path: None,
        fd: t.fd,
        file_offset: t.file_offset + piece.offset as u64,
        len: piece.len,
        errno: libc::EIO,
        detail: Some(detail),
    }
}

/// Runs `t` (already validated, with a driver open). `regions` is held
/// read-locked by the caller for the whole run.
pub(crate) fn run(
    gpu: &'static Gpu,
    ctx: Ctx,
    regions: &RegionMap,
    t: &GdsTransfer,
    parallelism: usize,
    block_size: usize,
) -> Result<()> {
    if t.len == 0 {
        return Ok(());
    }
    let (base, buf_offset, registered) = match regions.lookup(t.device_ptr, t.len) {
        Some(hit) => {
            if hit.device != t.device_ordinal {
                return Err(Error::InvalidArgument(format!(
                    "GDS {}: buffer {:#x} lies in a buffer registered on device {}, but the transfer names device {}",
                    t.direction.verb(),
                    t.device_ptr,
                    hit.device,
                    t.device_ordinal
                )));
            }
            (hit.base, hit.offset, true)
        }
        None => (t.device_ptr, 0, false),
    };
    let _current = CurrentContext::enter(&gpu.cuda, ctx)?;
    let handle = match FileHandle::acquire(gpu, t.fd) {
        Ok(h) => h,
        Err(e) => {
            let hint = if fd_flags(t.fd).is_ok_and(|flags| flags & libc::O_DIRECT == 0) {
                "; the file descriptor is not opened with O_DIRECT, which cuFile requires"
            } else {
                ""
            };
            return Err(gds_failure(t, libc::EIO, format!("{e}{hint}")));
        }
    };
    let job = PieceJob { gpu, t: *t, handle: handle.handle, base, buf_offset, registered };
    let pieces = plan_pieces(t.len, parallelism, block_size);
    let piece_error = |piece: &DevicePiece, detail: String| piece_error_of(t, piece, detail);
    let result = if pieces.len() == 1 {
        job.run(pieces[0])
    } else {
        // On the pool's threads, all at once (each piece is one blocking cuFile call).
        type PieceOutcome = std::result::Result<(), TransferError>;
        let tasks: Vec<piece_pool::PieceTask<PieceOutcome>> = pieces
            .iter()
            .map(|&piece| {
                let raw_ctx = ctx;
                Box::new(move || {
                    // A pool thread needs the device's context current (a new thread has none).
                    if let Err(e) = job.gpu.cuda.set_current(raw_ctx.raw()) {
                        return Err(piece_error_of(&job.t, &piece, e.to_string()));
                    }
                    job.run(piece)
                }) as piece_pool::PieceTask<PieceOutcome>
            })
            .collect();
        let outcomes: Vec<PieceOutcome> = piece_pool::run_all(tasks)
            .into_iter()
            .zip(&pieces)
            .map(|(r, piece)| r.unwrap_or_else(|panic| Err(piece_error(piece, GdsError::Internal(panic).to_string()))))
            .collect();
        let mut errors = outcomes.into_iter().filter_map(|r| r.err());
        match errors.next() {
            None => Ok(()),
            Some(first) => {
                let more = errors.count();
                if more == 0 {
                    Err(first)
                } else {
                    let mut first = first;
                    let d = first.detail.take().unwrap_or_default();
                    first.detail = Some(format!("{d}; {more} more of the {} pieces failed", pieces.len()));
                    Err(first)
                }
            }
        }
    };
    drop(handle);
    result.map_err(Error::Transfer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(fd: RawFd, direction: Direction) -> GdsTransfer {
        GdsTransfer { direction, fd, file_offset: 0, device_ptr: 0x7f00_0000_0000, len: 4096, device_ordinal: 0 }
    }

    #[test]
    fn arguments_are_checked_before_cufile_is_touched() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        assert!(validate(&transfer(fd, Direction::Read), 1, 1 << 20).is_ok());
        let msg = |r: Result<()>| r.unwrap_err().to_string();
        assert!(msg(validate(&transfer(fd, Direction::Read), 0, 1 << 20)).contains("parallelism"));
        assert!(msg(validate(&transfer(fd, Direction::Read), 1, 0)).contains("block_size"));
        assert!(msg(validate(&transfer(-1, Direction::Read), 1, 4096)).contains("invalid file descriptor"));
        assert!(
            msg(validate(&GdsTransfer { device_ptr: 0, ..transfer(fd, Direction::Read) }, 1, 4096)).contains("null")
        );
        assert!(msg(validate(&GdsTransfer { device_ordinal: -1, ..transfer(fd, Direction::Read) }, 1, 4096))
            .contains("device"));
        assert!(msg(validate(&GdsTransfer { file_offset: i64::MAX as u64, ..transfer(fd, Direction::Read) }, 1, 4096))
            .contains("largest file offset"));
        // Zero bytes: nothing to check beyond the settings.
        assert!(validate(&GdsTransfer { len: 0, device_ptr: 0, ..transfer(fd, Direction::Read) }, 1, 4096).is_ok());
        // A read-only fd cannot be written through.
        let e = validate(&transfer(fd, Direction::Write), 1, 4096).unwrap_err();
        match e {
            Error::Transfer(t) => {
                assert_eq!(t.errno, libc::EBADF);
                assert!(t.detail.unwrap().contains("not open for writing"));
            }
            other => panic!("{other}"),
        }
        // A descriptor that is not open is named with its errno.
        match validate(&transfer(999_999, Direction::Read), 1, 4096) {
            Err(Error::Transfer(t)) => assert_eq!(t.errno, libc::EBADF),
            other => panic!("{other:?}"),
        }
    }
}
