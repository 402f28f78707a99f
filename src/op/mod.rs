//! One transfer (`cpu_op_desc_t` without torch), in one file per concept:
//!
//! * this file: the request ([`OpRequest`]), the bounce decision, and the
//!   op's lifecycle ([`CpuOp`]: prepare, run as slices, settle, finish);
//! * [`caller`]: the caller's memory and the one ownership rule for it;
//! * [`window`]: blocking ops on bounced memory, streamed through a few
//!   bounded windows;
//! * [`read_ahead`]: how many of a bounced read's windows are in flight;
//! * [`plan`]: slice geometry (per-worker slices, the O_DIRECT edge split);
//! * [`checks`]: offset/extent/divisibility checks and `validate=True`;
//! * [`work`]: the shape the handle runs (work in slices, a completion).
//!
//! **Bounce decision.** I/O goes straight to the caller's memory only when it
//! is host memory, contiguous, and page-locked (declared pinned by the
//! caller, e.g. torch-pinned, or managed by the [`PinnedMemoryManager`]).
//! Anything else moves through a page-aligned bounce buffer
//! (`crate::bounce`): an async write copies the caller's bytes in when it is
//! submitted (the caller may reuse its buffer as soon as the call returns,
//! as with DeepSpeed), an async read copies them out when it is settled or
//! finished, on the thread that waits; a blocking op streams through
//! windows ([`window`]). Every such copy follows the rule in [`caller`].

pub(crate) mod caller;
pub(crate) mod checks;
pub(crate) mod plan;
pub(crate) mod work;

use std::sync::Arc;

use crate::bounce::{BounceBuffer, Purpose};
use crate::buffer::{BufferDesc, HostMemcpy, Staging};
use crate::engine::AioParams;
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::{FileTarget, OpenFile};
use crate::bounce::copy::parallel_copy;
use crate::pinned::{page_size, PinnedMemoryManager, RegionHold};
use caller::{bytes, bytes_mut, CallerMemory};
use checks::{check_file_offset, check_read_extent, describe_op, report_validation, EarlierWrites};
use plan::{IoSpan, OpPlan};
use crate::bounce::window::WindowedOp;
use work::{OpCompletion, OpFootprint, OpMeta, PreparedOp};

/// A request to move one buffer, as DeepSpeed's calls make it (an `i64`
/// offset, a front end's staging, `validate`): what the front ends and `IoHandle::submit` take.
pub struct OpRequest<'a> {
    /// Read or write.
    pub direction: Direction,
    /// The file.
    pub target: FileTarget<'a>,
    /// Where in the file (negative is refused).
    pub file_offset: i64,
    /// The caller's memory.
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

/// Whether the caller waits in the call until the op is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Submitted now, finished by a later `wait()`.
    Async,
    /// Done before the call returns: bounced memory may stream through
    /// windows (see [`window`]).
    Blocking,
}

/// What [`CpuOp::prepare`] makes of a request.
#[allow(clippy::large_enum_variant)] // made and matched once per op: boxing would allocate per op
pub(crate) enum Prepared {
    /// An op for the handle's queue (or the calling thread).
    Op(CpuOp),
    /// A blocking op on bounced host memory, larger than one window.
    Windowed(WindowedOp),
}

