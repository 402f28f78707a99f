//! A torch storage held unresizable while direct I/O uses its bytes.
//!
//! A direct op on a torch-pinned tensor reads or writes the tensor's own
//! memory. A growing `resize_` (on the tensor or its storage) would
//! allocate new bytes inside the same `StorageImpl` and free the old ones,
//! which torch's pinned allocator hands to the next `pin_memory()`: the
//! kernel would then write into someone else's memory. Holding the storage
//! (`cpu_op_desc_t::_storage`) keeps the `StorageImpl` alive, not its bytes;
//! so for the op's life the storage is made unresizable
//! (`StorageImpl::set_resizable(false)`), and torch raises instead.
//!
//! Several ops may hold one storage at once (two reads into halves of one
//! pinned buffer): the flag goes back to what it was when the last of them
//! is finished. That count lives here; the torch glue only reads and sets
//! the flag (`cpp/src/tensor_glue.cc`). `ffi.rs` takes a hold for each op
//! that goes direct on a torch-pinned tensor. (The pyo3 front end cannot
//! reach `StorageImpl`: it bounces such tensors instead, `python/buffer.rs`.)
//!
//! The count and the flag change under the interpreter's lock, as Python
//! code's `resize_` runs: a `resize_` in another thread comes wholly before
//! or after. So [`HELD`] is only ever taken with that lock held, and never
//! by a thread of the core's own: `os.fork()` holds the lock too, so a
//! child never finds it taken (`rt/fork.rs`). While the interpreter finalizes
//! (no Python thread runs) it is taken without.

#![cfg_attr(not(feature = "ffi"), allow(dead_code))] // only the compiled front end holds storages

use crate::rt::interpreter::with_interpreter_lock;
use crate::rt::sync::Mutex;

/// A storage whose resizable flag can be read and set: the torch glue's
/// `io_op_desc_t` (`ffi.rs`), or a test's stand-in.
pub(crate) trait ResizableStorage {
    /// Which storage (its `StorageImpl`'s address); 0 when there is none.
    fn storage_id(&self) -> usize;
    fn resizable(&self) -> bool;
    fn set_resizable(&self, resizable: bool);
}

/// One storage some op holds.
struct Held {
    id: usize,
    /// Holds not yet released.
    holds: usize,
    /// The flag before the first hold, set back after the last.
    was_resizable: bool,
}

/// Every storage held now (a few at a time: a list).
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// Runs `f` under the interpreter's lock, or as it is when the interpreter
/// is finalizing (then no Python code runs anyway).
fn with_python_still<T>(f: impl FnOnce() -> T) -> T {
    let mut f = Some(f);
    let mut out = None;
    let _ = with_interpreter_lock(|| {
        out = f.take().map(|f| f());
        Ok(())
    });
    match (out, f) {
        (Some(out), _) => out,
        (None, Some(f)) => f(),
        (None, None) => unreachable!("the closure ran and gave a value"),
    }
}

/// One op's hold on a storage's bytes: from [`ResizeHold::take`] to
/// [`ResizeHold::release`], which the holder calls while the storage still
/// lives (the glue's object, which keeps it alive, is dropped after).
#[must_use = "a hold not released leaves the storage unresizable"]
pub(crate) struct ResizeHold {
    id: usize,
}

impl ResizeHold {
    /// Makes `storage` unresizable until every hold taken on it is
    /// released; `None` for no storage.
    pub(crate) fn take(storage: &dyn ResizableStorage) -> Option<ResizeHold> {
        let id = storage.storage_id();
        if id == 0 {
            return None;
        }
        with_python_still(|| {
            let mut held = HELD.lock();
            match held.iter_mut().find(|h| h.id == id) {
                Some(h) => h.holds += 1,
                None => {
                    held.push(Held { id, holds: 1, was_resizable: storage.resizable() });
                    storage.set_resizable(false);
                }
            }
        });
        Some(ResizeHold { id })
    }

    /// Lets go of this hold; the last one on the storage sets its flag
    /// back. `storage` is the one the hold was taken on.
    pub(crate) fn release(self, storage: &dyn ResizableStorage) {
        debug_assert_eq!(storage.storage_id(), self.id, "released on another storage");
        with_python_still(|| {
            let mut held = HELD.lock();
            let Some(at) = held.iter().position(|h| h.id == self.id) else { return };
            held[at].holds -= 1;
            if held[at].holds == 0 {
                let was_resizable = held.swap_remove(at).was_resizable;
                storage.set_resizable(was_resizable);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A storage stand-in: its address is its id.
    struct Fake {
        resizable: Cell<bool>,
    }

    impl ResizableStorage for Fake {
        fn storage_id(&self) -> usize {
            self as *const Fake as usize
        }
        fn resizable(&self) -> bool {
            self.resizable.get()
        }
        fn set_resizable(&self, resizable: bool) {
            self.resizable.set(resizable)
        }
    }

    /// Nested holds on one storage: unresizable until the last is released,
    /// in any order, then back to what it was; another storage is untouched;
    /// a storage that was not resizable stays so.
    #[test]
    fn a_storage_stays_unresizable_until_its_last_hold_is_released() {
        let a = Fake { resizable: Cell::new(true) };
        let b = Fake { resizable: Cell::new(true) };
        let first = ResizeHold::take(&a).expect("a storage");
        assert!(!a.resizable(), "held");
        let second = ResizeHold::take(&a).expect("a storage");
        assert!(b.resizable(), "another storage is not held");
        first.release(&a);
        assert!(!a.resizable(), "one hold is left");
        let b_hold = ResizeHold::take(&b).unwrap();
        second.release(&a);
        assert!(a.resizable(), "the last hold gave the flag back");
        assert!(!b.resizable());
        b_hold.release(&b);
        assert!(b.resizable());

        // Taken again after all were released: held again.
        let again = ResizeHold::take(&a).unwrap();
        assert!(!a.resizable());
        again.release(&a);
        assert!(a.resizable());

        let fixed = Fake { resizable: Cell::new(false) };
        let hold = ResizeHold::take(&fixed).unwrap();
        hold.release(&fixed);
        assert!(!fixed.resizable(), "a storage that was not resizable stays so");
        assert!(HELD.lock().iter().all(|h| ![a.storage_id(), b.storage_id(), fixed.storage_id()].contains(&h.id)));
    }

    /// No storage (a tensor without one): no hold.
    #[test]
    fn no_storage_no_hold() {
        struct NoStorage;
        impl ResizableStorage for NoStorage {
            fn storage_id(&self) -> usize {
                0
            }
            fn resizable(&self) -> bool {
                panic!("not asked")
            }
            fn set_resizable(&self, _: bool) {
                panic!("not set")
            }
        }
        assert!(ResizeHold::take(&NoStorage).is_none());
    }
}
