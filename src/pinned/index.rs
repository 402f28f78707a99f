//! The address → region index behind `PinnedMemoryManager::is_managed`.
//!
//! `is_managed` runs on every submission (is this tensor page-locked, so
//! that O_DIRECT can use it in place?), and DeepSpeed's swapper keeps
//! thousands of live locked buffers. A `BTreeMap` range lookup costs a
//! cache miss per tree level (about 230 ns at 100,000 regions on the
//! benchmark machine); this index answers in a hash probe and at most one
//! table load, whatever the number of regions, the way a page table does:
//!
//! * the address space is cut into granules of `PAGES_PER_GRANULE` index
//!   pages of 4 KiB (2 MiB); a system page of 64 KiB simply spans 16 index
//!   pages, so the index needs no run-time page size (and stays `const`);
//! * a granule that lies wholly inside one region maps to that region
//!   ([`Granule::Whole`]): a 16 GiB region costs 8,192 entries;
//! * a granule shared by several regions, or only partly covered, keeps one
//!   slot per page ([`Granule::Pages`]), so each region's partial granules
//!   cost at most two small tables.
//!
//! Regions never overlap (each is its own mapping), so a page belongs to at
//! most one region. The index only says which region holds a page; the
//! caller checks the requested (not page-rounded) bounds.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The index page: 4 KiB, the smallest page size of any target, so every
/// mapping is a whole number of index pages.
const PAGE_SHIFT: u32 = 12;
/// Index pages per granule: one granule is 2 MiB (a huge page), and a
/// per-page table has 512 slots.
const PAGES_PER_GRANULE: usize = 512;
const GRANULE_SHIFT: u32 = PAGE_SHIFT + PAGES_PER_GRANULE.trailing_zeros();

/// A multiplicative hash for granule numbers (dense, small integers). The
/// standard SipHash costs more than the rest of the lookup; nothing here is
/// attacker-chosen (the keys are the process's own mapping addresses).
#[derive(Default)]
pub(crate) struct GranuleHasher(u64);

impl Hasher for GranuleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing; fold the high half down so that both the
        // table's index bits (low) and its tag bits (high) vary.
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

enum Granule<V> {
    /// The whole granule lies inside this one region.
    Whole(V),
    /// One slot per page; `used` counts the occupied slots, and the table
    /// goes when it reaches zero.
    Pages { slots: Box<[Option<V>]>, used: usize },
}

/// Which region (a `V`) holds each mapped page.
pub(crate) struct PageIndex<V> {
    granules: HashMap<usize, Granule<V>, BuildHasherDefault<GranuleHasher>>,
}

impl<V> PageIndex<V> {
    /// An empty index.
    pub(crate) const fn new() -> Self {
        PageIndex { granules: HashMap::with_hasher(BuildHasherDefault::new()) }
    }
}

impl<V: Clone> PageIndex<V> {
    /// `(granule, first slot, slot count)` for each granule that the
    /// page-aligned `[base, base + len)` touches.
    fn granules_of(base: usize, len: usize) -> Vec<(usize, usize, usize)> {
        let mut touched = Vec::new();
        if len == 0 {
            return touched;
        }
        let first_page = base >> PAGE_SHIFT;
        let end_page = (base + len - 1) >> PAGE_SHIFT;
        let mut page = first_page;
        while page <= end_page {
            let granule = page / PAGES_PER_GRANULE;
            let slot = page % PAGES_PER_GRANULE;
            let count = (PAGES_PER_GRANULE - slot).min(end_page - page + 1);
            touched.push((granule, slot, count));
            page += count;
        }
        touched
    }

    /// Records that the pages of `[base, base + len)` (page-aligned, not
    /// overlapping any recorded range) belong to `value`.
    pub(crate) fn insert(&mut self, base: usize, len: usize, value: &V) {
        for (granule, slot, count) in Self::granules_of(base, len) {
            if count == PAGES_PER_GRANULE {
                let previous = self.granules.insert(granule, Granule::Whole(value.clone()));
                debug_assert!(previous.is_none(), "regions never overlap");
                continue;
            }
            let entry = self
                .granules
                .entry(granule)
                .or_insert_with(|| Granule::Pages { slots: vec![None; PAGES_PER_GRANULE].into(), used: 0 });
            match entry {
                Granule::Pages { slots, used } => {
                    for s in &mut slots[slot..slot + count] {
                        debug_assert!(s.is_none(), "regions never overlap");
                        *s = Some(value.clone());
                    }
                    *used += count;
                }
                Granule::Whole(_) => debug_assert!(false, "regions never overlap"),
            }
        }
    }

    /// Forgets the pages of `[base, base + len)`, as given to [`Self::insert`].
    pub(crate) fn remove(&mut self, base: usize, len: usize) {
        for (granule, slot, count) in Self::granules_of(base, len) {
            let emptied = match self.granules.get_mut(&granule) {
                Some(Granule::Whole(_)) => true,
                Some(Granule::Pages { slots, used }) => {
                    let cleared = slots[slot..slot + count].iter_mut().filter_map(Option::take).count();
                    *used -= cleared;
                    *used == 0
                }
                None => false,
            };
            if emptied {
                self.granules.remove(&granule);
            }
        }
    }

    /// The value recorded for the page holding `addr`.
    #[inline]
    pub(crate) fn get(&self, addr: usize) -> Option<&V> {
        match self.granules.get(&(addr >> GRANULE_SHIFT))? {
            Granule::Whole(v) => Some(v),
            Granule::Pages { slots, .. } => slots[(addr >> PAGE_SHIFT) % PAGES_PER_GRANULE].as_ref(),
        }
    }

    /// Number of granule entries (for tests: the index must not leak).
    #[cfg(test)]
    pub(crate) fn granule_count(&self) -> usize {
        self.granules.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const GRANULE: usize = PAGE * PAGES_PER_GRANULE;

    #[test]
    fn pages_map_to_their_region_and_nothing_else() {
        let mut index = PageIndex::new();
        // One region spanning a partial granule, two whole ones and another partial one.
        let a = (GRANULE - 3 * PAGE, 3 * PAGE + 2 * GRANULE + 5 * PAGE);
        // A one-page neighbour just after it, in the same (partial) granule.
        let b = (a.0 + a.1, PAGE);
        index.insert(a.0, a.1, &'a');
        index.insert(b.0, b.1, &'b');
        assert_eq!(index.get(a.0), Some(&'a'));
        assert_eq!(index.get(a.0 + GRANULE), Some(&'a'));
        assert_eq!(index.get(a.0 + a.1 - 1), Some(&'a'));
        assert_eq!(index.get(b.0), Some(&'b'));
        assert_eq!(index.get(b.0 + PAGE), None);
        assert_eq!(index.get(a.0 - 1), None);
        assert_eq!(index.granule_count(), 4);
        index.remove(a.0, a.1);
        assert_eq!(index.get(a.0 + GRANULE), None);
        assert_eq!(index.get(b.0), Some(&'b'));
        assert_eq!(index.granule_count(), 1, "the shared granule stays for b only");
        index.remove(b.0, b.1);
        assert_eq!(index.granule_count(), 0, "nothing leaks");
    }
}
