//! Slice planning on fixed cases; `proptest` cases cover the general rule.

use super::*;
use crate::file::DioAlignment;

const DIO: DioAlignment = DioAlignment { offset: 512, memory: 512 };

fn covered(slices: &[SlicePlan]) -> Vec<(u64, usize)> {
    let mut v: Vec<_> = slices.iter().flat_map(|s| s.buffered.iter().chain(&s.direct)).map(|g| (g.file_offset, g.len)).collect();
    v.sort();
    v
}

#[test]
fn a_page_aligned_op_goes_direct_in_page_aligned_slices() {
    let page = page_size();
    let base = (16 * page) as *mut u8;
    let slices = plan_slices(0, base, 8 * page, 4, Some((3, DIO)), BUFFERED_FD_PLACEHOLDER);
    assert_eq!(slices.len(), 4);
    assert!(!needs_buffered(&slices));
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s.direct.len(), 1);
        assert_eq!(s.direct[0].file_offset, (i * 2 * page) as u64);
        assert_eq!(s.direct[0].fd, 3);
    }
}

#[test]
fn unaligned_edges_go_buffered_and_are_patched_to_the_opened_fd() {
    let page = page_size();
    let base = (16 * page + 100) as *mut u8;
    let mut slices = plan_slices(100, base, 3 * page, 1, Some((3, DIO)), BUFFERED_FD_PLACEHOLDER);
    assert!(needs_buffered(&slices));
    patch_buffered_fd(&mut slices, 9);
    let s = &slices[0];
    assert_eq!(s.buffered.iter().map(|g| (g.fd, g.file_offset, g.len)).collect::<Vec<_>>(),
               vec![(9, 100, page - 100), (9, 3 * page as u64, 100)]);
    assert_eq!((s.direct[0].file_offset, s.direct[0].len), (page as u64, 2 * page));
    assert_eq!(covered(&slices).iter().map(|c| c.1).sum::<usize>(), 3 * page);
}

#[test]
fn without_o_direct_everything_is_buffered() {
    let slices = plan_slices(7, 0x1000 as *mut u8, 10_000, 3, None, 5);
    assert!(slices.iter().all(|s| s.direct.is_empty()));
    assert_eq!(slices.iter().map(SlicePlan::bytes).sum::<usize>(), 10_000);
}

