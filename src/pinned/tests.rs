//! Property tests of the pinned manager's range bookkeeping: random
//! sequences of alloc / free / is_managed / region_of on a private
//! [`PinnedMemoryManager`], checked step by step against a plain model
//! (a list of `(base, requested)` regions).
//!
//! The mappings are real and `mlock`ed, and RLIMIT_MEMLOCK may be as low as
//! 8 MiB: a case keeps at most [`MAX_LIVE`] bytes mapped and frees
//! everything before it ends.

use proptest::prelude::*;

use super::{page_size, PinnedMemoryManager};
use crate::error::Error;

/// The largest single request.
const MAX_ALLOC: usize = 256 << 10;
/// Mapped bytes a case may hold at once.
const MAX_LIVE: usize = 3 << 20;

/// Which address a `free` is given.
#[derive(Clone, Copy, Debug)]
enum FreeAt {
    /// A live region's base.
    Base,
    /// Inside a live region (or just past its mapping), not its base.
    Interior,
    /// A base that was freed before (it may have been handed out again).
    Freed,
    /// Near some region, anywhere.
    Unknown,
}

/// Which range an `is_managed` / `region_of` query asks about.
#[derive(Clone, Copy, Debug)]
enum Range {
    /// A sub-range of a region's requested bytes (possibly empty).
    Inside,
    /// The empty range at a region's base.
    EmptyAtBase,
    /// From inside a region to past its requested end.
    Overrun,
    /// From inside one region into another.
    Span,
    /// After a region's requested end, or just before its base.
    Gap,
    /// Anywhere within a MiB of some region.
    Near,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    /// Which address, and seeds picking the region and offset.
    Free(FreeAt, usize, usize),
    /// Which range, and seeds picking the regions and offsets.
    Query(Range, usize, usize, usize),
}

