//! The crate's locks: `std::sync`'s, behind the part of parking_lot's API
//! this crate used (no poisoning, `Condvar::wait(&mut guard)`, deadlines),
//! so that a file switches by its `use` line alone.
//!
//! Why not parking_lot: a child made by `fork()` must be able to take a lock
//! that some other thread of the parent was waiting for at the fork (see
//! `fork.rs`). parking_lot parks waiting threads in a process-wide hash table
//! of buckets, each guarded by an internal word lock, and an unlock may hand
//! the lock to a parked thread directly ("eventual fairness"): the child
//! inherits that table, with entries (and bucket locks held) for threads
//! that do not exist in it, so it can deadlock on a fresh lock or lose a
//! wake-up. std's futex-based `Mutex`, `Condvar` and `RwLock` keep all their
//! state in the lock's own atomic words, so a lock that is free in the child
//! is usable there, whatever the parent's other threads were doing.
//!
//! A poisoned lock (a thread panicked holding it) is taken as it is, as
//! parking_lot does: every caller here keeps its data consistent across its
//! own panics, or catches them (`catch_unwind` in the workers).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{PoisonError, TryLockError};
use std::time::{Duration, Instant};

pub use std::sync::{RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

/// `std::sync::Mutex` without poisoning.
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// A held [`Mutex`]. (An `Option` only so that [`Condvar::wait`] can hand
/// the std guard to std's condvar and take it back: always `Some` outside it.)
pub struct MutexGuard<'a, T: ?Sized>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(MutexGuard(Some(guard))),
            Err(TryLockError::Poisoned(p)) => Some(MutexGuard(Some(p.into_inner()))),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The lock, if it can be had by `deadline`. std has no timed lock, so
    /// this polls, with pauses growing from 10 µs to 1 ms (only the fork
    /// handler waits this way).
    pub fn try_lock_until(&self, deadline: Instant) -> Option<MutexGuard<'_, T>> {
        let mut pause = Duration::from_micros(10);
        loop {
            if let Some(guard) = self.try_lock() {
                return Some(guard);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("a guard holds its lock")
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("a guard holds its lock")
    }
}

/// `std::sync::Condvar` with parking_lot's `wait(&mut guard)`.
#[derive(Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Unlocks `guard`'s mutex, sleeps until notified (or woken
    /// spuriously), and locks it again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.0.take().expect("a guard holds its lock");
        guard.0 = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
    }

    /// As [`Condvar::wait`], giving up at `deadline`.
    pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) -> WaitTimeoutResult {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let held = guard.0.take().expect("a guard holds its lock");
        let (held, result) = self.0.wait_timeout(held, timeout).unwrap_or_else(PoisonError::into_inner);
        guard.0 = Some(held);
        result
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }

    pub fn notify_one(&self) {
        self.0.notify_one();
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// `std::sync::RwLock` without poisoning.
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> Self {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_taken_as_it_is() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock();
            *g = 2;
            panic!("poisoning it");
        })
        .join();
        assert_eq!(*m.lock(), 2);
        assert_eq!(*m.try_lock().expect("free"), 2);
        let rw = Arc::new(RwLock::new(3));
        let rw2 = rw.clone();
        let _ = std::thread::spawn(move || {
            let _g = rw2.write();
            panic!("poisoning it");
        })
        .join();
        assert_eq!(*rw.read(), 3);
        *rw.write() = 4;
        assert_eq!(*rw.read(), 4);
    }

    #[test]
    fn condvar_waits_hand_the_guard_back_and_deadlines_time_out() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let pair2 = pair.clone();
        let t = std::thread::spawn(move || {
            *pair2.0.lock() = true;
            pair2.1.notify_all();
        });
        let mut ready = pair.0.lock();
        while !*ready {
            pair.1.wait(&mut ready);
        }
        assert!(*ready);
        drop(ready);
        t.join().unwrap();
        let mut g = pair.0.lock();
        let started = Instant::now();
        let r = pair.1.wait_until(&mut g, started + Duration::from_millis(20));
        assert!(r.timed_out() && started.elapsed() >= Duration::from_millis(20));
        assert!(*g, "the guard still reads the value after a timed-out wait");
        let r = pair.1.wait_until(&mut g, started);
        assert!(r.timed_out(), "a deadline already past times out at once");
    }

    #[test]
    fn try_lock_until_gives_up_at_its_deadline_and_gets_a_lock_let_go_before_it() {
        let m = Arc::new(Mutex::new(()));
        let held = m.lock();
        let started = Instant::now();
        assert!(m.try_lock_until(started + Duration::from_millis(20)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(20));
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.try_lock_until(Instant::now() + Duration::from_secs(10)).is_some());
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert!(t.join().unwrap());
    }
}
