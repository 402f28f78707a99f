//! Async ops on borrowed memory, safely: [`IoHandle::scope`] lends the
//! closure an [`OpScope`] whose ops may borrow buffers that outlive the
//! scope, and waits for every op before it returns (or unwinds), as
//! `std::thread::scope` joins its threads. The borrow keeps the memory where
//! it is for the op's whole life, so it goes direct wherever it is aligned
//! (the ownership rule's "memory that cannot move", `op/caller.rs`).

use std::marker::PhantomData;

use crate::buffer::BufferDesc;
use crate::error::{Direction, Result};
use crate::file::FileTarget;
use crate::op::OpRequest;

use super::borrowed::offset_arg;
use super::construction::IoHandle;

/// The ops of one [`IoHandle::scope`] call. `'env` is what the buffers are
/// borrowed for: longer than the scope, so no buffer can be dropped, moved
/// or touched before the scope has waited for its op.
///
/// ```
/// # use deepnvme::{FileTarget, HandleConfig, IoHandle};
/// # let dir = std::env::temp_dir().join(format!("deepnvme-scope-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let path = dir.join("swap.bin");
/// let handle = IoHandle::new(HandleConfig::default())?;
/// let data = vec![7u8; 8192];
/// let mut back = vec![0u8; 8192];
/// handle.scope(|s| s.write(&data, FileTarget::Path(&path), 0))??;
/// handle.scope(|s| s.read(&mut back, FileTarget::Path(&path), 0))??;
/// assert_eq!(back, data);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), deepnvme::Error>(())
/// ```
///
/// A buffer that does not outlive the scope cannot be lent to it:
///
/// ```compile_fail
/// # use deepnvme::{FileTarget, HandleConfig, IoHandle};
/// let handle = IoHandle::new(HandleConfig::default()).unwrap();
/// handle.scope(|s| {
///     let mut local = vec![0u8; 4096]; // dropped at the closure's end, before the wait
///     s.read(&mut local, FileTarget::Path("x.bin".as_ref()), 0).unwrap();
/// }).unwrap();
/// ```
pub struct OpScope<'scope, 'env: 'scope> {
    handle: &'scope IoHandle,
    // Invariant in both lifetimes, as std's thread scope is: a scope cannot
    // be passed off as one with a longer-lived environment.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl IoHandle {
    /// Runs `f` with a scope for async ops on borrowed memory, then waits
    /// for every op of the handle: `Ok` with `f`'s value when all finished
    /// without error, else the first error. (As with `wait()`, an op's error
    /// goes to whichever call finishes it: a `wait()` or blocking call on the
    /// same handle from another thread, or inside `f`, takes it instead.) If `f` panics, the ops are still
    /// waited for before the panic goes on (the memory they borrowed is
    /// released only then).
    pub fn scope<'env, T>(&'env self, f: impl for<'scope> FnOnce(&'scope OpScope<'scope, 'env>) -> T) -> Result<T> {
        /// Waits on unwinding, so that a panicking `f` never leaves an op
        /// moving bytes to or from memory its caller is about to free.
        struct WaitOnUnwind<'a>(&'a IoHandle);
        impl Drop for WaitOnUnwind<'_> {
            fn drop(&mut self) {
                let _ = self.0.wait();
            }
        }
        let scope = OpScope { handle: self, _scope: PhantomData, _env: PhantomData };
        let guard = WaitOnUnwind(self);
        let value = f(&scope);
        // The guard stays armed through this wait: should it panic midway,
        // the guard's wait finishes the rest before the memory is released.
        let waited = self.wait();
        std::mem::forget(guard);
        waited?;
        Ok(value)
    }
}

impl<'env> OpScope<'_, 'env> {
    /// Starts an async parallel read of `buffer.len()` bytes at
    /// `file_offset` into `buffer`, which stays borrowed until the scope
    /// ends.
    pub fn read(&self, buffer: &'env mut [u8], target: FileTarget<'_>, file_offset: u64) -> Result<()> {
        // SAFETY: the exclusive borrow lasts until `scope` has waited for
        // this op, and nothing else can reach the memory meanwhile.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_mut_ptr(), buffer.len()) };
        self.start(Direction::Read, desc, target, file_offset)
    }

    /// Starts an async parallel write of `buffer` at `file_offset`; the
    /// buffer stays borrowed (and so unchanged) until the scope ends.
    pub fn write(&self, buffer: &'env [u8], target: FileTarget<'_>, file_offset: u64) -> Result<()> {
        // SAFETY: as in `read`; a write only reads the memory, and the
        // shared borrow keeps anyone from writing it until the scope ends.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_ptr() as *mut u8, buffer.len()) };
        self.start(Direction::Write, desc, target, file_offset)
    }

    fn start(&self, direction: Direction, desc: BufferDesc, target: FileTarget<'_>, file_offset: u64) -> Result<()> {
        // Borrowed memory cannot move while its op lives: direct I/O needs
        // no bounce copy (a misaligned part still goes buffered).
        let request = OpRequest::new(direction, target, offset_arg(file_offset)?, desc.pinned(true));
        self.handle.submit(request, true).map(drop)
    }
}
