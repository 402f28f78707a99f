//! One transfer (`cpu_op_desc_t` without torch): which memory the I/O uses,
//! how the bytes are cut into per-worker slices, and how the op finishes.
//!
//! * **Bounce decision.** I/O goes straight to the caller's memory only when
//!   it is host memory, contiguous, and page-locked (declared pinned by the
//!   caller, e.g. torch-pinned, or managed by the [`PinnedMemoryManager`]).
//!   Anything else moves through a page-aligned bounce buffer: a write copies
//!   into it when the op is prepared, a read copies out of it when the op
//!   finishes. The copies go through [`Staging`], which the torch shims
//!   implement for CPU, CUDA and strided tensors (the C++ read a
//!   non-contiguous pinned destination into a temporary it never copied back).
//! * **Slices.** The op is cut into `intra_op_parallelism` slices whose inner
//!   boundaries fall on page boundaries of the file, so no two workers ever
//!   touch the same page or file-system block.
//! * **O_DIRECT edges.** Inside a slice, the whole pages (aligned for O_DIRECT) go
//!   through the direct descriptor; unaligned heads and tails (and whole
//!   slices whose memory cannot be aligned) go through a buffered descriptor,
//!   before the direct part, so the page cache never holds stale copies of
//!   the direct bytes. A 1000-byte write makes a 1000-byte file.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::{Engine, Knobs, Segment};
use crate::error::{Direction, Error, Result, TransferError};
use crate::handle::{OpCompletion, OpWork};
use crate::file::{DioAlignment, FileTarget, OpenFile};
use crate::pinned::{page_size, LockMode, PageAlignedBuffer, PinnedMemoryManager};

/// The caller's buffer, as the torch glue (or a Rust caller) describes it.
#[derive(Clone, Copy, Debug)]
pub struct BufferDesc {
    pub ptr: *mut u8,
    pub len: usize,
    /// Host (CPU) memory. Device memory always bounces.
    pub is_host: bool,
    /// One contiguous byte range.
    pub contiguous: bool,
    /// The caller vouches that the memory is page-locked (torch-pinned).
    pub pinned: bool,
}

// SAFETY: a description of memory that the op's owner keeps alive.
unsafe impl Send for BufferDesc {}
unsafe impl Sync for BufferDesc {}

impl BufferDesc {
    /// Plain contiguous host memory that is not declared pinned.
    pub fn host(ptr: *mut u8, len: usize) -> Self {
        BufferDesc { ptr, len, is_host: true, contiguous: true, pinned: false }
    }
}

/// Copies between the caller's buffer and a bounce buffer.
pub trait Staging: Send {
    /// Caller buffer -> `bounce` (before a write).
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()>;
    /// `bounce` -> caller buffer (after a read).
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()>;
}

/// Staging for contiguous host memory: plain memcpy.
pub struct MemcpyStaging {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the op's owner keeps the memory alive until the op finishes.
unsafe impl Send for MemcpyStaging {}

impl MemcpyStaging {
    /// # Safety
    /// `ptr..ptr+len` must stay valid until the op that uses this finishes.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        MemcpyStaging { ptr, len }
    }
}

impl Staging for MemcpyStaging {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        // SAFETY: see `new`; the bounce buffer is at least `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, bounce.as_mut_ptr(), self.len.min(bounce.len())) };
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bounce.as_ptr(), self.ptr, self.len.min(bounce.len())) };
        Ok(())
    }
}

/// A request to move one buffer.
pub struct OpRequest<'a> {
    pub direction: Direction,
    pub target: FileTarget<'a>,
    pub file_offset: i64,
    pub buffer: BufferDesc,
    /// How to copy when the op bounces. `None` is fine for contiguous host
    /// memory (memcpy is used); device or strided memory must supply one.
    pub staging: Option<Box<dyn Staging>>,
    /// Re-read the file afterwards and compare (DeepSpeed's `validate`).
    pub validate: bool,
}

/// The segments one worker moves: buffered ones first, then direct ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlicePlan {
    pub buffered: Vec<Segment>,
    pub direct: Vec<Segment>,
}

impl SlicePlan {
    pub fn bytes(&self) -> usize {
        self.buffered.iter().chain(&self.direct).map(|s| s.len).sum()
    }
}

/// The immutable part of an op that workers read while it runs.
#[derive(Debug)]
pub struct OpPlan {
    pub direction: Direction,
    pub path: Option<PathBuf>,
    /// The caller's descriptor when the op was given one instead of a path.
    pub caller_fd: Option<RawFd>,
    pub slices: Vec<SlicePlan>,
    pub knobs: Knobs,
    /// `knobs` with the block size rounded to the O_DIRECT alignment.
    pub direct_knobs: Knobs,
}

