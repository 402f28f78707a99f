//! The caller's memory, as the core sees it: where it lives, how long it is,
//! and whether the I/O may use it directly.
//!
//! A [`BufferDesc`] is a raw description (pointer and length). It can only be
//! made through the `unsafe` [`BufferDesc::from_raw_parts`], whose contract
//! is the one every op relies on: the memory stays valid, and nobody else
//! reads or writes it, until the op that uses it is finished (`wait()` for
//! an async op). Safe entry points ([`crate::IoHandle::read_into`],
//! [`crate::IoHandle::submit_read`], ...) build descriptions from borrowed or
//! owned memory, where the borrow checker or ownership keeps that promise.
//!
//! `HostMemcpy` is the one memcpy between contiguous host memory and a
//! bounce buffer, with its safety argument (that contract); every front
//! end's memcpy fallback copies through it. When a copy may run is the
//! ownership rule's (`op/caller.rs`).

use crate::error::{Error, Result};
use crate::bounce::copy::parallel_copy;

/// Where a buffer's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Host (CPU) memory.
    Host,
    /// Memory of CUDA device `ordinal`: moved by GPUDirect Storage on a
    /// GDS handle, else bounced through host memory by the `Staging` copier.
    Cuda(i32),
    /// Memory of another device: always bounced through host memory.
    OtherDevice,
}

/// The caller's buffer: pointer, length, location, layout.
#[derive(Clone, Copy, Debug)]
pub struct BufferDesc {
    ptr: *mut u8,
    len: usize,
    location: Location,
    contiguous: bool,
    declared_pinned: bool,
}

// SAFETY: a description of memory whose owner promised (in
// `from_raw_parts`) to keep it alive and unaliased while ops use it, from
// whichever thread runs them.
unsafe impl Send for BufferDesc {}
// SAFETY: shared references only read the description; as for Send.
unsafe impl Sync for BufferDesc {}

impl BufferDesc {
    /// Describes `len` bytes of contiguous host memory at `ptr`, not
    /// declared page-locked.
    ///
    /// # Safety
    /// Until every op given this description has finished (a blocking call
    /// returned, or `wait()` finished an async op): `ptr..ptr + len` must
    /// stay valid, and nothing else may access it — a read op writes into it
    /// from I/O threads and the kernel, a write op reads it from them. For a
    /// description moved to [`Location::Cuda`] or [`Location::OtherDevice`],
    /// or marked non-contiguous, the pointer is only used by the op's
    /// `Staging` copier and by cuFile.
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> BufferDesc {
        BufferDesc { ptr, len, location: Location::Host, contiguous: true, declared_pinned: false }
    }

    /// Declares the memory page-locked (e.g. torch-pinned), so O_DIRECT I/O
    /// goes straight to it. Memory from the [`crate::PinnedMemoryManager`]
    /// is recognised without this.
    pub fn pinned(mut self, pinned: bool) -> BufferDesc {
        self.declared_pinned = pinned;
        self
    }

    /// Says where the bytes live (host by default).
    pub fn located(mut self, location: Location) -> BufferDesc {
        self.location = location;
        self
    }

    /// Says whether the bytes are one dense range (true by default). A
    /// strided buffer always bounces through its `Staging` copier.
    pub fn contiguous(mut self, contiguous: bool) -> BufferDesc {
        self.contiguous = contiguous;
        self
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Where the memory lives (host, CUDA, another device).
    pub fn location(&self) -> Location {
        self.location
    }
    /// Host memory.
    pub fn is_host(&self) -> bool {
        self.location == Location::Host
    }
    /// One contiguous run of bytes (a strided view is not).
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }
    /// Declared page-locked by the caller (see [`BufferDesc::pinned`]).
    pub fn is_declared_pinned(&self) -> bool {
        self.declared_pinned && self.is_host()
    }
}

