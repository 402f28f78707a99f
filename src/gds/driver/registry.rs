//! The process-wide table of device buffers registered with cuFile
//! (`cuFileBufRegister`), keyed by base address.
//!
//! Finding the registered region that holds `[ptr, ptr + len)` is one
//! `BTreeMap` range query (O(log n)), where DeepSpeed scanned a set per
//! device. The table does the bookkeeping; the cuFile calls go through a
//! [`Registrar`], so the rules below are tested without a GPU.
//!
//! Rules:
//! * registering exactly the same region again (same base, same length) is a
//!   no-op that succeeds: pinning a tensor twice is harmless;
//! * a region that overlaps a registered one in any other way is refused,
//!   naming the registered region (deregister it first);
//! * deregistering a pointer that is not registered is a no-op that returns
//!   `false`; deregistering from inside a region (not its base) is refused;
//! * a null pointer, a zero length or a range that wraps the address space
//!   is refused.

use std::collections::BTreeMap;

use crate::gds::error::GdsError;
use crate::gds::region::Region;

/// The cuFile side of registration.
pub(crate) trait Registrar {
    /// The device that owns the memory at `ptr`.
    fn device_of(&self, ptr: u64) -> Result<i32, GdsError>;
    /// `cuFileBufRegister(ptr, len)` with device `device`'s context current.
    fn register(&self, ptr: u64, len: usize, device: i32) -> Result<(), GdsError>;
    /// `cuFileBufDeregister(ptr)` with device `device`'s context current.
    fn deregister(&self, ptr: u64, device: i32) -> Result<(), GdsError>;
}

/// Where a buffer lies inside a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionHit {
    /// The region's base: the `devPtr_base` cuFile wants.
    pub base: u64,
    /// The buffer's offset from that base: `devPtr_offset`.
    pub offset: u64,
    pub device: i32,
}

/// What [`RegionMap::register`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegisterOutcome {
    Registered,
    /// The same region was registered already; nothing was done.
    AlreadyRegistered,
}

fn checked_end(ptr: u64, len: usize) -> Result<u64, GdsError> {
    let end = ptr.checked_add(len as u64).filter(|_| ptr != 0 && len != 0);
    end.ok_or(GdsError::InvalidBuffer { ptr, len })
}

/// The table.
#[derive(Debug, Default)]
pub(crate) struct RegionMap {
    regions: BTreeMap<u64, Region>,
}

