//! The admission lock of a handle's ordering point (`order.rs`): one op
//! admitted at a time, each given the next sequence number. It knows its
//! holder, so that a call back into the handle from inside an admission (a
//! copier's callback) fails instead of waiting for itself.

use std::sync::atomic::{AtomicU64, Ordering};

use super::latch::thread_token;
use crate::error::{Error, Result};
use crate::rt::sync::{Mutex, MutexGuard};

/// The admission lock, which knows its holder so that a call back into the
/// handle from inside an admission fails instead of deadlocking.
#[derive(Default)]
pub(super) struct AdmissionLock {
    lock: Mutex<()>,
    holder: AtomicU64,
    next_seq: AtomicU64,
    /// Driven ops in the queue: admission looks for one to settle only then.
    driven: AtomicU64,
}

/// A held admission turn.
pub(super) struct AdmissionTurn<'a> {
    _guard: MutexGuard<'a, ()>,
    lock: &'a AdmissionLock,
}

impl Drop for AdmissionTurn<'_> {
    fn drop(&mut self) {
        self.lock.holder.store(0, Ordering::Release);
    }
}

impl AdmissionLock {
    pub(super) fn enter(&self) -> Result<AdmissionTurn<'_>> {
        let me = thread_token();
        if self.holder.load(Ordering::Acquire) == me {
            return Err(Error::InvalidArgument(
                "a call on this handle was made from inside the submission of another op on it (a copy or \
                 callback that submission ran): it cannot wait for itself"
                    .into(),
            ));
        }
        let guard = self.lock.lock();
        self.holder.store(me, Ordering::Release);
        Ok(AdmissionTurn { _guard: guard, lock: self })
    }

    /// The next op's sequence number (taken under a turn).
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// A driven op joined the queue (+1) or left it (-1).
    pub(super) fn count_driven(&self, joined: bool) {
        if joined {
            self.driven.fetch_add(1, Ordering::AcqRel);
        } else {
            self.driven.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether any driven op is in the queue.
    pub(super) fn any_driven(&self) -> bool {
        self.driven.load(Ordering::Acquire) > 0
    }

    /// The sequence number the last admitted op got (0: none yet).
    pub(super) fn last_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Acquire)
    }
}