impl OpPlan {
    /// Names the op's target in a slice error: its path, or the caller's
    /// descriptor. A failure on the buffered twin of a caller's fd must name
    /// the fd the caller knows, not the short-lived twin the op opened.
    pub fn name_target(&self, e: TransferError) -> TransferError {
        let mut e = e.with_path(self.path.clone());
        if e.path.is_none() {
            if let Some(fd) = self.caller_fd {
                e.fd = fd;
            }
        }
        e
    }

    /// Moves slice `index` with `engine`.
    pub fn run_slice(&self, index: usize, engine: &mut dyn Engine) -> std::result::Result<(), TransferError> {
        let Some(slice) = self.slices.get(index) else { return Ok(()) };
        let attach = |e: TransferError| self.name_target(e);
        if !slice.buffered.is_empty() {
            engine.run(self.direction, &slice.buffered, &self.knobs).map_err(attach)?;
        }
        if !slice.direct.is_empty() {
            engine.run(self.direction, &slice.direct, &self.direct_knobs).map_err(attach)?;
        }
        Ok(())
    }
}

impl OpWork for OpPlan {
    fn slice_count(&self) -> usize {
        self.slices.len()
    }
    fn run_slice(&self, index: usize, engine: &mut dyn Engine) -> Result<()> {
        OpPlan::run_slice(self, index, engine).map_err(Error::from)
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        let slice = self.slices.get(index);
        Error::Transfer(self.name_target(TransferError {
            direction: self.direction,
            path: None,
            fd: -1,
            file_offset: slice.and_then(|s| s.buffered.iter().chain(&s.direct).map(|g| g.file_offset).min()).unwrap_or(0),
            len: slice.map(|s| s.bytes()).unwrap_or(0),
            errno: libc::EIO,
            detail: Some(detail),
        }))
    }
}

/// Where the I/O memory of an op is.
enum IoMemory {
    /// The caller's buffer itself. `_keep_alive` is the caller's handle on it
    /// (the torch glue's reference to the tensor): it must live until the op
    /// finishes, or torch could free and reuse the memory under the I/O.
    Direct { _keep_alive: Option<Box<dyn Staging>> },
    /// A bounce buffer and the way back to the caller's buffer. The I/O
    /// bytes start `skew` bytes in, so that memory and file offsets share
    /// their alignment and O_DIRECT can still be used for an unaligned offset.
    Bounce { buffer: PageAlignedBuffer, skew: usize, staging: Box<dyn Staging> },
}

/// One prepared transfer. Owns its descriptors and bounce buffer; dropping
/// it closes the first and frees the second.
pub struct CpuOp {
    plan: Arc<OpPlan>,
    file: OpenFile,
    file_offset: u64,
    len: usize,
    io_ptr: *mut u8,
    memory: IoMemory,
    validate: bool,
}

// SAFETY: `io_ptr` points at memory this op keeps alive (its bounce buffer,
// or the caller's buffer that the caller keeps alive until `finish`).
unsafe impl Send for CpuOp {}

/// Whether a buffer can be used for I/O without a bounce copy.
pub fn is_direct_capable(buffer: &BufferDesc, manager: &PinnedMemoryManager) -> bool {
    buffer.is_host && buffer.contiguous && (buffer.pinned || manager.is_managed(buffer.ptr, buffer.len))
}

fn round_down(v: u64, a: u64) -> u64 {
    v / a * a
}
fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Cuts `[file_offset, file_offset + len)` (memory at `addr`) into
/// `parallelism` slices with page-aligned inner boundaries, and each slice
/// into buffered and direct segments.
pub fn plan_slices(
    file_offset: u64,
    addr: *mut u8,
    len: usize,
    parallelism: usize,
    direct: Option<(RawFd, DioAlignment)>,
    buffered_fd: Option<RawFd>,
) -> Vec<SlicePlan> {
    let parallelism = parallelism.max(1);
    let grain = match direct {
        Some((_, a)) => (page_size().max(a.offset)) as u64,
        None => page_size() as u64,
    };
    let end = file_offset + len as u64;
    let mut bounds = Vec::with_capacity(parallelism + 1);
    bounds.push(file_offset);
    for t in 1..parallelism {
        let raw = file_offset + (len as u128 * t as u128 / parallelism as u128) as u64;
        let snapped = round_down(raw, grain).clamp(*bounds.last().unwrap(), end);
        bounds.push(snapped);
    }
    bounds.push(end);

    let mut slices = Vec::with_capacity(parallelism);
    for w in bounds.windows(2) {
        let (s, e) = (w[0], w[1]);
        let mut plan = SlicePlan::default();
        if s < e {
            // Address arithmetic only: s - file_offset < len, inside the buffer.
            let mem = addr.wrapping_add((s - file_offset) as usize);
            split_slice(&mut plan, s, e, mem, direct, buffered_fd);
        }
        slices.push(plan);
    }
    slices
}

