//! Slice plans and the bounce decision of real ops on a real O_DIRECT file:
//! page-aligned slices, direct bodies with buffered edges, exact coverage,
//! and which buffers go direct.

use crate::test_support::*;
use crate::engine::AioParams;
use crate::op::work::OpCompletion;
use crate::op::checks::NO_EARLIER_WRITES;
use crate::op::{is_direct_capable, CpuOp, Mode, Prepared};

fn queued(p: Prepared) -> CpuOp {
    p.into_op()
}
use crate::pinned::page_size;
use crate::{BufferDesc, Direction, Error, FileTarget, Location, PinnedMemoryManager};

#[test]
fn slices_are_page_aligned_inside_and_aligned_pinned_ops_go_direct() {
    let dir = TempDir::new("plan");
    let path = dir.file("f.bin");
    write_file(&path, &vec![0u8; 1 << 20]);
    let m = PinnedMemoryManager::shared();
    let params = AioParams { block_size: 4096, queue_depth: 4, single_submit: false, overlap_events: false };
    for par in 1..=4usize {
        let len = 12 * 4096 * 5;
        let buf = Pinned::new(len);
        let req = request(Direction::Read, FileTarget::Path(&path), 8192, buf.desc());
        let op = queued(CpuOp::prepare(req, par, params, m, Mode::Async, NO_EARLIER_WRITES).unwrap());
        assert!(op.is_direct(), "pinned memory goes direct");
        let plan = op.plan();
        assert_eq!(plan.slices.len(), par);
        assert_eq!(plan.slices.iter().map(|s| s.bytes()).sum::<usize>(), len);
        for s in &plan.slices {
            assert!(s.buffered.is_empty(), "an aligned op needs no buffered edges: {s:?}");
            assert!(!s.direct.is_empty(), "every worker gets a share of an aligned op");
            for seg in &s.direct {
                assert_eq!(seg.file_offset % page_size() as u64, 0, "slice boundaries fall on pages");
            }
        }
        // The direct descriptor really is O_DIRECT on this file system.
        let fd = plan.slices[0].direct[0].fd;
        // SAFETY: F_GETFL only reads the flags of a descriptor this code owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        assert!(flags & libc::O_DIRECT != 0, "the test directory must support O_DIRECT");
        // Block size rounded to the O_DIRECT unit for the direct segments.
        assert_eq!(plan.direct_params.block_size % 512, 0);
        let mut op = op;
        OpCompletion::finish(&mut op, Ok(())).unwrap();
    }
    // An unaligned op whose memory is misaligned like its file offset (a
    // narrow at +1 written at offset 1): direct body, buffered edges.
    let buf = Pinned::new(10_001);
    let op = CpuOp::prepare(
        request(Direction::Write, FileTarget::Path(&path), 1, buf.narrow(1, 10_000)),
        1,
        AioParams { block_size: 1000, ..params },
        m,
        Mode::Async,
        NO_EARLIER_WRITES,
    )
    .unwrap()
    .into_op();
    let s = &op.plan().slices[0];
    assert_eq!(s.buffered.len(), 2, "head and tail go buffered: {s:?}");
    assert_eq!(s.direct.len(), 1);
    assert_eq!(s.direct[0].file_offset % 512, 0);
    assert_eq!(op.plan().direct_params.block_size, 512, "block 1000 rounds down to 512 for O_DIRECT");
    drop(op);
    // Memory misaligned differently from the file offset cannot go direct:
    // the whole slice goes buffered (never a failing O_DIRECT request).
    let req = request(Direction::Write, FileTarget::Path(&path), 1, buf.narrow(0, 10_000));
    let op = queued(CpuOp::prepare(req, 1, params, m, Mode::Async, NO_EARLIER_WRITES).unwrap());
    let s = &op.plan().slices[0];
    assert!(s.direct.is_empty() && s.buffered.len() == 1 && s.buffered[0].len == 10_000, "{s:?}");
    drop(op);
}

