//! The manager: its registry of regions (by base and by page), the shared
//! instance, and the holds ops keep on regions they move bytes through.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::engine::fixed::RegistrableMemory;
use crate::error::Result;
use crate::rt::sync::{RwLock, RwLockWriteGuard};

use super::index::PageIndex;
use super::page_buffer::{release_raw, LockMode, PageAlignedBuffer};

/// One locked mapping: `requested` is what the caller asked for (and what a
/// buffer must fit inside); `mapped` is the page-rounded length that was
/// mapped. It is unlocked and unmapped when the last reference goes: the
/// manager's (dropped by `free`) or an op's [`RegionHold`].
#[derive(Debug)]
pub(super) struct Region {
    pub(super) base: usize,
    pub(super) requested: usize,
    pub(super) mapped: usize,
    /// Held by a [`LockedBuffer`] (which keeps it mapped while it lives).
    pub(super) owned: bool,
    /// Lets io_uring workers register the region as a fixed buffer; dropped
    /// (after the unmap) with the region, which tells them to let go.
    pub(super) registrable: Arc<RegistrableMemory>,
}

impl Drop for Region {
    fn drop(&mut self) {
        release_raw(self.base as *mut u8, self.mapped, true);
    }
}

/// An op's hold on a managed region whose memory it moves bytes to or from
/// directly: while it lives, the region stays mapped and locked even if it
/// is freed, so its address cannot be handed out again under the I/O.
#[derive(Debug)]
pub(crate) struct RegionHold {
    region: Arc<Region>,
}

impl RegionHold {
    /// The held region, as memory io_uring may register.
    pub fn registrable(&self) -> &Arc<RegistrableMemory> {
        &self.region.registrable
    }
}

/// The live regions, kept by base (to free by address, and for the totals)
/// and by page (for the lookups on the submission path); always changed
/// together.
pub(super) struct Registry {
    by_base: BTreeMap<usize, Arc<Region>>,
    by_page: PageIndex<Arc<Region>>,
}

impl Registry {
    const fn new() -> Self {
        Registry { by_base: BTreeMap::new(), by_page: PageIndex::new() }
    }

    fn insert(&mut self, region: Arc<Region>) {
        self.by_page.insert(region.base, region.mapped, &region);
        self.by_base.insert(region.base, region);
    }

    /// The region whose base is exactly `base`.
    pub(super) fn get(&self, base: usize) -> Option<&Arc<Region>> {
        self.by_base.get(&base)
    }

    pub(super) fn remove(&mut self, base: usize) -> Option<Arc<Region>> {
        let region = self.by_base.remove(&base)?;
        self.by_page.remove(region.base, region.mapped);
        Some(region)
    }

    /// The region whose requested bytes hold all of `[ptr, ptr + len)`.
    #[inline]
    fn containing(&self, ptr: *const u8, len: usize) -> Option<&Arc<Region>> {
        let start = ptr as usize;
        let end = start.checked_add(len)?;
        let fits = |r: &&Arc<Region>| r.base <= start && end <= r.base + r.requested;
        match self.by_page.get(start).filter(fits) {
            // An empty range at a region's very end sits on the page after it.
            None if len == 0 && start > 0 => self.by_page.get(start - 1).filter(fits),
            found => found,
        }
    }

    /// The region whose requested bytes (at least its first byte) hold `p`.
    fn holding(&self, p: usize) -> Option<&Arc<Region>> {
        self.by_page.get(p).filter(|r| p < r.base + r.requested.max(1))
    }

    fn clear(&mut self) {
        self.by_page = PageIndex::new();
        self.by_base.clear();
    }
}

/// Page-locked allocations, recognised by address range.
pub struct PinnedMemoryManager {
    pub(super) regions: RwLock<Registry>,
}

static SHARED: PinnedMemoryManager = PinnedMemoryManager::new();

impl Default for PinnedMemoryManager {
    fn default() -> Self {
        Self::new()
    }
}

impl PinnedMemoryManager {
    /// A private manager (tests, tools). DeepSpeed code uses [`Self::shared`].
    pub const fn new() -> Self {
        PinnedMemoryManager { regions: RwLock::new(Registry::new()) }
    }