fn split_slice(
    plan: &mut SlicePlan,
    s: u64,
    e: u64,
    mem: *mut u8,
    direct: Option<(RawFd, DioAlignment)>,
    buffered_fd: Option<RawFd>,
) {
    let seg = |fd: RawFd, from: u64, to: u64| Segment {
        fd,
        file_offset: from,
        // Address arithmetic only: from is within [s, e), inside the slice's memory.
        addr: mem.wrapping_add((from - s) as usize),
        len: (to - from) as usize,
    };
    if let Some((dfd, a)) = direct {
        // The direct body covers whole pages, not just whole O_DIRECT units:
        // a page that holds bytes outside this op may be written buffered by
        // another op at the same time (a neighbouring range of the same file),
        // and a direct write into a page that is dirty in the page cache
        // fails to invalidate it, so the stale page is later written back
        // over the direct bytes (seen as corruption by the stress tests).
        let grain = page_size().max(a.offset) as u64;
        let body_start = round_up(s, grain);
        let body_end = round_down(e, grain);
        let body_mem = mem as usize + (body_start.min(e) - s) as usize;
        if body_start < body_end && body_mem % a.memory == 0 {
            let bfd = || buffered_fd.expect("buffered descriptor opened for unaligned edges");
            if s < body_start {
                plan.buffered.push(seg(bfd(), s, body_start));
            }
            if body_end < e {
                plan.buffered.push(seg(bfd(), body_end, e));
            }
            plan.direct.push(seg(dfd, body_start, body_end));
            return;
        }
    }
    let bfd = buffered_fd.expect("buffered descriptor opened for unaligned slices");
    plan.buffered.push(seg(bfd, s, e));
}

/// Whether `plan_slices` would need a buffered descriptor.
fn needs_buffered(file_offset: u64, addr: *mut u8, len: usize, parallelism: usize, direct: Option<(RawFd, DioAlignment)>) -> bool {
    let Some((_, a)) = direct else { return len > 0 };
    // Probe with a placeholder descriptor: cheap, and the same arithmetic.
    plan_slices(file_offset, addr, len, parallelism, Some((-1, a)), Some(-1))
        .iter()
        .any(|s| !s.buffered.is_empty())
}

impl CpuOp {
    /// Opens the file, decides direct or bounce (filling the bounce buffer
    /// for a write), checks a read against the file's size, and plans slices.
    pub fn prepare(
        request: OpRequest<'_>,
        parallelism: usize,
        knobs: Knobs,
        manager: &PinnedMemoryManager,
    ) -> Result<CpuOp> {
        let OpRequest { direction, target, file_offset, buffer, staging, validate } = request;
        let file_offset = check_file_offset(file_offset, &target)?;
        let len = buffer.len;
        let mut file = OpenFile::open(target, direction)?;

        if direction == Direction::Read {
            check_read_extent(&file, file_offset, len)?;
        }

        let memory = if is_direct_capable(&buffer, manager) {
            IoMemory::Direct { _keep_alive: staging }
        } else {
            let mut staging = match staging {
                Some(s) => s,
                None if buffer.is_host && buffer.contiguous => {
                    // SAFETY: the caller keeps the buffer alive until finish.
                    Box::new(unsafe { MemcpyStaging::new(buffer.ptr, buffer.len) })
                }
                None => {
                    return Err(Error::InvalidArgument(
                        "a device or non-contiguous buffer needs a copier to bounce through host memory".into(),
                    ))
                }
            };
            // Unlocked: O_DIRECT needs alignment, not locking, and locked
            // bounce buffers would eat into RLIMIT_MEMLOCK.
            let skew = (file_offset % page_size() as u64) as usize;
            let mut bounce = PageAlignedBuffer::new(skew + len, LockMode::None)?;
            if direction == Direction::Write {
                staging.copy_to_bounce(&mut bounce.as_mut_slice()[skew..])?;
            }
            IoMemory::Bounce { buffer: bounce, skew, staging }
        };
        let io_ptr = match &memory {
            IoMemory::Direct { .. } => buffer.ptr,
            IoMemory::Bounce { buffer, skew, .. } => buffer.as_ptr().wrapping_add(*skew),
        };

        let direct = file.direct();
        let buffered_fd = if needs_buffered(file_offset, io_ptr, len, parallelism, direct) {
            Some(file.buffered_fd()?)
        } else {
            None
        };
        let slices = plan_slices(file_offset, io_ptr, len, parallelism, direct, buffered_fd);
        let direct_knobs = match direct {
            Some((_, a)) => Knobs { block_size: (knobs.block_size / a.offset).max(1) * a.offset, ..knobs },
            None => knobs,
        };
        let plan = Arc::new(OpPlan {
            direction,
            path: file.path().map(|p| p.to_path_buf()),
            caller_fd: file.caller_fd(),
            slices,
            knobs,
            direct_knobs,
        });
        Ok(CpuOp { plan, file, file_offset, len, io_ptr, memory, validate })
    }

