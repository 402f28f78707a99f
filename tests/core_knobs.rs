//! Both engines through every knob combination: single_submit ×
//! overlap_events × block sizes (unaligned, smaller and larger than the
//! transfer) × queue depths × intra_op_parallelism, on real O_DIRECT files.
//! Every byte of the file and of the read-back buffer is checked. Also the
//! engines on their own (segments, short reads at EOF) and the
//! divisibility rule of parallel ops.

mod common;

use common::*;
use deepnvme::engine::{self, Knobs, Segment};
use deepnvme::op::CpuOp;
use deepnvme::pinned::page_size;
use deepnvme::{Direction, EngineKind, Error, FileTarget, HandleConfig, PinnedMemoryManager};

/// Transfer lengths: divisible by 1, 2, 3 and 4, not multiples of 512.
/// Block sizes up to 1000 use the shorter one (hundreds of pieces already).
const LEN: usize = 12 * 5461; // 65532
const SHORT_LEN: usize = 12 * 1366; // 16392

#[derive(Debug, Clone, Copy)]
struct Combo {
    engine: EngineKind,
    block_size: usize,
    queue_depth: usize,
    single_submit: bool,
    overlap_events: bool,
    par: usize,
}

fn run_combo(dir: &TempDir, c: Combo, idx: usize) {
    let name = format!("{c:?}");
    let path = dir.file(&format!("combo-{idx}.bin"));
    // Write at an aligned offset, an unaligned one, and the start of the file.
    let offset = [0usize, 4096, 513, 1][idx % 4];
    let len = if c.block_size <= 1000 { SHORT_LEN } else { LEN };
    let file_len = offset + len + 3000;
    let old = pattern(idx as u64 * 7 + 1, file_len);
    write_file(&path, &old);

    let h = handle_with(c.engine, c.block_size, c.queue_depth, c.single_submit, c.overlap_events, c.par);
    assert_eq!(h.engine_kind(), c.engine);
    let data = pattern(idx as u64 * 7 + 2, len);
    let src = Pinned::with(&data);
    let n = h.pwrite(src.desc(), FileTarget::Path(&path), offset as i64, false).unwrap_or_else(|e| panic!("{name}: write: {e}"));
    assert_eq!(n, 1, "{name}: sync write returns the number of completed ops");

    let mut want = old.clone();
    want[offset..offset + len].copy_from_slice(&data);
    assert_bytes_eq(&read_file(&path), &want, &format!("{name}: file after write at {offset}"));

    // Read back into pinned memory (direct) and into heap memory (bounce).
    let dst = Pinned::new(len);
    assert_eq!(h.pread(dst.desc(), FileTarget::Path(&path), offset as i64, false).unwrap(), 1);
    assert_bytes_eq(dst.as_slice(), &data, &format!("{name}: pinned read at {offset}"));
    let mut heap = vec![0xEEu8; len];
    let heap_off = file_len - len; // runs to the exact end of the file
    assert_eq!(h.pread(heap_desc(&mut heap), FileTarget::Path(&path), heap_off as i64, false).unwrap(), 1);
    assert_bytes_eq(&heap, &want[heap_off..], &format!("{name}: heap read at {heap_off}"));
}