// ---------------------------------------------------------------------------
// Properties: the rules above, over random geometry.
// ---------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// The direct descriptor in the generated plans (buffered segments get
    /// `BUFFERED_FD_PLACEHOLDER`).
    const DIRECT_FD: RawFd = 3;
    const TIB: u64 = 1 << 40;
    const MAX_LEN: usize = 64 << 20;

    /// One planning problem.
    #[derive(Clone, Debug)]
    struct Case {
        file_offset: u64,
        base: usize,
        len: usize,
        parallelism: usize,
        dio: Option<DioAlignment>,
    }

    impl Case {
        fn direct(&self) -> Option<(RawFd, DioAlignment)> {
            self.dio.map(|a| (DIRECT_FD, a))
        }
        fn plan(&self) -> Vec<SlicePlan> {
            plan_slices(self.file_offset, self.base as *mut u8, self.len, self.parallelism, self.direct(), BUFFERED_FD_PLACEHOLDER)
        }
        fn end(&self) -> u64 {
            self.file_offset + self.len as u64
        }
    }

    /// Values near multiples of `unit` (±600 bytes), or anywhere below `max`.
    fn near_multiples(max: u64, unit: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            0..max,
            (0..max / unit, -600i64..=600).prop_map(move |(k, d)| (k * unit).saturating_add_signed(d).min(max - 1)),
            (0..max / 512).prop_map(|k| k * 512),
        ]
    }

    fn file_offsets() -> impl Strategy<Value = u64> {
        near_multiples(TIB, page_size() as u64)
    }

    fn lens() -> impl Strategy<Value = usize> {
        let page = page_size() as u64;
        prop_oneof![
            near_multiples(MAX_LEN as u64, page).prop_map(|v| v as usize),
            (0..4 * page).prop_map(|v| v as usize),
            (0..=64usize).prop_map(move |k| k * page as usize),
        ]
    }

    fn alignments() -> impl Strategy<Value = DioAlignment> {
        (prop::sample::select(vec![512usize, 4096]), prop::sample::select(vec![512usize, 4096]))
            .prop_map(|(offset, memory)| DioAlignment { offset, memory })
    }

    /// How far the buffer's address is from a page boundary.
    #[derive(Clone, Copy, Debug)]
    enum Skew {
        /// Any skew.
        Random(usize),
        /// In step with the file: `file_offset % page`.
        InStep,
        /// In step with the file, shifted by a multiple of 512.
        InStepPlus512s(usize),
    }

    fn cases_with(dio: impl Strategy<Value = Option<DioAlignment>>) -> impl Strategy<Value = Case> {
        let page = page_size();
        let skew = prop_oneof![
            (0..page).prop_map(Skew::Random),
            Just(Skew::InStep),
            (1..page / 512).prop_map(Skew::InStepPlus512s),
        ];
        // A page-aligned base in the low address space; planning does
        // address arithmetic only, never dereferences.
        (file_offsets(), lens(), 1usize..=16, 1usize..(1 << 20), skew, dio).prop_map(
            move |(file_offset, len, parallelism, base_page, skew, dio)| {
                let in_step = (file_offset % page as u64) as usize;
                let skew = match skew {
                    Skew::Random(s) => s,
                    Skew::InStep => in_step,
                    Skew::InStepPlus512s(k) => (in_step + 512 * k) % page,
                };
                Case { file_offset, base: base_page * page + skew, len, parallelism, dio }
            },
        )
    }

    fn cases() -> impl Strategy<Value = Case> {
        cases_with(prop::option::weighted(0.8, alignments()))
    }

    fn segments(slices: &[SlicePlan]) -> impl Iterator<Item = &Segment> {
        slices.iter().flat_map(|s| s.buffered.iter().chain(&s.direct))
    }

    /// The file range a slice covers (its segments are contiguous), or None
    /// when it is empty.
    fn extent(s: &SlicePlan) -> Option<(u64, u64)> {
        let segs = || s.buffered.iter().chain(&s.direct);
        let start = segs().map(|g| g.file_offset).min()?;
        let end = segs().map(|g| g.file_offset + g.len as u64).max()?;
        Some((start, end))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The segments of all slices tile [file_offset, file_offset + len):
        /// no empty segment, no gap, no overlap, nothing outside.
        #[test]
        fn segments_cover_the_range_exactly_once(c in cases()) {
            let slices = c.plan();
            let mut segs: Vec<(u64, usize)> = segments(&slices).map(|g| (g.file_offset, g.len)).collect();
            segs.sort_unstable();
            let mut at = c.file_offset;
            for &(off, len) in &segs {
                prop_assert!(len > 0, "empty segment at {off}");
                prop_assert_eq!(off, at, "gap or overlap at {}", at);
                at = off + len as u64;
            }
            prop_assert_eq!(at, c.end(), "coverage stops short of or runs past the end");
            prop_assert_eq!(segs.iter().map(|s| s.1).sum::<usize>(), c.len);
            prop_assert_eq!(slices.iter().map(SlicePlan::bytes).sum::<usize>(), c.len);
        }

        /// Every segment's memory is the caller's buffer at the same offset
        /// as its file bytes.
        #[test]
        fn memory_and_file_stay_in_step(c in cases()) {
            for g in segments(&c.plan()) {
                prop_assert_eq!(
                    (g.addr as usize).wrapping_sub(c.base) as u64,
                    g.file_offset - c.file_offset,
                    "segment at file offset {} has address {:#x}", g.file_offset, g.addr as usize
                );
            }
        }

        /// Direct segments start and end on the grain (a page, or the
        /// O_DIRECT offset alignment when larger) and sit at addresses
        /// aligned for O_DIRECT memory. A slice's buffered segments are
        /// only its head and tail around one direct body (each shorter than
        /// a grain), or the whole slice; and the body goes direct whenever
        /// the slice holds a whole grain unit whose memory is aligned.
        #[test]
        fn direct_bodies_are_aligned_and_buffered_bytes_only_at_the_edges(c in cases()) {
            let Some(a) = c.dio else { return Ok(()) };
            let g = grain(Some(a));
            prop_assert_eq!(g, page_size().max(a.offset) as u64);
            for (i, s) in c.plan().iter().enumerate() {
                let Some((start, end)) = extent(s) else { continue };
                for d in &s.direct {
                    prop_assert_eq!(d.fd, DIRECT_FD);
                    prop_assert!(d.file_offset % g == 0 && (d.file_offset + d.len as u64) % g == 0,
                        "slice {}: direct [{}, +{}) is not on the {}-byte grain", i, d.file_offset, d.len, g);
                    prop_assert!(d.addr as usize % a.memory == 0,
                        "slice {}: direct address {:#x} not {}-aligned", i, d.addr as usize, a.memory);
                }
                match s.direct.as_slice() {
                    [] => {
                        prop_assert_eq!(s.buffered.len(), 1, "slice {}: a buffered slice is one segment", i);
                        // Buffered as a whole: it holds no whole grain unit, or
                        // the memory at its first one is misaligned.
                        let body = start.div_ceil(g) * g;
                        let body_end = end / g * g;
                        let body_mem = c.base as u64 + (body - c.file_offset);
                        prop_assert!(body >= body_end || body_mem % a.memory as u64 != 0,
                            "slice {} [{}, {}) could have gone direct from {}", i, start, end, body);
                    }
                    [d] => {
                        let (ds, de) = (d.file_offset, d.file_offset + d.len as u64);
                        for b in &s.buffered {
                            let (bs, be) = (b.file_offset, b.file_offset + b.len as u64);
                            let head = bs == start && be == ds;
                            let tail = bs == de && be == end;
                            prop_assert!(head || tail, "slice {}: buffered [{}, {}) is neither head nor tail of [{}, {})", i, bs, be, start, end);
                            prop_assert!((b.len as u64) < g, "slice {}: buffered edge of {} bytes holds a whole grain", i, b.len);
                        }
                        prop_assert!(s.buffered.len() <= 2);
                    }
                    more => prop_assert!(false, "slice {}: {} direct segments", i, more.len()),
                }
            }
        }

        /// No page (grain unit) has bytes in two slices: every inner
        /// boundary between non-empty slices is a multiple of the grain.
        #[test]
        fn workers_never_share_a_page(c in cases()) {
            let g = grain(c.dio);
            let extents: Vec<(u64, u64)> = c.plan().iter().filter_map(extent).collect();
            for w in extents.windows(2) {
                let ((_, end), (start, _)) = (w[0], w[1]);
                prop_assert_eq!(end, start);
                prop_assert!(start % g == 0, "inner boundary {} is not a multiple of {}", start, g);
                prop_assert!((end - 1) / g < start / g, "grain unit {} is in two slices", start / g);
            }
        }

        /// Exactly `parallelism` slices (some possibly empty), in file order.
        #[test]
        fn one_slice_per_worker_in_file_order(c in cases()) {
            let slices = c.plan();
            prop_assert_eq!(slices.len(), c.parallelism);
            let mut at = c.file_offset;
            for (i, s) in slices.iter().enumerate() {
                if let Some((start, end)) = extent(s) {
                    prop_assert!(start >= at, "slice {} starts at {} before the previous one ends at {}", i, start, at);
                    at = end;
                }
            }
        }

        /// `needs_buffered` says whether any slice has buffered segments, and
        /// patching leaves no placeholder fd and the direct fd untouched.
        #[test]
        fn needs_buffered_and_patching_agree_with_the_segments(c in cases()) {
            let mut slices = c.plan();
            let any_buffered = slices.iter().any(|s| !s.buffered.is_empty());
            prop_assert_eq!(needs_buffered(&slices), any_buffered);
            for s in &slices {
                prop_assert!(s.buffered.iter().all(|g| g.fd == BUFFERED_FD_PLACEHOLDER));
            }
            let before = slices.clone();
            patch_buffered_fd(&mut slices, 9);
            for (s, b) in slices.iter().zip(&before) {
                prop_assert!(s.buffered.iter().all(|g| g.fd == 9), "a buffered segment kept its fd");
                prop_assert_eq!(&s.direct, &b.direct, "patching touched a direct segment");
                prop_assert_eq!(s.buffered.iter().map(|g| (g.file_offset, g.len)).collect::<Vec<_>>(),
                                b.buffered.iter().map(|g| (g.file_offset, g.len)).collect::<Vec<_>>());
            }
            prop_assert!(segments(&slices).all(|g| g.fd != BUFFERED_FD_PLACEHOLDER));
        }

        /// Without O_DIRECT every byte is buffered, one segment per non-empty slice.
        #[test]
        fn without_o_direct_nothing_is_direct(c in cases_with(Just(None))) {
            let slices = c.plan();
            prop_assert!(slices.iter().all(|s| s.direct.is_empty()));
            prop_assert!(slices.iter().all(|s| s.buffered.len() <= 1));
            prop_assert_eq!(needs_buffered(&slices), c.len > 0);
        }
    }
}
