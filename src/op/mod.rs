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
use crate::staging::{BounceCopy, CallerGate, CopyRange, StagingBuffer};
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
    /// for an unaligned offset. A write copies the whole buffer in when it
    /// is submitted (DeepSpeed's semantics: the caller may reuse its tensor
    /// as soon as an async write returns), or block by block behind a
    /// [`CallerGate`] when the caller blocks in the call; a read copies out
    /// as `copy_out` says.
    Bounce { buffer: StagingBuffer, skew: usize, staging: Box<dyn Staging>, copy_out: CopyOut },
}

/// How a bounced read reaches the caller's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyOut {
    /// Contiguous host memory that cannot move (`Staging::memory_is_fixed`): the
    /// engines copy each block out as soon as it completes, overlapping the
    /// device's work on the next blocks (the plan's `bounce_copy`).
    Piecewise,
    /// Contiguous host memory a front end may move (a torch tensor can have
    /// its storage swapped or resized while the op is in flight): the
    /// engines copy each block out as it completes while the caller is in a
    /// call on the op (a blocking read, or `wait()` once the buffer is known
    /// not to have moved), behind the op's [`CallerGate`].
    Gated,
    /// Device or strided memory, or host memory whose front end can neither
    /// promise it stays put nor say where it is: the front end's `Staging`
    /// copies it, at wait().
    Staging,
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
    /// The caller's buffer as the op was given it (address, bytes).
    given: (usize, usize),
    /// When the engines copy to or from movable caller memory: the gate
    /// that lets them only while the caller is in a call on the op.
    gate: Option<Arc<CallerGate>>,
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
    ///
    /// `blocking`: the caller's thread stays in the call until the op
    /// finishes (or the call is interrupted, which closes the op's gate), so
    /// the engines may copy a bounced op's bytes block by block, overlapping
    /// the copies with the I/O.
    pub fn prepare(
        request: OpRequest<'_>,
        parallelism: usize,
        knobs: Knobs,
        manager: &PinnedMemoryManager,
        blocking: bool,
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
        let mut gate = None;
        let mut registrable = region.as_ref().filter(|_| direct).map(|hold| hold.registrable().clone());
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
            registrable = bounce.registrable().cloned();
            let host = buffer.is_host() && buffer.is_contiguous();
            let range = CopyRange {
                direction,
                bounce: bounce.as_ptr() as usize + skew,
                caller: buffer.ptr() as usize,
                len,
            };
            if direction == Direction::Write && host && blocking {
                // Copied in block by block by the engines (see `CallerGate`).
                gate = Some(Arc::new(CallerGate::new(range, true)));
            } else if direction == Direction::Write {
                let dst = &mut bounce.slice_mut(skew + len)[skew..];
                if host {
                    // SAFETY: BufferDesc's contract: `len` valid bytes at ptr.
                    let src = unsafe { std::slice::from_raw_parts(buffer.ptr() as *const u8, len) };
                    crate::staging::parallel_copy(dst, src);
                } else {
                    staging.copy_to_bounce(dst)?;
                }
            }
            // Writing into the caller's memory before wait() is only sound
            // when it cannot move; a movable buffer is written once, at
            // wait(), after it is known not to have moved; anything else
            // goes through the front end's own copy.
            let copy_out = if !host {
                CopyOut::Staging
            } else if staging.memory_is_fixed() {
                CopyOut::Piecewise
            } else if staging.reports_extent() {
                CopyOut::Gated
            } else {
                CopyOut::Staging
            };
            if direction == Direction::Read && copy_out == CopyOut::Gated {
                gate = Some(Arc::new(CallerGate::new(range, blocking)));
            }
            IoMemory::Bounce { buffer: bounce, skew, staging, copy_out }
        };
        let (io_ptr, bounce_copy) = match &memory {
            IoMemory::Direct { .. } => (buffer.ptr(), None),
            IoMemory::Bounce { buffer: bounce, skew, copy_out, .. } => {
                let io_ptr = bounce.as_ptr().wrapping_add(*skew);
                let copy = match &gate {
                    Some(gate) => Some(BounceCopy::Gated(gate.clone())),
                    None if direction == Direction::Read && *copy_out == CopyOut::Piecewise => {
                        let caller = buffer.ptr() as usize;
                        Some(BounceCopy::Fixed(CopyRange { direction, bounce: io_ptr as usize, caller, len }))
                    }
                    None => None,
                };
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
            registrable,
            file_identity: file.identity(),
        });
        let given = (buffer.ptr() as usize, len);
        Ok(CpuOp { plan, file, file_offset, len, io_ptr, memory, validate, given, gate })
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
            may_run_inline: true,
        }
    }

    /// The front end's hold on the caller's buffer, if it gave one.
    fn staging(&self) -> Option<&dyn Staging> {
        match &self.memory {
            IoMemory::Direct { _keep_alive, .. } => _keep_alive.as_deref(),
            IoMemory::Bounce { staging, .. } => Some(staging.as_ref()),
        }
    }

    /// A torch tensor whose storage was swapped while the op was in flight
    /// (`set_`, `resize_`, `.data =`): the op moved the memory it was given,
    /// which the front end kept alive. A read fails (its bytes did not reach
    /// the tensor the caller now has, and a bounced read is never copied into
    /// memory of another size); a write wrote what it was given, and says so
    /// once on stderr.
    fn check_buffer_not_swapped(&self) -> Result<()> {
        let Some((now_ptr, now_len)) = self.staging().and_then(|s| s.current_extent()) else { return Ok(()) };
        if (now_ptr, now_len) == self.given {
            return Ok(());
        }
        let verb = self.plan.direction.verb();
        let target = self.file.display_path();
        if self.plan.direction == Direction::Write {
            crate::log::info_once(
                "write-storage-swapped",
                &format!(
                    "a tensor's storage was replaced while its write to {} was in flight; the write used the \
                     memory it was given, which was kept alive until the op finished",
                    target.display()
                ),
            );
            return Ok(());
        }
        Err(Error::Copy(format!(
            "the tensor of this {verb} of {} bytes at offset {} of {} had its storage replaced while the op was \
             in flight (set_, resize_ or .data =): it was {} bytes at {:#x}, it is now {now_len} bytes at \
             {now_ptr:#x}. The op used the memory it was given, kept alive until now{}",
            self.len,
            self.file_offset,
            target.display(),
            self.given.1,
            self.given.0,
            "; the bytes read did not reach the tensor"
        )))
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
    fn caller_entered(&self) {
        // A read is let in only if its buffer is still where it was given
        // (else `finish` reports the swap and copies nothing).
        if let Some(gate) = &self.gate {
            if self.plan.direction == Direction::Read && self.check_buffer_not_swapped().is_ok() {
                gate.open();
            }
        }
    }

    fn caller_left(&self) {
        if let Some(gate) = &self.gate {
            gate.close();
        }
    }

    /// Completes the op once every slice has run: reports the first slice
    /// error, else validates (if asked) and copies a bounced read back.
    /// Dropping `self` then closes the op's descriptors and frees the bounce.
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        self.check_buffer_not_swapped()?;
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
            if let IoMemory::Bounce { buffer, skew, staging, copy_out } = &mut self.memory {
                let bytes = &buffer.slice(*skew + self.len)[*skew..];
                match copy_out {
                    CopyOut::Piecewise => {}
                    // The buffer has not moved (checked above): what completed
                    // while the caller was out of the call is copied now.
                    CopyOut::Gated => self.gate.as_ref().expect("a gated read has a gate").open(),
                    CopyOut::Staging => staging.copy_from_bounce(bytes)?,
                }
            }
        }
        Ok(())
    }
}