#[test]
fn knob_matrix_both_engines_every_byte() {
    let dir = TempDir::new("knobs");
    let mut idx = 0;
    let t0 = std::time::Instant::now();
    for engine in engines() {
        for single_submit in [false, true] {
            for overlap_events in [false, true] {
                // 512: the O_DIRECT unit; 1000: not a multiple of 512;
                // 4096: a page; 1 MiB: larger than the whole transfer.
                for block_size in [512usize, 1000, 4096, 1 << 20] {
                    for queue_depth in [1usize, 2, 32] {
                        for par in [1usize, 2, 3, 4] {
                            let c = Combo { engine, block_size, queue_depth, single_submit, overlap_events, par };
                            run_combo(&dir, c, idx);
                            idx += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{idx} knob combinations in {:?}", t0.elapsed());
}

#[test]
fn handle_getters_return_the_knobs() {
    let cfg = HandleConfig::from_deepspeed(1000, 2, true, true, 3).unwrap();
    assert_eq!(
        (cfg.block_size, cfg.queue_depth, cfg.single_submit, cfg.overlap_events, cfg.intra_op_parallelism),
        (1000, 2, true, true, 3)
    );
    assert_eq!(cfg.alignment(), 3 * 512, "get_alignment() = intra_op_parallelism * 512");
    for (bs, qd, p) in [(0, 1, 1), (1, 0, 1), (1, 1, 0), (-1, 1, 1), (1, 1, -4)] {
        let e = HandleConfig::from_deepspeed(bs, qd, false, false, p).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bs} {qd} {p}: {e}");
        assert!(e.to_string().contains("must be positive"), "{e}");
    }
    let d = HandleConfig::default();
    assert_eq!((d.block_size, d.queue_depth, d.single_submit, d.overlap_events, d.intra_op_parallelism), (1 << 20, 128, false, false, 1));
}

#[test]
fn parallel_ops_require_len_divisible_by_parallelism() {
    let dir = TempDir::new("divisible");
    let path = dir.file("f.bin");
    write_file(&path, &pattern(3, 8192));
    for engine in engines() {
        for (par, len) in [(2usize, 1001usize), (3, 1000), (4, 1002), (4, 4097)] {
            let h = handle_with(engine, 4096, 8, false, false, par);
            let buf = Pinned::new(len);
            for direction in [Direction::Read, Direction::Write] {
                let req = request(direction, FileTarget::Path(&path), 7, buf.desc());
                let e = h.submit(req, false).unwrap_err();
                assert!(matches!(e, Error::InvalidArgument(_)), "{engine:?} p={par} len={len}: {e}");
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("{len} bytes"))
                        && msg.contains(&format!("intra_op_parallelism = {par}"))
                        && msg.contains("offset 7")
                        && msg.contains(&path.display().to_string()),
                    "message must name size, parallelism, offset and file: {msg}"
                );
                assert_eq!(h.pending_ops(), 0, "a refused op is not pending");
            }
            // The same length through the unsplit path is fine.
            h.transfer_inline(request(Direction::Read, FileTarget::Path(&path), 7, buf.desc())).unwrap();
            assert_bytes_eq(buf.as_slice(), &pattern(3, 8192)[7..7 + len], "inline read of an indivisible length");
        }
    }
    // Nothing was written by the refused writes.
    assert_bytes_eq(&read_file(&path), &pattern(3, 8192), "file untouched by refused ops");
}

#[test]
fn slices_are_page_aligned_inside_and_aligned_pinned_ops_go_direct() {
    let dir = TempDir::new("plan");
    let path = dir.file("f.bin");
    write_file(&path, &vec![0u8; 1 << 20]);
    let m = PinnedMemoryManager::shared();
    let knobs = Knobs { block_size: 4096, queue_depth: 4, single_submit: false, overlap_events: false };
    for par in 1..=4usize {
        let len = 12 * 4096 * 5;
        let buf = Pinned::new(len);
        let op = CpuOp::prepare(request(Direction::Read, FileTarget::Path(&path), 8192, buf.desc()), par, knobs, m).unwrap();
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
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        assert!(flags & libc::O_DIRECT != 0, "the test directory must support O_DIRECT");
        // Block size rounded to the O_DIRECT unit for the direct segments.
        assert_eq!(plan.direct_knobs.block_size % 512, 0);
        let mut op = op;
        deepnvme::handle::OpCompletion::finish(&mut op, Ok(())).unwrap();
    }
    // An unaligned op whose memory is misaligned like its file offset (a
    // narrow at +1 written at offset 1): direct body, buffered edges.
    let buf = Pinned::new(10_001);
    let op = CpuOp::prepare(
        request(Direction::Write, FileTarget::Path(&path), 1, buf.narrow(1, 10_000)),
        1,
        Knobs { block_size: 1000, ..knobs },
        m,
    )
    .unwrap();
    let s = &op.plan().slices[0];
    assert_eq!(s.buffered.len(), 2, "head and tail go buffered: {s:?}");
    assert_eq!(s.direct.len(), 1);
    assert_eq!(s.direct[0].file_offset % 512, 0);
    assert_eq!(op.plan().direct_knobs.block_size, 512, "block 1000 rounds down to 512 for O_DIRECT");
    drop(op);
    // Memory misaligned differently from the file offset cannot go direct:
    // the whole slice goes buffered (never a failing O_DIRECT request).
    let op = CpuOp::prepare(request(Direction::Write, FileTarget::Path(&path), 1, buf.narrow(0, 10_000)), 1, knobs, m).unwrap();
    let s = &op.plan().slices[0];
    assert!(s.direct.is_empty() && s.buffered.len() == 1 && s.buffered[0].len == 10_000, "{s:?}");
    drop(op);
}

/// Opens `path` for the engine tests: O_DIRECT or buffered.
fn fd_for(path: &std::path::Path, write: bool, direct: bool) -> i32 {
    let mut flags = if write { libc::O_WRONLY | libc::O_CREAT } else { libc::O_RDONLY };
    if direct {
        flags |= libc::O_DIRECT;
    }
    open_fd(path, flags)
}

#[test]
fn engines_move_many_segments_with_every_knob() {
    let dir = TempDir::new("engine");
    let len = 300_000usize;
    for kind in engines() {
        for (direct, block) in [(false, 1000usize), (false, 77_777), (true, 4096), (true, 512), (true, 1 << 20)] {
            for qd in [1usize, 2, 32] {
                for (ss, oe) in [(false, false), (false, true), (true, false), (true, true)] {
                    let path = dir.file(&format!("{kind:?}-{direct}-{block}-{qd}-{ss}-{oe}.bin"));
                    let data = pattern(block as u64 ^ qd as u64, len);
                    let src = Pinned::with(&data);
                    let knobs = Knobs { block_size: block, queue_depth: qd, single_submit: ss, overlap_events: oe };
                    let mut eng = engine::create(kind, qd).unwrap();
                    assert_eq!(eng.kind(), kind);
                    // Three segments out of order in the file, 4 KiB aligned
                    // (O_DIRECT) or odd (buffered).
                    let cut = if direct { [0usize, 4096 * 20, 4096 * 50, len - len % 4096] } else { [0, 1, 99_999, len] };
                    let segs = |fd: i32, base: *mut u8| -> Vec<Segment> {
                        [2usize, 0, 1]
                            .iter()
                            .map(|&i| Segment {
                                fd,
                                file_offset: cut[i] as u64,
                                addr: unsafe { base.add(cut[i]) },
                                len: cut[i + 1] - cut[i],
                            })
                            .collect()
                    };
                    let total = cut[3];
                    let wfd = fd_for(&path, true, direct);
                    eng.run(Direction::Write, &segs(wfd, src.ptr()), &knobs).unwrap();
                    close_fd(wfd);
                    assert_bytes_eq(&read_file(&path), &data[..total], &format!("{kind:?} write {knobs:?} direct={direct}"));
                    let dst = Pinned::new(len);
                    let rfd = fd_for(&path, false, direct);
                    eng.run(Direction::Read, &segs(rfd, dst.ptr()), &knobs).unwrap();
                    close_fd(rfd);
                    assert_bytes_eq(&dst.as_slice()[..total], &data[..total], &format!("{kind:?} read {knobs:?}"));
                }
            }
        }
    }
}

#[test]
fn engines_report_end_of_file_as_enodata_with_offset() {
    let dir = TempDir::new("eof");
    let path = dir.file("short.bin");
    write_file(&path, &pattern(9, 10_000));
    for kind in engines() {
        for (ss, oe) in [(false, false), (true, true)] {
            let mut eng = engine::create(kind, 4).unwrap();
            let dst = Pinned::new(20_000);
            let fd = open_fd(&path, libc::O_RDONLY);
            let knobs = Knobs { block_size: 3000, queue_depth: 4, single_submit: ss, overlap_events: oe };
            let seg = Segment { fd, file_offset: 0, addr: dst.ptr(), len: 20_000 };
            let e = eng.run(Direction::Read, &[seg], &knobs).unwrap_err();
            close_fd(fd);
            assert_eq!(e.errno, libc::ENODATA, "{kind:?}: {e}");
            assert!(e.file_offset >= 10_000 && e.file_offset < 20_000, "{kind:?}: offset of the missing bytes: {e}");
            let msg = e.to_string();
            assert!(msg.contains("end of file") && msg.contains(&format!("fd {fd}")), "{kind:?}: {msg}");
            // io_uring had the first pieces in flight together; they completed.
            // (psync threads may stop before taking them: no claim there.)
            if kind == EngineKind::Uring {
                assert_bytes_eq(&dst.as_slice()[..9000], &pattern(9, 10_000)[..9000], "bytes before EOF");
            }
        }
    }
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
        let knobs = Knobs { block_size: 4096, queue_depth: 4, single_submit: false, overlap_events: false };
        let req = request(direction, FileTarget::Path(&path), off as i64, region.narrow(skew, len));
        let op = CpuOp::prepare(req, par, knobs, m).unwrap();
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