    /// The one manager of this process. (The way in to it also installs
    /// the fork handlers, which hold its lock across `fork()`: see `rt/fork.rs`.)
    pub fn shared() -> &'static PinnedMemoryManager {
        crate::rt::fork::install();
        &SHARED
    }

    /// Allocates `bytes` of page-aligned, locked memory and records it.
    /// A zero-byte request still gets a (one-page) mapping with a unique base.
    pub fn alloc(&self, bytes: usize) -> Result<NonNull<u8>> {
        let region = self.alloc_region(bytes, false)?;
        Ok(NonNull::new(region.base as *mut u8).expect("a mapping is never at address 0"))
    }

    pub(super) fn alloc_region(&self, bytes: usize, owned: bool) -> Result<Arc<Region>> {
        let buf = PageAlignedBuffer::new(bytes, LockMode::Required)?;
        let (ptr, mapped) = buf.into_raw();
        let base = ptr.as_ptr() as usize;
        let registrable = RegistrableMemory::new(base, mapped, true);
        let region = Arc::new(Region { base, requested: bytes, mapped, owned, registrable });
        self.regions.write().insert(region.clone());
        Ok(region)
    }

    /// Frees the region whose base is exactly `base`. Returns whether
    /// anything was freed; an interior pointer or unknown address is refused.
    ///
    /// The region stops being managed at once (and a [`LockedBuffer`](super::LockedBuffer)'s is
    /// unlocked at once, its mapping kept for its owner). When an async op is still
    /// moving bytes to or from it (it holds a `RegionHold`), the unlock and
    /// unmap wait for the last such op to finish: the memory stays mapped, so
    /// its address cannot be handed out again and the pending I/O cannot
    /// land in a new allocation.
    pub fn free(&self, base: *const u8) -> bool {
        let removed = self.regions.write().remove(base as usize);
        match removed {
            Some(r) => {
                if r.owned {
                    // Its owner (a front end's tensor) keeps the mapping
                    // valid; the lock goes now, as DeepSpeed's free does.
                    // SAFETY: unlocking a mapping this region owns; munlock
                    // again at its drop is harmless.
                    unsafe { libc::munlock(r.base as *const libc::c_void, r.mapped) };
                }
                if Arc::strong_count(&r) > 1 + usize::from(r.owned) {
                    crate::rt::log::info_once(
                        "free-in-flight",
                        &format!(
                            "locked memory at {base:p} ({} bytes) was freed while an I/O op still uses it; \
                             it is unmapped when the op finishes (call wait() before freeing)",
                            r.requested
                        ),
                    );
                }
                true
            }
            None => false,
        }
    }

    /// True when `[ptr, ptr + len)` lies wholly inside one region.
    pub fn is_managed(&self, ptr: *const u8, len: usize) -> bool {
        self.regions.read().containing(ptr, len).is_some()
    }

    /// When `[ptr, ptr + len)` lies wholly inside one region: a hold that
    /// keeps that region mapped and locked until it is dropped, even if the
    /// region is freed meanwhile.
    pub(crate) fn hold(&self, ptr: *const u8, len: usize) -> Option<RegionHold> {
        self.regions.read().containing(ptr, len).map(|r| RegionHold { region: r.clone() })
    }

    /// The base and requested size of the region containing `ptr`, if any.
    pub fn region_of(&self, ptr: *const u8) -> Option<(usize, usize)> {
        self.regions.read().holding(ptr as usize).map(|r| (r.base, r.requested))
    }

    /// (number of regions, bytes requested, bytes locked).
    pub fn stats(&self) -> (usize, usize, usize) {
        let regions = &self.regions.read().by_base;
        let requested = regions.values().map(|r| r.requested).sum();
        let mapped = regions.values().map(|r| r.mapped).sum();
        (regions.len(), requested, mapped)
    }
}

/// The process-wide manager's registry, held (for writing) across `fork()`
/// by the fork handler, so that no other thread is inside it at the fork
/// and a child can take it (see `rt/fork.rs`).
struct RegistryHeld {
    _registry: RwLockWriteGuard<'static, Registry>,
}

/// The fork handler's hook (`rt/fork.rs`): holds the process-wide manager's
/// registry, for writing, across `fork()`.
pub(crate) fn hold_for_fork(_: std::time::Instant) -> crate::rt::fork::Held {
    Some(Box::new(RegistryHeld { _registry: SHARED.regions.write() }))
}

impl Drop for PinnedMemoryManager {
    fn drop(&mut self) {
        // Each region is released now, or by the last op that holds it.
        self.regions.get_mut().clear();
    }
}