    pub fn plan(&self) -> &Arc<OpPlan> {
        &self.plan
    }

    /// True when the I/O goes straight to the caller's memory.
    pub fn is_direct(&self) -> bool {
        matches!(self.memory, IoMemory::Direct { .. })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl CpuOp {
    fn close_error(&self, errno: i32) -> Error {
        Error::Transfer(self.plan.name_target(TransferError {
            direction: self.plan.direction,
            path: None,
            fd: self.file.any_fd(),
            file_offset: self.file_offset,
            len: self.len,
            errno,
            detail: Some("close() reported a deferred write error".into()),
        }))
    }
}

impl OpCompletion for CpuOp {
    /// Completes the op once every slice has run: reports the first slice
    /// error, else validates (if asked) and copies a bounced read back.
    /// Dropping `self` then closes the op's descriptors and frees the bounce.
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        if self.plan.direction == Direction::Write {
            // A deferred write error (NFS, FUSE) only shows at close().
            self.file.close_owned().map_err(|errno| self.close_error(errno))?;
        }
        if self.validate {
            // SAFETY: io_ptr covers len bytes that no one is writing now.
            let ours = unsafe { std::slice::from_raw_parts(self.io_ptr as *const u8, self.len) };
            report_validation(self.plan.direction, &self.file, self.file_offset, ours);
        }
        if self.plan.direction == Direction::Read {
            if let IoMemory::Bounce { buffer, skew, staging } = &mut self.memory {
                staging.copy_from_bounce(&buffer.as_slice()[*skew..])?;
            }
        }
        Ok(())
    }
}

/// A read must lie inside the file (DeepSpeed asserted, killing the process).
pub(crate) fn check_read_extent(file: &OpenFile, file_offset: u64, len: usize) -> Result<()> {
    let size = file.size()?;
    if file_offset.checked_add(len as u64).is_none_or(|end| end > size) {
        return Err(Error::InvalidArgument(format!(
            "{}: reading {len} bytes at offset {file_offset} runs past the end of the file ({size} bytes)",
            file.display_path().display()
        )));
    }
    Ok(())
}

/// A negative file offset is refused before anything is opened.
pub(crate) fn check_file_offset(file_offset: i64, target: &FileTarget<'_>) -> Result<u64> {
    u64::try_from(file_offset)
        .map_err(|_| Error::InvalidArgument(format!("file_offset {file_offset} is negative for {}", describe_target(target))))
}

/// DeepSpeed's `validate=True`: re-reads `[offset, offset + ours.len())` of
/// the file with plain reads and compares. Prints `Pass:`/`Fail:`; the op's
/// return code does not change.
pub(crate) fn report_validation(direction: Direction, file: &OpenFile, offset: u64, ours: &[u8]) {
    let verb = direction.verb();
    let name = file.display_path();
    let len = ours.len();
    match read_back(file, offset, len) {
        Ok(theirs) => match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            None => println!("Pass: correctness of {verb} of {len} bytes at offset {offset} of {}", name.display()),
            Some(i) => println!(
                "Fail: correctness of {verb} of {len} bytes at offset {offset} of {}: first difference at byte {i}",
                name.display()
            ),
        },
        Err(e) => println!("Fail: correctness of {verb} of {}: could not re-read: {e}", name.display()),
    }
}

fn describe_target(t: &FileTarget<'_>) -> String {
    match t {
        FileTarget::Path(p) => p.display().to_string(),
        FileTarget::Fd(fd) => format!("fd {fd}"),
    }
}

/// Reads `len` bytes at `offset` with a fresh buffered, read-only descriptor.
fn read_back(file: &OpenFile, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let path = match file.path() {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from(format!("/proc/self/fd/{}", file.any_fd())),
    };
    let f = std::fs::File::open(path)?;
    let mut out = vec![0u8; len];
    f.read_exact_at(&mut out, offset)?;
    Ok(out)
}
