//! The process-wide pinned-memory manager (`deepspeed_pin_tensor_t`).
//!
//! It hands out page-aligned, `mlock`ed regions and remembers each one, so
//! that any buffer lying wholly inside a region (the region itself, a narrow,
//! a view) is recognised as page-locked and can be used for O_DIRECT I/O
//! without a bounce copy. Regions are kept by base address (a `BTreeMap`,
//! for `free` and the totals) and by page (`pinned_index.rs`, a page-table-like
//! index), so `is_managed` on the submission path is a hash probe and one
//! table load whatever the number of regions, instead of the C++ linear scan.
//!
//! There is one manager per process ([`PinnedMemoryManager::shared`]): the
//! Rust core is linked into a single shared object that every DeepSpeed
//! extension depends on, so async_io, gds and pin_memory all see the same
//! regions whatever order they are loaded in.

use std::collections::BTreeMap;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sync::{RwLock, RwLockWriteGuard};

use crate::engine::fixed::RegistrableMemory;
use crate::error::{last_errno, Error, Result};

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as usize
    } else {
        4096
    }
}

/// The current RLIMIT_MEMLOCK (soft, hard), in bytes.
#[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
pub fn memlock_limit() -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0 {
        (r.rlim_cur as u64, r.rlim_max as u64)
    } else {
        (0, 0)
    }
}

/// One locked mapping: `requested` is what the caller asked for (and what a
/// buffer must fit inside); `mapped` is the page-rounded length that was
/// mapped. It is unlocked and unmapped when the last reference goes: the
/// manager's (dropped by `free`) or an op's [`RegionHold`].
#[derive(Debug)]
struct Region {
    base: usize,
    requested: usize,
    mapped: usize,
    /// Held by a [`LockedBuffer`] (which keeps it mapped while it lives).
    owned: bool,
    /// Lets io_uring workers register the region as a fixed buffer; dropped
    /// (after the unmap) with the region, which tells them to let go.
    registrable: Arc<RegistrableMemory>,
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

/// An anonymous, page-aligned mapping. It is locked when `locked` says so.
/// Used directly for bounce buffers, and by the manager for its regions.
#[derive(Debug)]
pub struct PageAlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    mapped: usize,
    locked: bool,
    /// The bounce pool's buffers may be registered with io_uring.
    registrable: Option<Arc<RegistrableMemory>>,
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for PageAlignedBuffer {}
// SAFETY: shared references only read the description; as for Send.
unsafe impl Sync for PageAlignedBuffer {}

impl PageAlignedBuffer {
    /// Maps `len` bytes (at least one page). With `lock = Required` an mlock
    /// failure is an error that names the size and RLIMIT_MEMLOCK; with
    /// `BestEffort` the buffer stays unlocked (bounce buffers only need to be
    /// aligned, locking just makes them faster).
    pub fn new(len: usize, lock: LockMode) -> Result<Self> {
        Self::map(len, lock, false)
    }

    /// Maps `len` bytes with every page faulted in now (`MAP_POPULATE`), so
    /// that the first copy into it takes no page faults: the bounce pool's
    /// buffers, which are reused op after op (and so are worth registering
    /// with io_uring).
    pub(crate) fn new_populated(len: usize) -> Result<Self> {
        let mut buf = Self::map(len, LockMode::None, true)?;
        buf.registrable = Some(RegistrableMemory::new(buf.ptr.as_ptr() as usize, buf.mapped, false));
        Ok(buf)
    }

    /// As memory io_uring may register, when it may be.
    pub(crate) fn registrable(&self) -> Option<&Arc<RegistrableMemory>> {
        self.registrable.as_ref()
    }

