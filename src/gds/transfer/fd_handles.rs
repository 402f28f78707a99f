//! cuFile file-handle registrations shared by the transfers in flight.
//!
//! cuFile refuses to register one fd twice (`CU_FILE_HANDLE_ALREADY_REGISTERED`),
//! and two transfers through one caller-owned fd may run at once
//! (`async_pwrite(buffer, fd)` twice), so they share one registration; the
//! last one to finish deregisters it. An entry lives only while a transfer
//! runs, when the caller must keep the fd open, so a reused fd number never
//! meets a stale handle.
//!
//! `cuFileHandleRegister` can take milliseconds (it opens the file in the
//! nvidia-fs driver), so no lock is held across it or across the
//! deregistration: the fd's entry says "busy" meanwhile, transfers of other
//! fds go on, and a transfer of the same fd waits for that one call only.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::rt::sync::{Condvar, Mutex};

/// One fd's registration.
enum Slot<H> {
    /// Registered; the count of transfers using it.
    Ready(H, usize),
    /// One thread is registering or deregistering the fd; the others wait
    /// for its turn to end.
    Busy(Arc<Turn>),
}

/// A registration or deregistration in progress.
#[derive(Default)]
struct Turn {
    over: Mutex<bool>,
    ended: Condvar,
}

impl Turn {
    fn wait(&self) {
        let mut over = self.over.lock();
        while !*over {
            self.ended.wait(&mut over);
        }
    }

    fn end(&self) {
        *self.over.lock() = true;
        self.ended.notify_all();
    }
}

/// The registrations of the fds that transfers use now.
pub(crate) struct FdRegistrations<H> {
    slots: Mutex<BTreeMap<RawFd, Slot<H>>>,
}

impl<H: Copy> FdRegistrations<H> {
    pub(crate) const fn new() -> Self {
        FdRegistrations { slots: Mutex::new(BTreeMap::new()) }
    }

    /// The handle of `fd` for one more transfer: the one in use, or a new
    /// one from `register` (called without the lock held). A failed
    /// registration leaves nothing behind.
    pub(crate) fn acquire<E>(&self, fd: RawFd, register: impl FnOnce() -> Result<H, E>) -> Result<H, E> {
        let mut register = Some(register);
        loop {
            let turn = {
                let mut slots = self.slots.lock();
                match slots.get_mut(&fd) {
                    Some(Slot::Ready(handle, users)) => {
                        *users += 1;
                        return Ok(*handle);
                    }
                    Some(Slot::Busy(turn)) => turn.clone(),
                    None => {
                        let turn = Arc::new(Turn::default());
                        slots.insert(fd, Slot::Busy(turn.clone()));
                        drop(slots);
                        let register = register.take().expect("registers at most once");
                        return self.finish_turn(fd, &turn, register);
                    }
                }
            };
            turn.wait();
        }
    }

    /// Runs this fd's registration with the fd marked busy, then records it.
    fn finish_turn<E>(&self, fd: RawFd, turn: &Turn, register: impl FnOnce() -> Result<H, E>) -> Result<H, E> {
        let registered = catch_unwind(AssertUnwindSafe(register));
        {
            let mut slots = self.slots.lock();
            match &registered {
                Ok(Ok(handle)) => slots.insert(fd, Slot::Ready(*handle, 1)),
                _ => slots.remove(&fd),
            };
        }
        turn.end();
        registered.unwrap_or_else(|panic| resume_unwind(panic))
    }

    /// One transfer is done with `fd`; the last one deregisters it with
    /// `deregister` (called without the lock held).
    pub(crate) fn release(&self, fd: RawFd, deregister: impl FnOnce(H)) {
        let (handle, turn) = {
            let mut slots = self.slots.lock();
            let Some(Slot::Ready(handle, users)) = slots.get_mut(&fd) else { return };
            *users -= 1;
            if *users > 0 {
                return;
            }
            let handle = *handle;
            let turn = Arc::new(Turn::default());
            slots.insert(fd, Slot::Busy(turn.clone()));
            (handle, turn)
        };
        let deregistered = catch_unwind(AssertUnwindSafe(|| deregister(handle)));
        self.slots.lock().remove(&fd);
        turn.end();
        if let Err(panic) = deregistered {
            resume_unwind(panic);
        }
    }

    /// Fds with an entry (registered or busy), for tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    /// A registration of one fd that is slow (it waits for another fd's
    /// registration to happen) does not hold up the other fd: under one lock
    /// across the call this would wait forever (here: fail after 5 s).
    #[test]
    fn registrations_of_different_fds_run_at_the_same_time() {
        let regs = Arc::new(FdRegistrations::<u64>::new());
        let (seven_registered, wait_for_seven) = mpsc::channel::<()>();
        let slow = {
            let regs = regs.clone();
            std::thread::spawn(move || {
                regs.acquire(3, || {
                    wait_for_seven.recv_timeout(Duration::from_secs(5)).map(|()| 30u64).map_err(|_| "fd 7 waited")
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50)); // fd 3's registration is under way
        let seven = regs.acquire(7, || Ok::<u64, &str>(70)).unwrap();
        seven_registered.send(()).unwrap();
        assert_eq!(slow.join().unwrap(), Ok(30));
        assert_eq!(seven, 70);
        regs.release(3, |_| {});
        regs.release(7, |_| {});
        assert_eq!(regs.len(), 0);
    }

    /// Transfers of one fd share one registration: registered once,
    /// deregistered once, by the last to finish; a failed registration
    /// leaves nothing behind and the next transfer registers again.
    #[test]
    fn one_fd_is_registered_once_for_all_its_transfers() {
        let regs = Arc::new(FdRegistrations::<u64>::new());
        let registered = Arc::new(AtomicUsize::new(0));
        let deregistered = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (regs, registered) = (regs.clone(), registered.clone());
                std::thread::spawn(move || {
                    regs.acquire(5, || {
                        std::thread::sleep(Duration::from_millis(20));
                        Ok::<u64, ()>(50 + registered.fetch_add(1, Ordering::SeqCst) as u64)
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(50));
        }
        assert_eq!(registered.load(Ordering::SeqCst), 1);
        for _ in 0..8 {
            regs.release(5, |h| {
                assert_eq!(h, 50);
                deregistered.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert_eq!(deregistered.load(Ordering::SeqCst), 1);
        assert_eq!(regs.len(), 0);

        assert_eq!(regs.acquire(5, || Err::<u64, &str>("refused")), Err("refused"));
        assert_eq!(regs.len(), 0, "a failed registration leaves nothing behind");
        assert_eq!(regs.acquire(5, || Ok::<u64, &str>(51)), Ok(51));
        regs.release(5, |_| {});
        assert_eq!(regs.len(), 0);
    }
}
