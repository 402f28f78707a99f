//! One transfer (`cpu_op_desc_t` without torch), in one file per concept:
//!
//! * this file: the request ([`OpRequest`]), the bounce decision, and the
//!   op's lifecycle ([`CpuOp`]: prepare, run as slices, finish);
//! * [`plan`]: slice geometry (per-worker slices, the O_DIRECT edge split);
//! * [`checks`]: offset/extent/divisibility checks and `validate=True`;
//! * [`work`]: the shape the handle runs (work in slices, a completion).
//!
//! **Bounce decision.** I/O goes straight to the caller's memory only when it
//! is host memory, contiguous, and page-locked (declared pinned by the
//! caller, e.g. torch-pinned, or managed by the [`PinnedMemoryManager`]).
//! Anything else moves through a page-aligned bounce buffer: a write copies
//! into it when the op is prepared, a read copies out of it when the op
//! finishes. The copies go through [`Staging`], which the torch shims
//! implement for CPU, CUDA and strided tensors (the C++ read a
//! non-contiguous pinned destination into a temporary it never copied back).

pub(crate) mod checks;
pub(crate) mod plan;
pub(crate) mod work;

use std::sync::Arc;

use crate::buffer::{BufferDesc, MemcpyStaging, Staging};
use crate::engine::Knobs;
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::{FileTarget, OpenFile};
use crate::pinned::{page_size, PinnedMemoryManager, RegionHold};
use crate::staging::{BounceCopy, StagingBuffer};
use checks::{check_file_offset, check_read_extent, report_validation};
use plan::{OpPlan, BUFFERED_FD_PLACEHOLDER};
use work::{OpCompletion, OpMeta, PreparedOp};

/// A request to move one buffer.
pub struct OpRequest<'a> {
    pub direction: Direction,
    pub target: FileTarget<'a>,
    pub file_offset: i64,
    pub buffer: BufferDesc,
    /// How to copy when the op bounces, and the op's hold on the caller's
    /// memory until it finishes. `None` is fine for contiguous host memory
    /// (memcpy is used); device or strided memory must supply one.
    pub staging: Option<Box<dyn Staging>>,
    /// Re-read the file afterwards and compare (DeepSpeed's `validate`).
    pub validate: bool,
}

