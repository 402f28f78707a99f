//! Slice geometry: how one op's bytes are cut among the workers, and inside
//! each worker's slice, which bytes go through the O_DIRECT descriptor and
//! which through the buffered one.
//!
//! * **Slices.** `[file_offset, file_offset + len)` is cut into
//!   `parallelism` slices whose inner boundaries fall on page boundaries of
//!   the file (rounded down), so no two workers ever touch the same page or
//!   file-system block.
//! * **O_DIRECT edges.** Inside a slice, the whole pages go through the
//!   direct descriptor (when the memory there meets O_DIRECT's alignment);
//!   unaligned heads and tails, and whole slices whose memory cannot be
//!   aligned, go through the buffered descriptor. Buffered segments run
//!   before direct ones, so the page cache never holds stale copies of the
//!   direct bytes.

use std::os::fd::RawFd;
use std::path::PathBuf;

use std::sync::Arc;

use crate::engine::fixed::RegistrableMemory;
use crate::engine::choice::{punting_fs_of, PuntingFs};
use crate::engine::{AioParams, Engine, Segment, StreamRun};
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::{DioAlignment, FileIdentity, OpenFile};
use crate::op::work::{Footprint, OpWork};
use crate::pinned::page_size;

/// Stands for the buffered descriptor until the op opens it: planning runs
/// once, before the op knows whether it needs that descriptor.
pub(crate) const BUFFERED_FD_PLACEHOLDER: RawFd = -1;

/// The segments one worker moves: buffered ones first, then direct ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlicePlan {
    pub buffered: Vec<Segment>,
    pub direct: Vec<Segment>,
}

impl SlicePlan {
    pub fn bytes(&self) -> usize {
        self.buffered.iter().chain(&self.direct).map(|s| s.len).sum()
    }
    fn first_offset(&self) -> Option<u64> {
        self.buffered.iter().chain(&self.direct).map(|g| g.file_offset).min()
    }
}

/// The immutable part of an op that workers read while it runs.
#[derive(Debug)]
pub(crate) struct OpPlan {
    pub direction: Direction,
    pub path: Option<PathBuf>,
    /// The caller's descriptor when the op was given one instead of a path.
    pub caller_fd: Option<RawFd>,
    pub slices: Vec<SlicePlan>,
    pub params: AioParams,
    /// `params` with the block size rounded to the O_DIRECT alignment.
    pub direct_params: AioParams,
    /// The registrable memory the I/O goes to or from (a managed region or
    /// the bounce buffer): rings name it as a fixed buffer.
    pub registrable: Option<Arc<RegistrableMemory>>,
    /// The file's device and inode (known when it has a direct descriptor).
    pub file_identity: Option<FileIdentity>,
    /// The file is on a file system io_uring punts for (see `engine::choice`).
    pub punting_fs: Option<PuntingFs>,
    /// When the segments are on other files than the op's own (a striped
    /// file's members): how to name them in errors and order its slices.
    pub members: Option<Box<dyn MemberNames>>,
}

/// How a plan whose segments are on other files than the op's names them
/// (the stripe module's plans, on a striped file's members).
pub(crate) trait MemberNames: std::fmt::Debug + Send + Sync {
    /// `e` (from an engine, naming a segment's descriptor and offset) with
    /// the file it failed on and where that is in the op's file.
    fn name(&self, e: TransferError) -> TransferError;
    /// The op's file bytes `[start, end)` that slice `index` moves.
    fn slice_bounds(&self, index: usize) -> Option<(u64, u64)>;
}

impl OpPlan {
    /// Names the op's target in a slice error: its path, or the caller's
    /// descriptor. A failure on the buffered twin of a caller's fd must name
    /// the fd the caller knows, not the short-lived twin the op opened.
    pub fn name_target(&self, e: TransferError) -> TransferError {
        if let Some(members) = &self.members {
            return members.name(e);
        }
        let mut e = e.with_path(self.path.clone());
        if e.path.is_none() {
            if let Some(fd) = self.caller_fd {
                e.fd = fd;
            }
        }
        e
    }

    /// Moves slice `index` with `engine`, or with the engine it keeps for
    /// the file's file system.
    pub fn run_slice(&self, index: usize, engine: &mut dyn Engine) -> std::result::Result<(), TransferError> {
        if let Some(fs) = self.punting_fs {
            if let Some(for_fs) = engine.for_file_system(fs) {
                crate::engine::choice::note_routed(fs, self.path.as_deref());
                return self.run_slice_on(index, for_fs, true);
            }
        }
        self.run_slice_on(index, engine, false)
    }