    fn map(len: usize, lock: LockMode, populate: bool) -> Result<Self> {
        let page = page_size();
        let mapped = len.max(1).checked_add(page - 1).map(|v| v / page * page).ok_or_else(|| {
            Error::Alloc { bytes: len, source: io::Error::from_raw_os_error(libc::ENOMEM) }
        })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 },
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Alloc { bytes: len, source: io::Error::last_os_error() });
        }
        let mut buf = PageAlignedBuffer {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned null"),
            len,
            mapped,
            locked: false,
            registrable: None,
        };
        if lock != LockMode::None {
            // SAFETY: locking our own mapping.
            if unsafe { libc::mlock(p, mapped) } == 0 {
                buf.locked = true;
            } else if lock == LockMode::Required {
                let errno = last_errno();
                let (limit_soft, limit_hard) = memlock_limit();
                // `buf` unmaps on drop.
                return Err(Error::Lock { bytes: len, errno, limit_soft, limit_hard });
            }
        }
        Ok(buf)
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn is_locked(&self) -> bool {
        self.locked
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is at least `len` readable bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives up ownership without unmapping; `release_raw` undoes it.
    fn into_raw(mut self) -> (NonNull<u8>, usize) {
        let out = (self.ptr, self.mapped);
        drop(self.registrable.take());
        std::mem::forget(self);
        out
    }
}

/// Unlocks and unmaps a mapping made by [`PageAlignedBuffer::new`].
fn release_raw(ptr: *mut u8, mapped: usize, locked: bool) {
    // SAFETY: the caller owns this mapping and nobody uses it any more.
    unsafe {
        if locked {
            libc::munlock(ptr as *const libc::c_void, mapped);
        }
        libc::munmap(ptr as *mut libc::c_void, mapped);
    }
}

impl Drop for PageAlignedBuffer {
    fn drop(&mut self) {
        release_raw(self.ptr.as_ptr(), self.mapped, self.locked);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    None,
    BestEffort,
    Required,
}

/// The live regions, kept by base (to free by address, and for the totals)
/// and by page (for the lookups on the submission path); always changed
/// together.
struct Registry {
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
    fn get(&self, base: usize) -> Option<&Arc<Region>> {
        self.by_base.get(&base)
    }

    fn remove(&mut self, base: usize) -> Option<Arc<Region>> {
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
    regions: RwLock<Registry>,
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
    /// the fork handlers, which hold its lock across `fork()`: see `fork.rs`.)
    pub fn shared() -> &'static PinnedMemoryManager {
        crate::fork::join(crate::fork::Slot::PinnedRegistry, |_| Some(Box::new(lock_for_fork())));
        &SHARED
    }

    /// Allocates `bytes` of page-aligned, locked memory and records it.
    /// A zero-byte request still gets a (one-page) mapping with a unique base.
    pub fn alloc(&self, bytes: usize) -> Result<NonNull<u8>> {
        let region = self.alloc_region(bytes, false)?;
        Ok(NonNull::new(region.base as *mut u8).expect("a mapping is never at address 0"))
    }

    fn alloc_region(&self, bytes: usize, owned: bool) -> Result<Arc<Region>> {
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
    /// The region stops being managed at once (and a [`LockedBuffer`]'s is
    /// unlocked at once, its mapping kept for its owner). When an async op is still
    /// moving bytes to or from it (it holds a [`RegionHold`]), the unlock and
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
                    crate::log::info_once(
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
/// and a child can take it (see `fork.rs`).
struct RegistryHeld {
    _registry: RwLockWriteGuard<'static, Registry>,
}

/// Takes the process-wide manager's registry for the fork handler.
fn lock_for_fork() -> RegistryHeld {
    RegistryHeld { _registry: SHARED.regions.write() }
}

#[cfg(test)]
#[path = "pinned_proptests.rs"]
mod proptests;

#[path = "pinned_index.rs"]
mod index;
use index::PageIndex;

impl Drop for PinnedMemoryManager {
    fn drop(&mut self) {
        // Each region is released now, or by the last op that holds it.
        self.regions.get_mut().clear();
    }
}

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
