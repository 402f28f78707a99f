//! Both engines through every knob combination: single_submit ×
//! overlap_events × block sizes (unaligned, smaller and larger than the
//! transfer) × queue depths × intra_op_parallelism, on real O_DIRECT files.
//! Every byte of the file and of the read-back buffer is checked. Also the
//! engines on their own (segments, short reads at EOF) and the
//! divisibility rule of parallel ops.

use crate::common::*;
// Whole requests and read/write (transfer_inline): DeepSpeed's calls.
use deepnvme::test_support::calls as ds;
use deepnvme::{Direction, EngineKind, Error, FileTarget, HandleConfig};

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
    let n = h.write_from(src.as_slice(), FileTarget::Path(&path), offset as u64).unwrap_or_else(|e| panic!("{name}: write: {e}"));
    assert_eq!(n, 1, "{name}: sync write returns the number of completed ops");

    let mut want = old.clone();
    want[offset..offset + len].copy_from_slice(&data);
    assert_bytes_eq(&read_file(&path), &want, &format!("{name}: file after write at {offset}"));

    // Read back into pinned memory (direct) and into heap memory (bounce).
    let mut dst = Pinned::new(len);
    assert_eq!(h.read_into(dst.as_mut_slice(), FileTarget::Path(&path), offset as u64).unwrap(), 1);
    assert_bytes_eq(dst.as_slice(), &data, &format!("{name}: pinned read at {offset}"));
    let mut heap = vec![0xEEu8; len];
    let heap_off = file_len - len; // runs to the exact end of the file
    assert_eq!(h.read_into(&mut heap, FileTarget::Path(&path), heap_off as u64).unwrap(), 1);
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
    let knobs = DeepSpeedKnobs {
        block_size: 1000,
        queue_depth: 2,
        single_submit: true,
        overlap_events: true,
        intra_op_parallelism: 3,
        use_gds: false,
    };
    let cfg = knobs.config().unwrap();
    assert_eq!(
        (cfg.block_size, cfg.queue_depth, cfg.single_submit, cfg.overlap_events, cfg.intra_op_parallelism),
        (1000, 2, true, true, 3)
    );
    assert_eq!(cfg.alignment(), 3 * 512, "get_alignment() = intra_op_parallelism * 512");
    for (bs, qd, p) in [(0, 1, 1), (1, 0, 1), (1, 1, 0), (-1, 1, 1), (1, 1, -4)] {
        let bad = DeepSpeedKnobs { block_size: bs, queue_depth: qd, intra_op_parallelism: p, ..DeepSpeedKnobs::default() };
        let e = bad.config().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bs} {qd} {p}: {e}");
        assert!(e.to_string().contains("must be positive"), "{e}");
    }
    let d = HandleConfig::default();
    assert_eq!(DeepSpeedKnobs::default().config().unwrap(), d, "aio_handle()'s defaults are HandleConfig's");
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
                let e = ds::submit(&h, req, false).unwrap_err();
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
            ds::transfer_inline(&h, request(Direction::Read, FileTarget::Path(&path), 7, buf.desc())).unwrap();
            assert_bytes_eq(buf.as_slice(), &pattern(3, 8192)[7..7 + len], "inline read of an indivisible length");
        }
    }
    // Nothing was written by the refused writes.
    assert_bytes_eq(&read_file(&path), &pattern(3, 8192), "file untouched by refused ops");
}