impl<'a> OpRequest<'a> {
    /// A request with no copier and no validation.
    pub fn new(direction: Direction, target: FileTarget<'a>, file_offset: i64, buffer: BufferDesc) -> OpRequest<'a> {
        OpRequest { direction, target, file_offset, buffer, staging: None, validate: false }
    }
}

/// Where the I/O memory of an op is.
enum IoMemory {
    /// The caller's buffer itself. `_keep_alive` is the caller's handle on it
    /// (the torch glue's reference to the tensor): it must live until the op
    /// finishes, or torch could free and reuse the memory under the I/O.
    ///
    /// `_region` is the op's hold on the managed region the memory lies in
    /// (when it does): freeing that region before the op finishes defers
    /// its unmap until the hold is dropped, with the op.
    Direct { _keep_alive: Option<Box<dyn Staging>>, _region: Option<RegionHold> },
    /// A bounce buffer (from the reuse pool) and the way back to the
    /// caller's buffer. The I/O bytes start `skew` bytes in, so that memory
    /// and file offsets share their alignment and O_DIRECT can still be used
    /// for an unaligned offset. `piecewise`: a read into contiguous host
    /// memory, which the engines copy out block by block as each completes
    /// (the plan's `bounce_copy`); else `staging` copies the whole buffer
    /// after a read (device or strided memory). A write always copies the
    /// whole buffer when it is submitted (DeepSpeed's semantics: the caller
    /// may reuse its tensor as soon as an async write returns), with several
    /// threads for large host buffers.
    Bounce { buffer: StagingBuffer, skew: usize, staging: Box<dyn Staging>, piecewise: bool },
}

/// One prepared transfer. Owns its descriptors and bounce buffer; dropping
/// it closes the first and frees the second.
pub(crate) struct CpuOp {
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
#[cfg_attr(not(test), allow(dead_code))] // `CpuOp::prepare` decides this with the region hold
pub(crate) fn is_direct_capable(buffer: &BufferDesc, manager: &PinnedMemoryManager) -> bool {
    buffer.is_host()
        && buffer.is_contiguous()
        && (buffer.is_declared_pinned() || manager.is_managed(buffer.ptr(), buffer.len()))
}

impl CpuOp {
    /// Opens the file, decides direct or bounce (filling the bounce buffer
    /// for a write), checks a read against the file's size, and plans slices
    /// (one planning pass; the buffered descriptor is opened only when the
    /// plan has buffered segments).
    pub fn prepare(
        request: OpRequest<'_>,
        parallelism: usize,
        knobs: Knobs,
        manager: &PinnedMemoryManager,
    ) -> Result<CpuOp> {
        let OpRequest { direction, target, file_offset, buffer, staging, validate } = request;
        let file_offset = check_file_offset(file_offset, &target)?;
        let len = buffer.len();
        let mut file = OpenFile::open(target, direction)?;

        if direction == Direction::Read {
            check_read_extent(&file, file_offset, len)?;
        }

        // Taking the hold and deciding "managed" is one lookup, so a region
        // freed concurrently is either held (and stays mapped) or not used
        // directly at all.
        let region = if buffer.is_host() && buffer.is_contiguous() { manager.hold(buffer.ptr(), buffer.len()) } else { None };
        let direct = buffer.is_host() && buffer.is_contiguous() && (buffer.is_declared_pinned() || region.is_some());
        let memory = if direct {
            IoMemory::Direct { _keep_alive: staging, _region: region }
        } else {
            let mut staging: Box<dyn Staging> = match staging {
                Some(s) => s,
                None => match MemcpyStaging::new(buffer) {
                    Some(s) => Box::new(s),
                    None => {
                        return Err(Error::InvalidArgument(
                            "a device or non-contiguous buffer needs a copier to bounce through host memory".into(),
                        ))
                    }
                },
            };
            // Unlocked: O_DIRECT needs alignment, not locking, and locked
            // bounce buffers would eat into RLIMIT_MEMLOCK. Pooled and
            // pre-faulted: no allocation or page faults per op.
            let skew = (file_offset % page_size() as u64) as usize;
            let mut bounce = StagingBuffer::take(skew + len)?;
            let host = buffer.is_host() && buffer.is_contiguous();
            if direction == Direction::Write {
                let dst = &mut bounce.slice_mut(skew + len)[skew..];
                if host {
                    // SAFETY: BufferDesc's contract: `len` valid bytes at ptr.
                    let src = unsafe { std::slice::from_raw_parts(buffer.ptr() as *const u8, len) };
                    crate::staging::parallel_copy(dst, src);
                } else {
                    staging.copy_to_bounce(dst)?;
                }
            }
            let piecewise = host && direction == Direction::Read;
            IoMemory::Bounce { buffer: bounce, skew, staging, piecewise }
        };
        let (io_ptr, bounce_copy) = match &memory {
            IoMemory::Direct { .. } => (buffer.ptr(), None),
            IoMemory::Bounce { buffer: bounce, skew, piecewise, .. } => {
                let io_ptr = bounce.as_ptr().wrapping_add(*skew);
                let copy = piecewise.then_some(BounceCopy {
                    direction,
                    bounce: io_ptr as usize,
                    caller: buffer.ptr() as usize,
                    len,
                });
                (io_ptr, copy)
            }
        };

        let direct = file.direct();
        let mut slices = plan::plan_slices(file_offset, io_ptr, len, parallelism, direct, BUFFERED_FD_PLACEHOLDER);
        if plan::needs_buffered(&slices) {
            let fd = file.buffered_fd()?;
            plan::patch_buffered_fd(&mut slices, fd);
        }
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
            bounce_copy,
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

    /// What this op moves, for the statistics.
    pub fn meta(&self) -> OpMeta {
        let bytes = self.len as u64;
        OpMeta {
            direction: Some(self.plan.direction),
            bytes,
            bounced_bytes: if self.is_direct() { 0 } else { bytes },
        }
    }

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

impl From<CpuOp> for PreparedOp {
    fn from(op: CpuOp) -> Self {
        let meta = op.meta();
        PreparedOp { work: op.plan().clone(), completion: Box::new(op), meta }
    }
}

impl OpCompletion for CpuOp {
    /// Completes the op once every slice has run: reports the first slice
    /// error, else validates (if asked) and copies a bounced read back.
    /// Dropping `self` then closes the op's descriptors and frees the bounce.
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        if self.validate {
            // Before the op's descriptors close: an op on a caller's fd
            // re-reads through its own description, never through the
            // caller's number (which may name another file by now).
            // SAFETY: io_ptr covers len bytes that no one is writing now.
            let ours = unsafe { std::slice::from_raw_parts(self.io_ptr as *const u8, self.len) };
            report_validation(self.plan.direction, &self.file, self.file_offset, ours);
        }
        if self.plan.direction == Direction::Write {
            // A deferred write error (NFS, FUSE) only shows at close().
            self.file.close_owned().map_err(|errno| self.close_error(errno))?;
        }
        if self.plan.direction == Direction::Read {
            if let IoMemory::Bounce { buffer, skew, staging, piecewise: false } = &mut self.memory {
                staging.copy_from_bounce(&buffer.slice(*skew + self.len)[*skew..])?;
            }
        }
        Ok(())
    }
}