/// The front end's side of an op on memory the I/O cannot use directly
/// (device memory, strided layouts, memory that is not page-locked), and the
/// op's hold on the caller's buffer: the op keeps it until it finishes, so an
/// implementation that owns (or references) the buffer keeps the memory
/// alive for that long.
///
/// Contiguous host memory is copied by the core itself, inside
/// [`Staging::hold_still`] (see `op/caller.rs`, the ownership rule);
/// anything else through `copy_to_bounce` / `copy_from_bounce`.
pub trait Staging: Send {
    /// Caller buffer -> `bounce` (before a write), for device or strided memory.
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()>;
    /// `bounce` -> caller buffer (after a read), for device or strided memory.
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()>;
    /// Where the caller's buffer is now (address, bytes), when the front end
    /// can tell: a torch tensor whose storage was swapped while its op was in
    /// flight (`set_`, `resize_`, `.data =`) reports somewhere else, and no
    /// copy then touches it. `None`: the buffer cannot move. Asked only
    /// inside [`Staging::hold_still`].
    fn current_extent(&self) -> Option<(usize, usize)> {
        None
    }
    /// Runs `access` (once) while nothing can free or move the caller's
    /// memory. The default runs it as it is: memory that cannot move (the
    /// contract of [`BufferDesc::from_raw_parts`], a buffer the op owns). A
    /// front end whose memory can move (a torch tensor, a Python buffer)
    /// runs it holding the interpreter's lock, from whichever thread calls.
    fn hold_still(&self, access: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        access()
    }
}

/// The one memcpy between contiguous host memory a [`BufferDesc`]
/// describes and a bounce buffer: `min(desc.len(), bounce.len())` bytes,
/// with the bounce path's parallel streaming copy
/// ([`crate::bounce::copy`]'s `parallel_copy`: several threads when large).
/// Every `Staging` whose fallback is a plain memcpy copies through it:
/// memory that stays put (no front end, [`BufferDesc::from_raw_parts`]'
/// contract: this type is then the op's whole `Staging`), an owned buffer
/// (`handle/owned.rs`), a Python object without a copier
/// (`python/buffer.rs`). Torch tensors are copied by torch (`ffi.rs`).
///
/// When it may copy is the ownership rule's business, not this type's
/// (`op/caller.rs`, the ownership rule): the core's own copies of caller
/// memory go through `CallerMemory`, inside the front end's hold; a
/// `HostMemcpy` copies wherever its owner calls it, so an owner whose memory
/// can move calls it inside its [`Staging::hold_still`] (as
/// `python/buffer.rs` does).
///
/// # Why the copies are sound
/// Written once, for both directions: a `BufferDesc` is made only by
/// [`BufferDesc::from_raw_parts`], whose contract is that its `len` bytes
/// stay valid, and nobody else's, until the op given it has finished; a
/// `HostMemcpy` belongs to that op's `Staging` (it is made for it, and
/// kept nowhere else), so it lives no longer than the op, and it copies
/// only through `&mut self`, one copy at a time (that the op's other
/// accesses to the same bytes do not overlap its copies is the ownership
/// rule's and the handle's order, `op/caller.rs`); `new`
/// checked that the bytes are contiguous host memory; a copy covers at most
/// `len` bytes, and never more than the bounce buffer holds; the bounce
/// buffer is the core's own allocation, so it never overlaps them. An empty
/// copy makes no slice (an empty buffer's pointer may be null).
pub(crate) struct HostMemcpy {
    desc: BufferDesc,
}

impl HostMemcpy {
    /// The copier of `desc`'s bytes; `None` unless they are contiguous host
    /// memory.
    pub(crate) fn new(desc: BufferDesc) -> Option<HostMemcpy> {
        (desc.is_host() && desc.contiguous).then_some(HostMemcpy { desc })
    }

    /// As [`HostMemcpy::new`], with the error of a copy that cannot be
    /// made by memcpy.
    pub(crate) fn of(desc: BufferDesc) -> Result<HostMemcpy> {
        HostMemcpy::new(desc).ok_or_else(|| Error::Copy("no copier for device or strided memory".into()))
    }

    /// Caller's bytes -> `bounce`; returns the bytes copied.
    pub(crate) fn bytes_to_bounce(&mut self, bounce: &mut [u8]) -> usize {
        let n = self.desc.len.min(bounce.len());
        if n > 0 {
            // SAFETY: the caller's first `n` bytes, read while nothing else
            // writes them (see "Why the copies are sound" on the type).
            let src = unsafe { std::slice::from_raw_parts(self.desc.ptr, n) };
            parallel_copy(&mut bounce[..n], src);
        }
        n
    }

    /// `bounce` -> caller's bytes; returns the bytes copied.
    pub(crate) fn bytes_from_bounce(&mut self, bounce: &[u8]) -> usize {
        let n = self.desc.len.min(bounce.len());
        if n > 0 {
            // SAFETY: the caller's first `n` bytes, written while nothing
            // else reads or writes them (see "Why the copies are sound").
            let dst = unsafe { std::slice::from_raw_parts_mut(self.desc.ptr, n) };
            parallel_copy(dst, &bounce[..n]);
        }
        n
    }
}

