//! Planning an op on a striped file: the op's logical bytes are sliced
//! among the workers exactly as for a plain file (`op/plan.rs`, with the
//! alignment every member meets), then each segment is cut at stripe units
//! and sent to its member's descriptor at its member offset. A worker's
//! segments stay in logical order, so its ring has requests on every
//! member in flight at once. Bytes past the striped extent (only reads:
//! a write first grows the extent) come from the placeholder itself.
//!
//! The plan names the logical file (the placeholder's device and inode)
//! for the handle's ordering of ops, and names the member, its file and
//! the logical offset in any transfer error.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::{AioParams, Segment};
use crate::error::{Direction, Result, TransferError};
use crate::file::OpenFile;
use crate::op::plan::{plan_slices, IoSpan, MemberNames, OpPlan, SlicePlan, BUFFERED_FD_PLACEHOLDER};

use super::file::StripedFile;
use super::layout::Layout;

/// Stands for "a member's direct descriptor" until the segment is mapped.
const DIRECT_TAG: RawFd = -2;

/// What a striped op's plan needs to name members in errors and to order
/// its streamed slices by logical bytes.
#[derive(Debug)]
pub(crate) struct StripePlan {
    logical: PathBuf,
    layout: Layout,
    /// Each member's file and the descriptors the op moves its bytes with.
    members: Vec<(PathBuf, Vec<RawFd>)>,
    /// The placeholder's buffered descriptor, for bytes past the extent.
    tail_fd: Option<RawFd>,
    /// Each slice's logical bytes `[start, end)`.
    slice_bounds: Vec<Option<(u64, u64)>>,
}

impl MemberNames for StripePlan {
    /// Names the member (its file, and where in the logical file the
    /// failed bytes are) in an engine's error.
    fn name(&self, mut e: TransferError) -> TransferError {
        if let Some((i, (path, _))) = self.members.iter().enumerate().find(|(_, (_, fds))| fds.contains(&e.fd)) {
            let at = self.layout.logical_of(i, e.file_offset);
            let what = format!(
                "stripe member {i} of {} (its logical offset {at}; the offset above is in the member file)",
                self.logical.display()
            );
            e.detail = Some(match e.detail.take() {
                Some(d) => format!("{what}; {d}"),
                None => what,
            });
            e.path = Some(path.clone());
            return e;
        }
        if e.path.is_none() || Some(e.fd) == self.tail_fd {
            e.path = Some(self.logical.clone());
        }
        e
    }

    /// Slice `index`'s logical bytes.
    fn slice_bounds(&self, index: usize) -> Option<(u64, u64)> {
        self.slice_bounds.get(index).copied().flatten()
    }
}

/// Appends `seg`, merging it into the last segment when it continues it in
/// the same file and memory.
fn push(list: &mut Vec<Segment>, seg: Segment) {
    if let Some(last) = list.last_mut() {
        if last.fd == seg.fd
            && last.file_offset + last.len as u64 == seg.file_offset
            && last.addr.wrapping_add(last.len) == seg.addr
        {
            last.len += seg.len;
            return;
        }
    }
    list.push(seg);
}