fn sizes() -> impl Strategy<Value = usize> {
    let page = page_size();
    prop_oneof![
        Just(0usize),
        1..MAX_ALLOC,
        (1..=MAX_ALLOC / page).prop_map(move |k| k * page),
        (1..=16usize, -3isize..=3).prop_map(move |(k, d)| (k * page).saturating_add_signed(d)),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let free_at = prop_oneof![Just(FreeAt::Base), Just(FreeAt::Interior), Just(FreeAt::Freed), Just(FreeAt::Unknown)];
    let range = prop_oneof![
        Just(Range::Inside),
        Just(Range::EmptyAtBase),
        Just(Range::Overrun),
        Just(Range::Span),
        Just(Range::Gap),
        Just(Range::Near),
    ];
    let op = prop_oneof![
        3 => sizes().prop_map(Op::Alloc),
        2 => (free_at, any::<usize>(), any::<usize>()).prop_map(|(f, a, b)| Op::Free(f, a, b)),
        6 => (range, any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(r, a, b, c)| Op::Query(r, a, b, c)),
    ];
    prop::collection::vec(op, 1..48)
}

/// What the manager should know: its live regions as (base, requested),
/// in allocation order, and the bases freed so far.
struct Model {
    page: usize,
    regions: Vec<(usize, usize)>,
    freed: Vec<usize>,
}

impl Model {
    fn mapped(&self, requested: usize) -> usize {
        requested.max(1).div_ceil(self.page) * self.page
    }
    /// A live region, chosen by `seed`.
    fn pick(&self, seed: usize) -> Option<(usize, usize)> {
        (!self.regions.is_empty()).then(|| self.regions[seed % self.regions.len()])
    }
    /// Whole extent inside one region's requested bytes; an empty range
    /// counts when it sits inside (or at either end of) one.
    fn is_managed(&self, start: usize, len: usize) -> bool {
        let Some(end) = start.checked_add(len) else { return false };
        self.regions.iter().any(|&(b, l)| b <= start && end <= b + l)
    }
    /// The region whose requested bytes (at least its first byte) hold `p`.
    fn region_of(&self, p: usize) -> Option<(usize, usize)> {
        self.regions.iter().copied().find(|&(b, l)| b <= p && p < b + l.max(1))
    }
    fn stats(&self) -> (usize, usize, usize) {
        let requested = self.regions.iter().map(|r| r.1).sum();
        let mapped = self.regions.iter().map(|r| self.mapped(r.1)).sum();
        (self.regions.len(), requested, mapped)
    }
    fn live_mapped(&self) -> usize {
        self.stats().2
    }

    /// The address a `free` is given.
    fn free_target(&self, at: FreeAt, a: usize, b: usize) -> usize {
        let near = |seed: usize| self.pick(seed).map_or(seed % (1 << 47), |(base, _)| base);
        match (at, self.pick(a)) {
            (FreeAt::Base, Some((base, _))) => base,
            (FreeAt::Interior, Some((base, l))) => base + 1 + b % (self.mapped(l) + self.page),
            (FreeAt::Freed, _) if !self.freed.is_empty() => self.freed[a % self.freed.len()],
            _ => near(a).wrapping_add(b % (4 << 20)).wrapping_sub(2 << 20),
        }
    }

    /// The `(start, len)` a query asks about.
    fn query_range(&self, range: Range, a: usize, b: usize, c: usize) -> (usize, usize) {
        let Some((base, l)) = self.pick(a) else { return (b % (1 << 47), c % 8192) };
        match range {
            Range::Inside => {
                let (x, y) = (b % (l + 1), c % (l + 1));
                (base + x.min(y), x.abs_diff(y))
            }
            Range::EmptyAtBase => (base, 0),
            Range::Overrun => {
                let start = base + b % (l + 1);
                let end = base + l + 1 + c % (2 * self.page);
                (start, end - start)
            }
            Range::Span if self.regions.len() < 2 => self.query_range(Range::Overrun, a, b, c),
            Range::Span => {
                // A second, different region.
                let n = self.regions.len();
                let (base2, l2) = self.regions[(a % n + 1 + a / n % (n - 1)) % n];
                let ((lo, llo), (hi, lhi)) = if base < base2 { ((base, l), (base2, l2)) } else { ((base2, l2), (base, l)) };
                let start = lo + b % llo.max(1);
                let end = hi + 1 + c % lhi.max(1);
                (start, end - start)
            }
            Range::Gap if b % 2 == 0 => (base + l + c % self.page, b / 2 % 64),
            Range::Gap => (base - 1 - c % self.page, b / 2 % 3),
            Range::Near => (base.wrapping_add(b % (2 << 20)).wrapping_sub(1 << 20), c % 8192),
        }
    }
}

/// Runs `ops` on a fresh manager, checking it against the model after each.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mgr = PinnedMemoryManager::new();
    let mut model = Model { page: page_size(), regions: Vec::new(), freed: Vec::new() };
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc(size) => {
                if model.live_mapped() + model.mapped(size) > MAX_LIVE {
                    continue;
                }
                let base = match mgr.alloc(size) {
                    Ok(p) => p.as_ptr() as usize,
                    // The environment's memlock budget, not the bookkeeping.
                    Err(e @ Error::Lock { .. }) => return Err(TestCaseError::reject(e.to_string())),
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: alloc({size}): {e}"))),
                };
                prop_assert_eq!(base % model.page, 0, "step {}: base {:#x} not page-aligned", step, base);
                prop_assert!(model.region_of(base).is_none(), "step {}: base {:#x} inside a live region", step, base);
                model.regions.push((base, size));
            }
            Op::Free(at, a, b) => {
                let p = model.free_target(at, a, b);
                let expect = model.regions.iter().position(|r| r.0 == p);
                prop_assert_eq!(mgr.free(p as *const u8), expect.is_some(), "step {}: free({:#x}) ({:?})", step, p, at);
                if let Some(i) = expect {
                    model.regions.remove(i);
                    model.freed.push(p);
                }
            }
            Op::Query(range, a, b, c) => {
                let (start, len) = model.query_range(range, a, b, c);
                prop_assert_eq!(
                    mgr.is_managed(start as *const u8, len),
                    model.is_managed(start, len),
                    "step {}: is_managed({:#x}, {}) ({:?}) with regions {:x?}", step, start, len, range, model.regions
                );
                prop_assert_eq!(
                    mgr.region_of(start as *const u8),
                    model.region_of(start),
                    "step {}: region_of({:#x}) ({:?}) with regions {:x?}", step, start, range, model.regions
                );
            }
        }
        prop_assert_eq!(mgr.stats(), model.stats(), "step {}: stats after {:?}", step, op);
    }
    // Free everything (the case's memlock budget), still checking.
    while let Some((base, _)) = model.regions.pop() {
        prop_assert!(mgr.free(base as *const u8), "final free of {:#x}", base);
        // An adjacent live region may still own the empty range at the end of its bytes.
        prop_assert_eq!(mgr.is_managed(base as *const u8, 0), model.is_managed(base, 0));
        prop_assert_eq!(mgr.region_of(base as *const u8), model.region_of(base));
        prop_assert_eq!(mgr.stats(), model.stats());
    }
    prop_assert_eq!(mgr.stats(), (0, 0, 0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// is_managed, region_of, free and stats agree with the model through
    /// any sequence of operations.
    #[test]
    fn the_manager_agrees_with_a_list_of_regions(ops in ops()) {
        run(&ops)?;
    }
}
