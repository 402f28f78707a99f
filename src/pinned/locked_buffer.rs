//! [`LockedBuffer`]: page-locked memory from the process-wide manager,
//! owned by the Rust caller.

use std::sync::Arc;

use crate::error::Result;

use super::manager::{PinnedMemoryManager, Region};

/// Page-locked memory from the process-wide manager, owned: freed when
/// dropped. Recognised as pinned by every handle, so I/O goes straight to
/// it; it can be moved into an async op ([`crate::IoHandle::submit_read`]).
///
/// It holds its region, so the memory stays mapped for as long as it lives
/// even when someone frees the region through the manager first (a front
/// end's `free_cpu_locked_tensor`): that only stops it being managed, and
/// dropping the buffer afterwards never frees another allocation that
/// happens to start at the same address.
pub struct LockedBuffer {
    region: Arc<Region>,
}

impl LockedBuffer {
    /// `len` zeroed bytes of page-aligned, locked memory. Fails (naming the
    /// size and RLIMIT_MEMLOCK) when the memory cannot be locked.
    pub fn new(len: usize) -> Result<LockedBuffer> {
        Ok(LockedBuffer { region: PinnedMemoryManager::shared().alloc_region(len, true)? })
    }

    /// The base address of the memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.base as *mut u8
    }

    /// Whether the process-wide manager still manages this memory (false
    /// once it was freed through the manager).
    pub fn is_managed(&self) -> bool {
        PinnedMemoryManager::shared().regions.read().get(self.region.base).is_some_and(|r| Arc::ptr_eq(r, &self.region))
    }
}

impl std::ops::Deref for LockedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `requested` bytes mapped at `base`, kept mapped by the
        // region this buffer holds (mmap zeroed them).
        unsafe { std::slice::from_raw_parts(self.region.base as *const u8, self.region.requested) }
    }
}

impl std::ops::DerefMut for LockedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.region.base as *mut u8, self.region.requested) }
    }
}

impl std::fmt::Debug for LockedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedBuffer").field("ptr", &self.as_ptr()).field("len", &self.region.requested).finish()
    }
}

impl Drop for LockedBuffer {
    fn drop(&mut self) {
        // Unmanage it only when the manager's entry is still this region;
        // the mapping goes with the last reference (this one, or an op's).
        let removed = {
            let mut regions = PinnedMemoryManager::shared().regions.write();
            let ours = regions.get(self.region.base).is_some_and(|r| Arc::ptr_eq(r, &self.region));
            if ours {
                regions.remove(self.region.base)
            } else {
                None
            }
        };
        drop(removed); // outside the lock: the unmap, when this was the last reference
    }
}

// SAFETY: the mapping does not move when the LockedBuffer does, and lives
// until it is dropped.
unsafe impl crate::buffer::IoBuffer for LockedBuffer {
    fn io_desc(&mut self) -> crate::BufferDesc {
        // SAFETY: the op owns this buffer until it finishes.
        unsafe { crate::BufferDesc::from_raw_parts(self.as_ptr(), self.region.requested) }
    }
}

#[cfg(test)]
mod locked_buffer_tests {
    use super::*;
    use crate::pinned::page_size;

    #[test]
    fn a_region_over_whole_2_mib_granules_is_found_anywhere_inside_and_nowhere_after_its_free() {
        // Large enough to hold at least one whole 2 MiB granule wherever mmap puts it.
        let len = (4 << 20) + 3 * page_size() + 17;
        let manager = PinnedMemoryManager::new();
        let base = manager.alloc(len).unwrap().as_ptr() as usize;
        for offset in [0, 1, 2 << 20, (2 << 20) + 4095, len - 1] {
            assert!(manager.is_managed((base + offset) as *const u8, len - offset), "offset {offset}");
            assert_eq!(manager.region_of((base + offset) as *const u8), Some((base, len)));
        }
        assert!(manager.is_managed((base + len) as *const u8, 0), "the empty range at its end");
        assert!(!manager.is_managed(base as *const u8, len + 1), "one byte past its end");
        assert!(!manager.is_managed((base + len) as *const u8, 1));
        assert!(manager.free(base as *const u8));
        assert!(!manager.is_managed((base + (2 << 20)) as *const u8, 1));
        assert_eq!(manager.region_of(base as *const u8), None);
    }

    #[test]
    fn a_locked_buffer_freed_through_the_manager_stays_mapped_and_never_frees_a_newer_region() {
        let mut a = LockedBuffer::new(8192).unwrap();
        a.fill(7);
        let base = a.as_ptr();
        assert!(a.is_managed());
        assert!(PinnedMemoryManager::shared().free(base));
        assert!(!a.is_managed());
        assert!(!PinnedMemoryManager::shared().is_managed(base, 1));
        // Still mapped: readable and writable, and its address is not handed out again.
        assert!(a.iter().all(|&b| b == 7));
        a.fill(9);
        let b = LockedBuffer::new(8192).unwrap();
        assert_ne!(b.as_ptr(), base);
        drop(a);
        assert!(b.is_managed(), "dropping a freed buffer must not unmanage another region");
    }
}
