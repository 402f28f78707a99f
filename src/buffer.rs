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

use crate::error::Result;

/// Where a buffer's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Host (CPU) memory.
    Host,
    /// Memory of CUDA device `ordinal`: moved by GPUDirect Storage on a
    /// GDS handle, else bounced through host memory by the [`Staging`] copier.
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
    /// [`Staging`] copier and by cuFile.
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
    /// strided buffer always bounces through its [`Staging`] copier.
    pub fn contiguous(mut self, contiguous: bool) -> BufferDesc {
        self.contiguous = contiguous;
        self
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn location(&self) -> Location {
        self.location
    }
    pub fn is_host(&self) -> bool {
        self.location == Location::Host
    }
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

/// Memory that stays put while the op runs (`from_raw_parts`' contract):
/// the core copies it directly, and there is nothing to hold.
pub(crate) struct FixedMemory {
    desc: BufferDesc,
}

impl FixedMemory {
    /// `desc` must be contiguous host memory (its contract covers the copies).
    pub(crate) fn new(desc: BufferDesc) -> Option<FixedMemory> {
        (desc.is_host() && desc.contiguous).then_some(FixedMemory { desc })
    }
}

impl Staging for FixedMemory {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        let n = self.desc.len.min(bounce.len());
        // SAFETY: `from_raw_parts`' contract: the memory is valid and ours
        // until the op finishes; the bounce buffer holds at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.desc.ptr, bounce.as_mut_ptr(), n) };
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        let n = self.desc.len.min(bounce.len());
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bounce.as_ptr(), self.desc.ptr, n) };
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