/// Plans an op on a striped `file` (see the module doc). A write first
/// grows the file's extent to cover its bytes.
pub(crate) fn plan_striped(
    direction: Direction,
    file: &mut OpenFile,
    file_offset: u64,
    memory: IoSpan,
    parallelism: usize,
    params: AioParams,
) -> Result<Arc<OpPlan>> {
    let IoSpan { ptr: io_ptr, len, registrable } = memory;
    let placeholder = file.any_fd();
    let end = file_offset + len as u64;
    if direction == Direction::Write {
        if let Some(s) = file.companion_mut::<StripedFile>() {
            s.extend_for_write(placeholder, file_offset, len)?;
        }
    }
    let Some(s) = file.companion::<StripedFile>() else { unreachable!("plan_striped on a plain file") };
    let (dio, extent) = (s.dio, s.extent);
    let logical_slices = plan_slices(file_offset, io_ptr, len, parallelism, dio.map(|a| (DIRECT_TAG, a)), BUFFERED_FD_PLACEHOLDER);
    // The extent need not be aligned (a write of 3584 bytes, then a
    // plain append: FastPersist's tail): a direct read across it moves its
    // last member piece, up to the extent, buffered.
    let align = dio.map_or(1, |a| a.offset as u64);
    let cuts_unaligned = |g: &Segment| g.file_offset < extent && extent < g.file_offset + g.len as u64 && extent % align != 0;
    let member_buffered = logical_slices.iter().flat_map(|s| s.buffered.iter()).any(|g| g.file_offset < extent)
        || logical_slices.iter().flat_map(|s| s.direct.iter()).any(cuts_unaligned);
    let tail_fd = if end > extent { Some(file.buffered_fd()?) } else { None };
    if member_buffered {
        if let Some(s) = file.companion_mut::<StripedFile>() {
            s.open_buffered()?;
        }
    }
    let Some(s) = file.companion::<StripedFile>() else { unreachable!() };
    let layout = s.layout;
    let mut slices = Vec::with_capacity(logical_slices.len());
    let mut bounds = Vec::with_capacity(logical_slices.len());
    for logical in &logical_slices {
        let mut plan = SlicePlan::default();
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let all = logical.buffered.iter().map(|g| (g, false)).chain(logical.direct.iter().map(|g| (g, true)));
        for (seg, direct) in all {
            let (start, stop) = (seg.file_offset, seg.file_offset + seg.len as u64);
            (lo, hi) = (lo.min(start), hi.max(stop));
            for run in layout.runs(start, stop.min(extent)) {
                let m = &s.members[run.member];
                let fd = if direct { m.direct_fd } else { m.buffered_fd };
                let fd = fd.expect("the member descriptor the plan needs was opened above");
                let piece = Segment {
                    fd,
                    file_offset: run.member_offset,
                    addr: seg.addr.wrapping_add((run.logical - start) as usize),
                    len: run.len as usize,
                };
                let unaligned_tail = if direct && run.logical + run.len == extent { run.len % align } else { 0 };
                if unaligned_tail == 0 {
                    push(if direct { &mut plan.direct } else { &mut plan.buffered }, piece);
                    continue;
                }
                let head = (run.len - unaligned_tail) as usize;
                if head > 0 {
                    push(&mut plan.direct, Segment { len: head, ..piece });
                }
                let buffered = m.buffered_fd.expect("the member's buffered descriptor was opened above");
                let tail = Segment { fd: buffered, file_offset: piece.file_offset + head as u64, addr: piece.addr.wrapping_add(head), len: unaligned_tail as usize };
                push(&mut plan.buffered, tail);
            }
            if stop > extent {
                let from = start.max(extent);
                let fd = tail_fd.expect("the placeholder's buffered descriptor was opened above");
                let piece = Segment { fd, file_offset: from, addr: seg.addr.wrapping_add((from - start) as usize), len: (stop - from) as usize };
                push(&mut plan.buffered, piece);
            }
        }
        bounds.push((lo < hi).then_some((lo, hi)));
        slices.push(plan);
    }
    let direct_params = match dio {
        Some(a) => AioParams { block_size: (params.block_size / a.offset).max(1) * a.offset, ..params },
        None => params,
    };
    let first_punts = s.members.first().and_then(|m| m.punts);
    let punting_fs = first_punts.filter(|fs| s.members.iter().all(|m| m.punts == Some(*fs)));
    let names = StripePlan {
        logical: s.logical.clone(),
        layout,
        members: s
            .members
            .iter()
            .map(|m| (m.path.clone(), m.direct_fd.into_iter().chain(m.buffered_fd).collect()))
            .collect(),
        tail_fd,
        slice_bounds: bounds,
    };
    Ok(Arc::new(OpPlan {
        direction,
        path: file.path().map(|p| p.to_path_buf()),
        caller_fd: file.caller_fd(),
        slices,
        params,
        direct_params,
        registrable,
        file_identity: file.order_identity(),
        punting_fs,
        members: Some(Box::new(names)),
    }))
}