    /// `routed`: on the psync engine of a file io_uring punts for (its own parameters).
    fn run_slice_on(&self, index: usize, engine: &mut dyn Engine, routed: bool) -> std::result::Result<(), TransferError> {
        let Some(slice) = self.slices.get(index) else { return Ok(()) };
        let attach = |e: TransferError| self.name_target(e);
        let memory = self.registrable.as_ref();
        let params_for = |params: &AioParams, segments: &[Segment]| match routed {
            true => {
                let bytes = segments.iter().map(|s| s.len).sum();
                crate::engine::choice::psync_params(self.direction, params, bytes, self.slices.len())
            }
            false => *params,
        };
        if !slice.buffered.is_empty() {
            let params = params_for(&self.params, &slice.buffered);
            engine.run_with(self.direction, &slice.buffered, &params, memory).map_err(attach)?;
        }
        if !slice.direct.is_empty() {
            let params = params_for(&self.direct_params, &slice.direct);
            engine.run_with(self.direction, &slice.direct, &params, memory).map_err(attach)?;
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
    fn stream_run(&self, index: usize) -> Option<(StreamRun, Footprint)> {
        // Only what one engine run moves, in DeepSpeed's overlap mode; the
        // rest keeps `run_slice`.
        let slice = self.slices.get(index)?;
        // (Files io_uring punts for run slice by slice, on their own engine.)
        if self.punting_fs.is_some() {
            return None;
        }
        let params = self.direct_params;
        let streams = slice.buffered.is_empty()
            && !slice.direct.is_empty()
            && params.overlap_events
            && !params.single_submit;
        if !streams {
            return None;
        }
        // A striped slice's segments are at member offsets: it is ordered
        // by the logical bytes it moves.
        let (start, end) = match &self.members {
            Some(members) => members.slice_bounds(index)?,
            None => (
                slice.direct.iter().map(|g| g.file_offset).min()?,
                slice.direct.iter().map(|g| g.file_offset + g.len as u64).max()?,
            ),
        };
        let footprint = Footprint {
            file: self.file_identity?,
            start,
            end,
            memory: (
                slice.direct.iter().map(|g| g.addr as usize).min()?,
                slice.direct.iter().map(|g| g.addr as usize + g.len).max()?,
            ),
            writes: self.direction == Direction::Write,
        };
        let run = StreamRun {
            direction: self.direction,
            segments: slice.direct.clone(),
            params,
            memory: self.registrable.clone(),
        };
        Some((run, footprint))
    }
    fn stream_error(&self, e: TransferError) -> Error {
        Error::from(self.name_target(e))
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        let slice = self.slices.get(index);
        Error::Transfer(self.name_target(TransferError {
            direction: self.direction,
            path: None,
            fd: -1,
            file_offset: slice.and_then(SlicePlan::first_offset).unwrap_or(0),
            len: slice.map(|s| s.bytes()).unwrap_or(0),
            errno: libc::EIO,
            detail: Some(detail),
        }))
    }
}

fn round_down(v: u64, a: u64) -> u64 {
    v / a * a
}
fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// The granule slice boundaries and direct bodies snap to: a page, or the
/// O_DIRECT offset alignment when that is larger.
pub(crate) fn grain(direct: Option<DioAlignment>) -> u64 {
    match direct {
        Some(a) => page_size().max(a.offset) as u64,
        None => page_size() as u64,
    }
}

/// Cuts `[file_offset, file_offset + len)` (memory at `addr`) into
/// `parallelism` slices with page-aligned inner boundaries, and each slice
/// into buffered and direct segments. Buffered segments use `buffered_fd`
/// (which may be [`BUFFERED_FD_PLACEHOLDER`], patched later by
/// [`patch_buffered_fd`]).
pub(crate) fn plan_slices(
    file_offset: u64,
    addr: *mut u8,
    len: usize,
    parallelism: usize,
    direct: Option<(RawFd, DioAlignment)>,
    buffered_fd: RawFd,
) -> Vec<SlicePlan> {
    let parallelism = parallelism.max(1);
    let grain = grain(direct.map(|(_, a)| a));
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

fn split_slice(plan: &mut SlicePlan, s: u64, e: u64, mem: *mut u8, direct: Option<(RawFd, DioAlignment)>, bfd: RawFd) {
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
        let grain = grain(Some(a));
        let body_start = round_up(s, grain);
        let body_end = round_down(e, grain);
        let body_mem = mem as usize + (body_start.min(e) - s) as usize;
        if body_start < body_end && body_mem % a.memory == 0 {
            if s < body_start {
                plan.buffered.push(seg(bfd, s, body_start));
            }
            if body_end < e {
                plan.buffered.push(seg(bfd, body_end, e));
            }
            plan.direct.push(seg(dfd, body_start, body_end));
            return;
        }
    }
    plan.buffered.push(seg(bfd, s, e));
}

/// Whether any slice has buffered segments (the op then needs a buffered
/// descriptor).
pub(crate) fn needs_buffered(slices: &[SlicePlan]) -> bool {
    slices.iter().any(|s| !s.buffered.is_empty())
}

/// Points every buffered segment at `fd`, once the op has opened it.
pub(crate) fn patch_buffered_fd(slices: &mut [SlicePlan], fd: RawFd) {
    for seg in slices.iter_mut().flat_map(|s| s.buffered.iter_mut()) {
        seg.fd = fd;
    }
}

/// The memory an op's I/O moves: `len` bytes at `ptr` (the caller's, or a
/// bounce buffer), and whether io_uring may register it.
pub(crate) struct IoSpan {
    pub ptr: *mut u8,
    pub len: usize,
    pub registrable: Option<Arc<crate::engine::fixed::RegistrableMemory>>,
}

/// Plans an op's slices over `memory` (opening the buffered descriptor
/// when some bytes cannot go direct).
pub(crate) fn plan_op(
    direction: Direction,
    file: &mut OpenFile,
    file_offset: u64,
    memory: IoSpan,
    parallelism: usize,
    params: AioParams,
) -> Result<Arc<OpPlan>> {
    let IoSpan { ptr: io_ptr, len, registrable } = memory;
    let direct = file.direct();
    let mut slices = plan_slices(file_offset, io_ptr, len, parallelism, direct, BUFFERED_FD_PLACEHOLDER);
    if needs_buffered(&slices) {
        let fd = file.buffered_fd()?;
        patch_buffered_fd(&mut slices, fd);
    }
    let direct_params = match direct {
        Some((_, a)) => AioParams { block_size: (params.block_size / a.offset).max(1) * a.offset, ..params },
        None => params,
    };
    Ok(Arc::new(OpPlan {
        direction,
        path: file.path().map(|p| p.to_path_buf()),
        caller_fd: file.caller_fd(),
        slices,
        params,
        direct_params,
        registrable,
        file_identity: file.identity(),
        punting_fs: punting_fs_of(file),
        members: None,
    }))
}

#[cfg(test)]
mod tests;