#[cfg(test)]
impl Prepared {
    /// The queued op (tests prepare ops that are never windowed).
    pub fn into_op(self) -> CpuOp {
        match self {
            Prepared::Op(op) => op,
            Prepared::Windowed(_) => panic!("a windowed op"),
        }
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
    /// A bounce buffer and the way back to the caller's buffer. The I/O
    /// bytes start `skew` bytes in, so that memory and file offsets share
    /// their alignment and O_DIRECT can still be used for an unaligned
    /// offset. `host`: the caller's memory is contiguous host memory, copied
    /// by the core (else through `staging`'s own copies).
    Bounce { buffer: BounceBuffer, skew: usize, staging: Box<dyn Staging>, host: Option<CallerMemory> },
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
    footprint: OpFootprint,
    /// A bounced read's copy to the caller was made (by `settle`), and
    /// failed with this, if it did (reported by `finish`).
    copied_out: bool,
    copy_error: Option<Error>,
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
    /// Opens the file, decides direct or bounce (copying an async write's
    /// bytes into its bounce buffer), checks a read against the file's
    /// size, and plans slices (one planning pass; the buffered descriptor is
    /// opened only when the plan has buffered segments). A blocking op on
    /// bounced host memory larger than `window` comes back as a
    /// [`WindowedOp`].
    pub fn prepare(
        request: OpRequest<'_>,
        parallelism: usize,
        params: AioParams,
        manager: &PinnedMemoryManager,
        mode: Mode,
        earlier_writes: EarlierWrites<'_>,
    ) -> Result<Prepared> {
        let OpRequest { direction, target, file_offset, buffer, staging, validate } = request;
        let file_offset = check_file_offset(file_offset, &target)?;
        let len = buffer.len();
        let mut file = crate::stripe::open(target, direction)?;

        if direction == Direction::Read {
            check_read_extent(&file, file_offset, len, earlier_writes)?;
        }
        let given = (buffer.ptr() as usize, len);
        let what = || describe_op(direction, len, file_offset, &file);
        let mut footprint = OpFootprint::of_memory(given.0, len, direction == Direction::Read);
        footprint.file = file.order_identity().map(|id| (id, file_offset, file_offset + len as u64));

        // Taking the hold and deciding "managed" is one lookup, so a region
        // freed concurrently is either held (and stays mapped) or not used
        // directly at all.
        let host = buffer.is_host() && buffer.is_contiguous();
        let region = if host { manager.hold(buffer.ptr(), buffer.len()) } else { None };
        let direct = host && (buffer.is_declared_pinned() || region.is_some());
        let mut registrable = region.as_ref().filter(|_| direct).map(|hold| hold.registrable().clone());
        let memory = if direct {
            IoMemory::Direct { _keep_alive: staging, _region: region }
        } else {
            let mut staging: Box<dyn Staging> = match staging {
                Some(s) => s,
                None => match HostMemcpy::new(buffer) {
                    Some(s) => Box::new(s),
                    None => {
                        return Err(Error::InvalidArgument(
                            "a device or non-contiguous buffer needs a copier to bounce through host memory".into(),
                        ))
                    }
                },
            };
            let skew = (file_offset % page_size() as u64) as usize;
            let caller = host.then_some(CallerMemory { addr: given.0, len });
            let window = crate::bounce::window::window_bytes(parallelism, &params);
            if mode == Mode::Blocking && len > window {
                if let Some(caller) = caller {
                    let op = WindowedOp::new(direction, file, file_offset, caller, staging, skew, validate);
                    return Ok(Prepared::Windowed(op.with_geometry(parallelism, params, window)));
                }
            }
            // Unlocked: O_DIRECT needs alignment, not locking, and locked
            // bounce buffers would eat into RLIMIT_MEMLOCK. Pooled and
            // pre-faulted: no allocation or page faults per op.
            let purpose = if mode == Mode::Async { Purpose::AsyncOp } else { Purpose::Window };
            let mut bounce = BounceBuffer::take(skew + len, purpose, &what)?;
            registrable = bounce.registrable().cloned();
            if direction == Direction::Write {
                let dst = &mut bounce.slice_mut(skew + len)[skew..];
                match &caller {
                    Some(caller) => caller.with_bytes(staging.as_ref(), 0, len, &what, |src| {
                        // SAFETY: the caller's `len` bytes, held still (see caller.rs).
                        parallel_copy(dst, unsafe { bytes(src, len) })
                    })?,
                    None => staging.copy_to_bounce(dst).map_err(|e| e.in_copy_of(&what))?,
                }
            }
            IoMemory::Bounce { buffer: bounce, skew, staging, host: caller }
        };
        let io_ptr = match &memory {
            IoMemory::Direct { .. } => buffer.ptr(),
            IoMemory::Bounce { buffer: bounce, skew, .. } => bounce.as_ptr().wrapping_add(*skew),
        };
        let span = IoSpan { ptr: io_ptr, len, registrable };
        let plan = crate::stripe::plan_op(direction, &mut file, file_offset, span, parallelism, params)?;
        Ok(Prepared::Op(CpuOp { plan, file, file_offset, len, io_ptr, memory, validate, given, footprint, copied_out: false, copy_error: None }))
    }

    pub fn plan(&self) -> &Arc<OpPlan> {
        &self.plan
    }

    /// True when the I/O goes straight to the caller's memory.
    pub fn is_direct(&self) -> bool {
        matches!(self.memory, IoMemory::Direct { .. })
    }

    /// What this op moves, for the statistics and the handle's ordering.
    pub fn meta(&self) -> OpMeta {
        let bytes = self.len as u64;
        OpMeta {
            direction: Some(self.plan.direction),
            bytes,
            bounced_bytes: if self.is_direct() { 0 } else { bytes },
            may_run_inline: true,
            footprint: Some(self.footprint),
        }
    }

    /// The front end's hold on the caller's buffer, if it gave one.
    fn staging(&self) -> Option<&dyn Staging> {
        match &self.memory {
            IoMemory::Direct { _keep_alive, .. } => _keep_alive.as_deref(),
            IoMemory::Bounce { staging, .. } => Some(staging.as_ref()),
        }
    }

    fn what(&self) -> String {
        describe_op(self.plan.direction, self.len, self.file_offset, &self.file)
    }

    /// A direct op on a torch tensor whose storage was swapped while the op
    /// was in flight (`set_`, `resize_`, `.data =`): the op moved the memory
    /// it was given, which the front end kept alive. A read fails (its bytes
    /// did not reach the tensor the caller now has); a write wrote what it
    /// was given, and says so once on stderr.
    fn check_direct_buffer_not_swapped(&self) -> Result<()> {
        let Some(staging) = self.staging() else { return Ok(()) };
        let mut now = None;
        let held = staging.hold_still(&mut || {
            now = staging.current_extent();
            Ok(())
        });
        // A write's outcome never depends on this check (it only informs):
        // where it cannot be made (the interpreter is shutting down, with the
        // write done), the write stands.
        if held.is_err() && self.plan.direction == Direction::Write {
            return Ok(());
        }
        held?;
        let Some(now) = now.filter(|now| *now != self.given) else { return Ok(()) };
        if self.plan.direction == Direction::Write {
            crate::rt::log::info_once(
                "write-storage-swapped",
                &format!(
                    "a tensor's storage was replaced while its write to {} was in flight; the write used the \
                     memory it was given, which was kept alive until the op finished",
                    self.file.display_path().display()
                ),
            );
            return Ok(());
        }
        Err(caller::moved_error(self.what(), self.given, now))
    }

    /// A bounced read's bytes to the caller (once: a second call returns
    /// what the first one kept).
    fn copy_out(&mut self) -> Result<()> {
        if self.copied_out {
            return self.copy_error.take().map_or(Ok(()), Err);
        }
        // Named only if a copy fails: formatting it costs more than a small op's copy.
        let (direction, len, file_offset, file) = (self.plan.direction, self.len, self.file_offset, &self.file);
        let what = || describe_op(direction, len, file_offset, file);
        let result = match &mut self.memory {
            IoMemory::Bounce { buffer, skew, staging, host } if direction == Direction::Read => {
                let src = &buffer.slice(*skew + len)[*skew..];
                match host {
                    Some(caller) => caller.with_bytes(staging.as_ref(), 0, len, &what, |dst| {
                        // SAFETY: the caller's `len` bytes, held still (see caller.rs).
                        parallel_copy(unsafe { bytes_mut(dst, src.len()) }, src)
                    }),
                    None => staging.copy_from_bounce(src).map_err(|e| e.in_copy_of(&what)),
                }
            }
            _ => Ok(()),
        };
        self.copied_out = true;
        result
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
    fn settle(&mut self, slices_ok: bool) {
        if slices_ok && self.plan.direction == Direction::Read && !self.copied_out {
            self.copy_error = self.copy_out().err();
        }
    }

    /// Completes the op once every slice has run: reports the first slice
    /// error, else validates (if asked) and copies a bounced read back.
    /// Dropping `self` then closes the op's descriptors and frees the bounce.
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        if self.is_direct() {
            self.check_direct_buffer_not_swapped()?;
        }
        if self.validate {
            // Before the op's descriptors close: an op on a caller's fd
            // re-reads through its own description, never through the
            // caller's number (which may name another file by now).
            // SAFETY: io_ptr covers len bytes that no one is writing now.
            let ours = unsafe { bytes(self.io_ptr, self.len) };
            report_validation(self.plan.direction, &self.file, self.file_offset, ours);
        }
        if self.plan.direction == Direction::Write {
            // A deferred write error (NFS, FUSE) only shows at close().
            self.file.close_owned().map_err(|errno| self.close_error(errno))?;
        }
        self.copy_out()
    }
}