impl RegionMap {
    pub fn new() -> RegionMap {
        RegionMap::default()
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The registered region that wholly holds `[ptr, ptr + len)`, if any.
    /// A zero-length buffer is held by the region that holds `ptr`.
    pub fn holding(&self, ptr: u64, len: usize) -> Option<Region> {
        let end = ptr.checked_add(len as u64)?;
        let (_, r) = self.regions.range(..=ptr).next_back()?;
        (ptr < r.end() && end <= r.end()).then_some(*r)
    }

    /// Where `[ptr, ptr + len)` lies in the region that wholly holds it, if
    /// any (see [`RegionMap::holding`]).
    pub fn lookup(&self, ptr: u64, len: usize) -> Option<RegionHit> {
        self.holding(ptr, len).map(|r| RegionHit { base: r.base, offset: ptr - r.base, device: r.device })
    }

    /// The registered region overlapping `[ptr, end)`, if any.
    fn overlapping(&self, ptr: u64, end: u64) -> Option<&Region> {
        // The last region starting before `end` is the only candidate: regions do not overlap each other.
        let (_, r) = self.regions.range(..end).next_back()?;
        (r.end() > ptr).then_some(r)
    }

    /// Registers `[ptr, ptr + len)` (see the module rules).
    pub(crate) fn register(
        &mut self,
        registrar: &dyn Registrar,
        ptr: u64,
        len: usize,
    ) -> Result<RegisterOutcome, GdsError> {
        let end = checked_end(ptr, len)?;
        if let Some(r) = self.overlapping(ptr, end) {
            if r.base == ptr && r.len == len {
                return Ok(RegisterOutcome::AlreadyRegistered);
            }
            return Err(GdsError::Overlap { ptr, len, registered: *r });
        }
        let device = registrar.device_of(ptr)?;
        registrar.register(ptr, len, device)?;
        self.regions.insert(ptr, Region { base: ptr, len, device });
        Ok(RegisterOutcome::Registered)
    }

    /// Deregisters the region based at `ptr`. `Ok(false)`: nothing was
    /// registered there. When cuFile refuses, the region is still dropped
    /// from the table (cuFile no longer knows it either) and the error returned.
    pub(crate) fn deregister(&mut self, registrar: &dyn Registrar, ptr: u64) -> Result<bool, GdsError> {
        let Some(region) = self.regions.get(&ptr).copied() else {
            if let Some(hit) = self.lookup(ptr, 0) {
                return Err(GdsError::NotBase { ptr, base: hit.base, offset: hit.offset });
            }
            return Ok(false);
        };
        self.regions.remove(&ptr);
        registrar.deregister(ptr, region.device)?;
        Ok(true)
    }

    /// Deregisters everything (when the driver closes). Returns one error
    /// per region cuFile refused.
    pub(crate) fn clear(&mut self, registrar: &dyn Registrar) -> Vec<GdsError> {
        let regions = std::mem::take(&mut self.regions);
        regions.values().filter_map(|r| registrar.deregister(r.base, r.device).err()).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rt::sync::Mutex;

    /// Records calls; device = (ptr >> 40); fails where told to.
    #[derive(Default)]
    pub(crate) struct FakeRegistrar {
        pub calls: Mutex<Vec<String>>,
        pub fail_register: Mutex<Option<GdsError>>,
        pub fail_deregister: Mutex<Option<GdsError>>,
    }

    impl Registrar for FakeRegistrar {
        fn device_of(&self, ptr: u64) -> Result<i32, GdsError> {
            Ok((ptr >> 40) as i32)
        }
        fn register(&self, ptr: u64, len: usize, device: i32) -> Result<(), GdsError> {
            self.calls.lock().push(format!("reg {ptr:#x} {len} d{device}"));
            match self.fail_register.lock().clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
        fn deregister(&self, ptr: u64, device: i32) -> Result<(), GdsError> {
            self.calls.lock().push(format!("dereg {ptr:#x} d{device}"));
            match self.fail_deregister.lock().clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }

    const A: u64 = 0x7f00_0000_0000;
    const MIB: usize = 1 << 20;

    #[test]
    fn lookup_finds_the_region_and_offset_or_nothing() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        assert_eq!(m.register(&fake, A, MIB).unwrap(), RegisterOutcome::Registered);
        assert_eq!(m.register(&fake, A + 4 * MIB as u64, MIB).unwrap(), RegisterOutcome::Registered);
        let dev = (A >> 40) as i32;
        assert_eq!(m.lookup(A, MIB), Some(RegionHit { base: A, offset: 0, device: dev }));
        assert_eq!(m.lookup(A + 4096, 8192), Some(RegionHit { base: A, offset: 4096, device: dev }));
        assert_eq!(m.holding(A + 4096, 8192), Some(Region { base: A, len: MIB, device: dev }));
        assert_eq!(m.holding(A + 4096, MIB), None);
        assert_eq!(m.lookup(A + MIB as u64 - 1, 1).map(|h| h.offset), Some(MIB as u64 - 1));
        assert_eq!(m.lookup(A + 4096, MIB), None, "runs past the region's end");
        assert_eq!(m.lookup(A + MIB as u64, 1), None, "in the gap");
        assert_eq!(m.lookup(A - 1, 2), None, "starts before the first region");
        assert_eq!(
            m.lookup(A + 5 * MIB as u64 - 10, 10).map(|h| (h.base, h.offset)),
            Some((A + 4 * MIB as u64, MIB as u64 - 10))
        );
        assert_eq!(m.lookup(u64::MAX - 1, 10), None, "wrapping range");
        assert_eq!(fake.calls.lock().len(), 2);
    }

    #[test]
    fn lookup_scales_to_many_regions() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        for i in 0..10_000u64 {
            m.register(&fake, A + i * 8192, 4096).unwrap();
        }
        for i in (0..10_000u64).step_by(997) {
            assert_eq!(m.lookup(A + i * 8192 + 100, 100).map(|h| h.base), Some(A + i * 8192));
            assert_eq!(m.lookup(A + i * 8192 + 4096, 1), None);
        }
    }

    #[test]
    fn duplicate_is_a_no_op_and_overlaps_are_refused() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        m.register(&fake, A, MIB).unwrap();
        assert_eq!(m.register(&fake, A, MIB).unwrap(), RegisterOutcome::AlreadyRegistered);
        assert_eq!(fake.calls.lock().len(), 1, "no second cuFileBufRegister");
        for (p, l) in [(A, 2 * MIB), (A + 4096, 4096), (A - 4096, 8192), (A - 4096, 2 * MIB), (A, MIB / 2)] {
            let e = m.register(&fake, p, l).unwrap_err();
            assert!(matches!(e, GdsError::Overlap { registered: Region { base: A, .. }, .. }), "{e:?}");
            let e = e.to_string();
            assert!(e.contains("overlaps") && e.contains(&format!("{A:#x}")), "{e}");
        }
        // Adjacent regions do not overlap.
        m.register(&fake, A + MIB as u64, 4096).unwrap();
        m.register(&fake, A - 4096, 4096).unwrap();
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn bad_arguments_are_refused_without_calling_cufile() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        let msg = |e: GdsError| {
            assert!(matches!(e, GdsError::InvalidBuffer { .. }), "{e:?}");
            e.to_string()
        };
        assert!(msg(m.register(&fake, 0, 10).unwrap_err()).contains("null"));
        assert!(msg(m.register(&fake, A, 0).unwrap_err()).contains("length 0"));
        assert!(msg(m.register(&fake, u64::MAX - 10, 100).unwrap_err()).contains("wraps"));
        assert!(fake.calls.lock().is_empty());
    }

    #[test]
    fn deregister_known_unknown_and_interior_pointers() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        m.register(&fake, A, MIB).unwrap();
        assert!(!m.deregister(&fake, A + 8 * MIB as u64).unwrap(), "unknown: no-op");
        let e = m.deregister(&fake, A + 4096).unwrap_err();
        assert!(matches!(e, GdsError::NotBase { base: A, offset: 4096, .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("inside") && e.contains(&format!("{A:#x}")), "{e}");
        assert!(m.deregister(&fake, A).unwrap());
        assert!(!m.deregister(&fake, A).unwrap(), "second time: no-op");
        assert_eq!(m.lookup(A, 1), None);
        assert_eq!(fake.calls.lock().iter().filter(|c| c.starts_with("dereg")).count(), 1);
        // Once gone, the range can be registered with another length.
        m.register(&fake, A, 2 * MIB).unwrap();
        assert_eq!(m.lookup(A + MIB as u64, 4).map(|h| h.base), Some(A));
    }

    #[test]
    fn cufile_failures_leave_the_table_consistent() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        *fake.fail_register.lock() = Some(GdsError::cufile("cuFileBufRegister(X)", 5030, None, 0));
        assert!(m.register(&fake, A, MIB).unwrap_err().to_string().starts_with("cuFileBufRegister(X) failed"));
        assert!(m.is_empty(), "a refused registration is not recorded");
        *fake.fail_register.lock() = None;
        m.register(&fake, A, MIB).unwrap();
        *fake.fail_deregister.lock() = Some(GdsError::cufile("cuFileBufDeregister(Y)", 5024, None, 0));
        assert!(m.deregister(&fake, A).unwrap_err().to_string().contains("Y"));
        assert!(m.is_empty(), "dropped from the table all the same");
    }

    #[test]
    fn clear_deregisters_everything_and_reports_refusals() {
        let fake = FakeRegistrar::default();
        let mut m = RegionMap::new();
        m.register(&fake, A, 4096).unwrap();
        m.register(&fake, A + MIB as u64, 4096).unwrap();
        *fake.fail_deregister.lock() = Some(GdsError::Unavailable("nope".into()));
        let errs = m.clear(&fake);
        assert_eq!(errs.len(), 2);
        assert!(m.is_empty());
        assert_eq!(fake.calls.lock().iter().filter(|c| c.starts_with("dereg")).count(), 2);
    }
}
