//! One GDS transfer (`gds_op_desc_t::run` without torch): the file handle is
//! registered for the op and deregistered when it ends; the bytes are split
//! into up to `parallelism` pieces, each moved by one `cuFileRead` /
//! `cuFileWrite` on a thread of the piece pool (`piece_pool.rs`, kept across
//! transfers) with the device's primary context current; every return value
//! is checked and short counts are resubmitted.

use std::os::fd::RawFd;

use super::cufile_api::CuFileHandle;
use super::context::{Ctx, CurrentContext};
use super::error::GdsError;
use super::fd_handles::FdRegistrations;
use super::piece_pool;
use super::probe::Gpu;
use super::registry::RegionMap;
use super::status::{cufile_op_errno, cufile_op_error_name, CUFILEOP_BASE_ERR};
use crate::error::{errno_text, Direction, Error, Result, TransferError};
use crate::file::{access_allows, fd_flags};

/// Piece boundaries inside a transfer fall on multiples of this, so that a
/// transfer that starts aligned keeps every piece aligned for O_DIRECT.
pub const PIECE_ALIGN: usize = 4096;

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

/// One piece of a transfer: bytes `[offset, offset + len)` of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub offset: usize,
    pub len: usize,
}

/// Cuts `len` bytes into at most `parallelism` pieces, none smaller than
/// `block_size` unless the whole is (so small transfers stay on one thread),
/// with inner boundaries on [`PIECE_ALIGN`]. The pieces cover `[0, len)`
/// exactly, in order, and none is empty.
pub fn plan_pieces(len: usize, parallelism: usize, block_size: usize) -> Vec<Piece> {
    if len == 0 {
        return Vec::new();
    }
    let block_size = block_size.max(1);
    // Inner pieces are `chunk` bytes: the even share rounded DOWN to the
    // alignment, so the last piece (the remainder) is never the short one.
    // Fewer pieces when a share would fall under a block.
    let chunk_for = |n: usize| len / n / PIECE_ALIGN * PIECE_ALIGN;
    let mut n = parallelism.max(1).min(len / block_size).max(1);
    while n > 1 && chunk_for(n) < block_size.max(1) {
        n -= 1;
    }
    let chunk = if n == 1 { len } else { chunk_for(n) };
    let mut pieces = Vec::with_capacity(n);
    for i in 0..n {
        let offset = i * chunk;
        let l = if i + 1 == n { len - offset } else { chunk };
        pieces.push(Piece { offset, len: l });
    }
    pieces
}

/// Checks a transfer's arguments before anything touches cuFile.
pub fn validate(t: &GdsTransfer, parallelism: usize, block_size: usize) -> Result<()> {
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

/// What one cuFileRead/cuFileWrite return value means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallOutcome {
    /// This many bytes moved (at least 1).
    Moved(usize),
    /// Interrupted; call again.
    Retry,
    /// Failed: errno and what happened.
    Failed { errno: i32, detail: String },
}

/// Reads a cuFile I/O return: bytes moved; `-1` with `errno` for a POSIX
/// error; `-errno` for small negatives; `-CU_FILE_*` (beyond 5000) for a
/// cuFile error. 0 bytes is an end of file for a read, a stall for a write.
pub(crate) fn interpret(call: &str, direction: Direction, ret: isize, errno: i32, asked: usize) -> CallOutcome {
    if ret > 0 {
        let n = ret as usize;
        if n > asked {
            return CallOutcome::Failed {
                errno: libc::EIO,
                detail: format!("{call} reported {n} bytes moved, more than the {asked} asked"),
            };
        }
        return CallOutcome::Moved(n);
    }
    if ret == 0 {
        return match direction {
            Direction::Read => {
                CallOutcome::Failed { errno: libc::ENODATA, detail: format!("{call}: unexpected end of file") }
            }
            Direction::Write => {
                CallOutcome::Failed { errno: libc::EIO, detail: format!("{call}: the device accepted no bytes") }
            }
        };
    }
    let code = -(ret as i64);
    let posix = if code == 1 {
        if errno != 0 {
            errno
        } else {
            libc::EIO
        }
    } else if code < CUFILEOP_BASE_ERR {
        code as i32
    } else {
        0
    };
    if posix != 0 {
        if posix == libc::EINTR || posix == libc::EAGAIN {
            return CallOutcome::Retry;
        }
        return CallOutcome::Failed {
            errno: posix,
            detail: format!("{call} returned {ret}: POSIX errno {posix} ({})", errno_text(posix)),
        };
    }
    let (name, meaning) = cufile_op_error_name(code);
    CallOutcome::Failed {
        errno: cufile_op_errno(code),
        detail: format!("{call} returned {ret}: cuFile {name}: {meaning}"),
    }
}