/// Memory that stays put while the op runs (`from_raw_parts`' contract):
/// the core copies it directly, and there is nothing to hold.
impl Staging for HostMemcpy {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        self.bytes_to_bounce(bounce);
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        self.bytes_from_bounce(bounce);
        Ok(())
    }
}

/// Memory an async op can own until it is finished: its bytes stay at the
/// same address when the value moves (a heap allocation, a mapping).
///
/// # Safety
/// `io_desc` must describe memory owned by `self` that stays valid, at the
/// same address, for as long as `self` lives, however `self` is moved.
pub unsafe trait IoBuffer: Send + 'static {
    /// The bytes, described for the I/O.
    fn io_desc(&mut self) -> BufferDesc;
}

// SAFETY: a Vec's heap buffer does not move when the Vec does, and the Vec
// is not resized while the op owns it.
unsafe impl IoBuffer for Vec<u8> {
    fn io_desc(&mut self) -> BufferDesc {
        // SAFETY: the op owns the Vec until it finishes (see IoBuffer).
        unsafe { BufferDesc::from_raw_parts(self.as_mut_ptr(), self.len()) }
    }
}

// SAFETY: as for Vec.
unsafe impl IoBuffer for Box<[u8]> {
    fn io_desc(&mut self) -> BufferDesc {
        // SAFETY: the op owns the box until it finishes.
        unsafe { BufferDesc::from_raw_parts(self.as_mut_ptr(), self.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::pattern;

    /// Both directions copy `min(described, bounce)` bytes and touch nothing
    /// past either end, at odd lengths, with a bounce buffer shorter than,
    /// as long as and longer than the description; large enough for the
    /// streaming stores and for the parallel copy's threads.
    #[test]
    fn host_memcpy_copies_the_shorter_of_description_and_bounce() {
        let big = (16 << 20) + 4099; // several copy threads (8 MiB each)
        for (described, bounce_len) in
            [(0, 5), (1, 0), (1, 1), (7, 3), (3, 7), (4097, 4096), (65_537, 131_075), (200_003, 65_539), (big, big - 1)]
        {
            // One allocation with guard bytes either side of the described range.
            let mut caller = pattern(1, described + 34);
            let original = caller.clone();
            // SAFETY: `caller` outlives the copier and is used only through it meanwhile.
            let desc = unsafe { BufferDesc::from_raw_parts(caller.as_mut_ptr().add(17), described) };
            let mut memcpy = HostMemcpy::new(desc).expect("contiguous host memory");
            let n = described.min(bounce_len);

            let mut bounce = vec![0xEEu8; bounce_len + 8];
            assert_eq!(memcpy.bytes_to_bounce(&mut bounce[..bounce_len]), n, "{described} {bounce_len}");
            assert_eq!(&bounce[..n], &original[17..17 + n], "{described} {bounce_len}: bytes in");
            assert!(bounce[n..].iter().all(|&b| b == 0xEE), "{described} {bounce_len}: nothing past n in the bounce");

            let incoming = pattern(99, bounce_len);
            assert_eq!(memcpy.bytes_from_bounce(&incoming), n, "{described} {bounce_len}");
            assert_eq!(&caller[17..17 + n], &incoming[..n], "{described} {bounce_len}: bytes out");
            assert_eq!(&caller[17 + n..], &original[17 + n..], "{described} {bounce_len}: nothing past n");
            assert_eq!(&caller[..17], &original[..17], "{described} {bounce_len}: nothing before the start");
        }
    }

    /// Device or strided memory has no memcpy; an empty description (whose
    /// pointer may be null) copies nothing and makes no slice.
    #[test]
    fn host_memcpy_is_only_for_contiguous_host_memory() {
        // SAFETY: never dereferenced (refused, or empty).
        let null = unsafe { BufferDesc::from_raw_parts(std::ptr::null_mut(), 0) };
        assert!(HostMemcpy::new(null.located(Location::Cuda(0))).is_none());
        assert!(HostMemcpy::new(null.located(Location::OtherDevice)).is_none());
        assert!(HostMemcpy::new(null.contiguous(false)).is_none());
        assert!(matches!(HostMemcpy::of(null.contiguous(false)), Err(Error::Copy(_))));
        let mut empty = HostMemcpy::of(null).expect("empty host memory");
        assert_eq!(empty.bytes_to_bounce(&mut [0u8; 4]), 0);
        assert_eq!(empty.bytes_from_bounce(&[1u8; 4]), 0);
        let mut staging: Box<dyn Staging> = Box::new(empty);
        staging.copy_to_bounce(&mut [0u8; 4]).unwrap();
        staging.copy_from_bounce(&[1u8; 4]).unwrap();
    }
}