/// For many random ops: the slices cover the op exactly once, each slice's
/// buffered edges come before its direct body, and every O_DIRECT segment
/// covers whole pages only, so no page is written both directly by one op
/// and buffered by a neighbouring op (which corrupts data: a dirty page that
/// a direct write cannot invalidate is written back over it later).
#[test]
fn plans_cover_the_op_exactly_and_direct_segments_own_whole_pages() {
    let dir = TempDir::new("plans");
    let path = dir.file("f.bin");
    write_file(&path, &vec![0u8; 1 << 20]);
    let m = PinnedMemoryManager::shared();
    let page = page_size() as u64;
    let mut rng = Rng::new(0x9A7);
    let region = Pinned::new((1 << 20) + 8192);
    let mut direct_seen = 0;
    for _ in 0..400 {
        let par = rng.range(1, 4);
        let len = rng.range(0, 300_000);
        let off = [0, 1, 511, 512, 4095, 4096, 4097, rng.range(0, 500_000)][rng.range(0, 7)] as u64;
        // Memory skewed like the file offset (so the body can go direct), or randomly.
        let skew = if rng.range(0, 1) == 0 { off as usize % 4096 } else { rng.range(0, 4095) };
        let direction = if rng.range(0, 1) == 0 { Direction::Read } else { Direction::Write };
        let params = AioParams { block_size: 4096, queue_depth: 4, single_submit: false, overlap_events: false };
        let req = request(direction, FileTarget::Path(&path), off as i64, region.narrow(skew, len));
        let op = queued(CpuOp::prepare(req, par, params, m, Mode::Async, NO_EARLIER_WRITES).unwrap());
        let plan = op.plan();
        let mut covered: Vec<(u64, u64)> = Vec::new();
        for s in &plan.slices {
            for seg in s.buffered.iter().chain(&s.direct) {
                // Memory and file stay in step.
                assert_eq!(seg.addr as usize - region.ptr() as usize - skew, (seg.file_offset - off) as usize);
                covered.push((seg.file_offset, seg.file_offset + seg.len as u64));
            }
            for seg in &s.direct {
                direct_seen += 1;
                let end = seg.file_offset + seg.len as u64;
                assert!(
                    seg.file_offset % page == 0 && end % page == 0,
                    "off={off} len={len} par={par}: direct segment [{}, {end}) shares a page with bytes outside it",
                    seg.file_offset
                );
                assert_eq!(seg.addr as usize % 512, 0, "O_DIRECT memory alignment");
            }
        }
        covered.sort();
        let mut at = off;
        for (a, b) in covered {
            assert_eq!(a, at, "off={off} len={len} par={par}: gap or overlap at {at}");
            assert!(b > a, "empty segment");
            at = b;
        }
        assert_eq!(at, off + len as u64, "off={off} len={len} par={par}: plan does not reach the end");
        drop(op);
    }
    assert!(direct_seen > 100, "the random ops exercised the direct path ({direct_seen} segments)");
}

#[test]
fn pinned_memory_goes_direct_and_heap_memory_bounces() {
    let dir = TempDir::new("bounce");
    let path = dir.file("f.bin");
    write_file(&path, &pattern(1, 1 << 16));
    let m = PinnedMemoryManager::shared();
    let params = AioParams { block_size: 4096, queue_depth: 4, single_submit: false, overlap_events: false };
    let p = Pinned::new(1 << 16);
    let mut v = vec![0u8; 1 << 16];

    let cases: Vec<(BufferDesc, bool, &str)> = vec![
        (p.desc(), true, "whole pinned region"),
        (p.narrow(1, 1000), true, "narrow at +1"),
        (p.narrow(4096, 4096), true, "page view"),
        // SAFETY: the memory outlives every op on this desc (each is waited for here).
        (unsafe { BufferDesc::from_raw_parts(p.ptr(), (1 << 16) + 1) }, false, "running past the region"),
        (heap_desc(&mut v), false, "heap"),
        (heap_desc(&mut v).pinned(true), true, "heap declared pinned (torch-pinned)"),
        (p.desc().contiguous(false), false, "non-contiguous pinned"),
        (p.desc().located(Location::OtherDevice), false, "device memory"),
    ];
    for (buf, direct, what) in cases {
        assert_eq!(is_direct_capable(&buf, m), direct, "{what}");
        if !(buf.is_host() && buf.is_contiguous()) || buf.len() > 1 << 16 {
            continue;
        }
        for direction in [Direction::Read, Direction::Write] {
            let op = queued(CpuOp::prepare(request(direction, FileTarget::Path(&path), 0, buf), 1, params, m, Mode::Async, NO_EARLIER_WRITES).unwrap());
            assert_eq!(op.is_direct(), direct, "{what} {direction:?}");
            drop(op);
        }
    }
    // Non-contiguous or device memory without a copier is refused, not guessed at.
    for buf in [p.desc().contiguous(false), p.desc().located(Location::OtherDevice)] {
        let req = request(Direction::Write, FileTarget::Path(&path), 0, buf);
        let e = CpuOp::prepare(req, 1, params, m, Mode::Async, NO_EARLIER_WRITES).err().unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
    // A bounced write leaves the caller's memory alone; a bounced read
    // copies back in wait() only.
    for engine in engines() {
        let h = handle(engine);
        let data = pattern(77, 100_003);
        let mut src = data.clone();
        h.pwrite(heap_desc(&mut src), FileTarget::Path(&path), 5, true).unwrap();
        src.fill(0); // the bounce copy was taken at submission
        assert_eq!(h.wait().unwrap(), 1);
        assert_bytes_eq(&read_file(&path)[5..5 + data.len()], &data, &format!("{engine:?} bounced write"));
        let mut dst = vec![0u8; data.len()];
        h.pread(heap_desc(&mut dst), FileTarget::Path(&path), 5, false).unwrap();
        assert_bytes_eq(&dst, &data, &format!("{engine:?} bounced read"));
    }
}