/// A registered handle shared by the piece threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SharedHandle(CuFileHandle);
// SAFETY: cuFile handles may be used from several threads at once.
unsafe impl Send for SharedHandle {}
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
        FILE_HANDLES.release(self.fd, |h| self.gpu.cufile.handle_deregister(h.0));
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
    fn run(&self, piece: Piece) -> std::result::Result<(), TransferError> {
        let write = self.t.direction == Direction::Write;
        let call = if write { "cuFileWrite" } else { "cuFileRead" };
        let mut done = 0usize;
        let mut retries = 0u32;
        while done < piece.len {
            let want = piece.len - done;
            let file_offset = self.t.file_offset + (piece.offset + done) as u64;
            let buf_offset = self.buf_offset + (piece.offset + done) as u64;
            // SAFETY: the caller vouches that device_ptr..+len is live device
            // memory for the call; base + buf_offset stays inside it.
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
fn piece_error_of(t: &GdsTransfer, piece: &Piece, detail: String) -> TransferError {
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
    let piece_error = |piece: &Piece, detail: String| piece_error_of(t, piece, detail);
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

    fn check_cover(len: usize, p: usize, bs: usize) -> Vec<Piece> {
        let pieces = plan_pieces(len, p, bs);
        let mut at = 0;
        for (i, piece) in pieces.iter().enumerate() {
            assert_eq!(piece.offset, at, "contiguous");
            assert!(piece.len > 0, "no empty piece");
            if i + 1 < pieces.len() {
                assert_eq!((piece.offset + piece.len) % PIECE_ALIGN, 0, "inner boundary aligned");
            }
            at += piece.len;
        }
        assert_eq!(at, len, "covers exactly");
        assert!(pieces.len() <= p.max(1));
        pieces
    }

    #[test]
    fn pieces_cover_the_transfer_aligned_and_bounded() {
        assert!(plan_pieces(0, 4, 1 << 20).is_empty());
        assert_eq!(check_cover(1000, 8, 1 << 20).len(), 1, "small: one piece, one thread");
        assert_eq!(check_cover(4 << 20, 4, 1 << 20).len(), 4);
        assert_eq!(check_cover(4 << 20, 8, 1 << 20).len(), 4, "never below one block per piece");
        assert_eq!(check_cover(4 << 20, 1, 1 << 20).len(), 1);
        for (len, p, bs) in [(10_000_000, 3, 4096), (123_457, 5, 1), (4096 * 7 + 1, 7, 4096), (1 << 30, 16, 1 << 20)] {
            check_cover(len, p, bs);
        }
        assert_eq!(
            check_cover(5 << 20, 4, 1 << 20),
            vec![
                Piece { offset: 0, len: 1310720 },
                Piece { offset: 1310720, len: 1310720 },
                Piece { offset: 2621440, len: 1310720 },
                Piece { offset: 3932160, len: 1310720 },
            ]
        );
    }

    #[test]
    fn return_values_are_read_as_bytes_errno_or_cufile_errors() {
        use Direction::*;
        assert_eq!(interpret("cuFileRead", Read, 4096, 0, 8192), CallOutcome::Moved(4096));
        assert!(
            matches!(interpret("cuFileRead", Read, 9000, 0, 8192), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        match interpret("cuFileRead", Read, 0, 0, 8192) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::ENODATA);
                assert!(detail.contains("end of file"));
            }
            o => panic!("{o:?}"),
        }
        assert!(
            matches!(interpret("cuFileWrite", Write, 0, 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        match interpret("cuFileWrite", Write, -1, libc::ENOSPC, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::ENOSPC);
                assert!(detail.contains("POSIX") && detail.contains("errno 28"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
        assert!(
            matches!(interpret("cuFileRead", Read, -1, 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EIO)
        );
        assert_eq!(interpret("cuFileRead", Read, -1, libc::EINTR, 1), CallOutcome::Retry);
        assert_eq!(interpret("cuFileRead", Read, -(libc::EAGAIN as isize), 0, 1), CallOutcome::Retry);
        assert!(
            matches!(interpret("cuFileRead", Read, -(libc::EINVAL as isize), 0, 1), CallOutcome::Failed { errno, .. } if errno == libc::EINVAL)
        );
        match interpret("cuFileRead", Read, -5020, 0, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::EINVAL);
                assert!(detail.contains("CU_FILE_DIO_NOT_SET") && detail.contains("-5020"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
        match interpret("cuFileRead", Read, -5044, 0, 1) {
            CallOutcome::Failed { errno, detail } => {
                assert_eq!(errno, libc::EIO);
                assert!(detail.contains("CU_FILE_IO_ERROR"), "{detail}");
            }
            o => panic!("{o:?}"),
        }
    }

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
        // Zero bytes: nothing to check beyond the knobs.
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

#[cfg(test)]
#[path = "transfer_proptests.rs"]
mod proptests;
