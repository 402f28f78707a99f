//! io_uring fixed buffers: long-lived memory that a worker's ring registers
//! once (the kernel pins its pages at registration), so that every read or
//! write into it is a READ_FIXED / WRITE_FIXED that skips the per-request
//! page pinning and unpinning a plain READ / WRITE does: on fast devices
//! that pinning is what bounds a ring (fio's `--fixedbufs`, docs/perf/history.md).
//!
//! What may be registered carries a [`RegistrableMemory`] token: the pinned
//! manager's regions and the bounce pool's buffers, whose lifetimes deepnvme
//! owns (memory the caller merely declares pinned, like a torch pinned
//! tensor, is never registered: its free would go unseen). A token's id is
//! unique in the process, so a registration can never be taken for a later
//! mapping at the same address: a ring looks registrations up by (token id,
//! 1 GiB chunk) and keeps only a `Weak` to the token.
//!
//! When a token is dropped (its memory unmapped) after some ring registered
//! it, every registered [`RetireListener`] (each io_uring worker) is told;
//! the worker then unregisters the slots whose token is gone, so the kernel
//! lets go of those pages even while the handle stays idle. Until then the
//! pages stay pinned by the kernel, never reused under the ring: a stale
//! slot costs memory for a moment, never data.
//!
//! Registration failing (an old kernel without sparse tables, RLIMIT_MEMLOCK
//! for an unprivileged user, [`knobs::FIXED_BUFFERS_ENV`]`=0`) turns fixed
//! buffers off for that ring, which then does plain reads and writes.
//!
//! `fork()`: the kernel copies pinned anonymous pages into a child at once
//! (instead of sharing them copy-on-write), so a registration alive at fork
//! would give every child (a DataLoader worker, say) its own copy of all the
//! registered memory. The fork handler (`rt/fork.rs`) therefore empties every
//! ring's table first: a run over registrable memory holds its ring's table
//! from its first request to its last completion, but while a fork is
//! pending ([`fork_pending`]) it sends nothing more and, once its in-flight
//! requests have completed, lets go of the table until the fork is done
//! (`uring/`); the handler unregisters every buffer meanwhile, and nothing
//! registers until the fork is done ([`FixedTable::index_for`]). Rings
//! register again, lazily, on their next request. A ring whose table the
//! handler cannot get in time (requests stuck in a dead device) is left
//! registered: its pages are copied into the child, which is slower, never
//! wrong. This is why worker rings with fixed buffers are not
//! `SINGLE_ISSUER`: the forking thread must be allowed to unregister.
//!
//! Bounce buffers become registrable only once the pool keeps them for reuse
//! (a buffer used for one op and unmapped would cost a registration per op).

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use io_uring::IoUring;

use crate::knobs;
use crate::rt::sync::{Mutex, MutexGuard};

/// Whether a fork is pending (see `rt/fork.rs`); streams start no further op.
pub(crate) use crate::rt::fork::fork_pending;

/// Memory that io_uring rings may register. Dropped when the memory is
/// unmapped (or later, by the last op that held it).
#[derive(Debug)]
pub(crate) struct RegistrableMemory {
    id: u64,
    base: usize,
    len: usize,
    /// Some ring registered it: its drop must wake the workers.
    registered: AtomicBool,
    /// Worth registering: it is kept for many ops.
    reusable: AtomicBool,
}

impl RegistrableMemory {
    /// A token for `len` bytes at `base`, with a fresh id; `reusable` says
    /// whether rings may register it yet (see [`Self::mark_reusable`]).
    pub fn new(base: usize, len: usize, reusable: bool) -> Arc<RegistrableMemory> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Arc::new(RegistrableMemory {
            id,
            base,
            len,
            registered: AtomicBool::new(false),
            reusable: AtomicBool::new(reusable),
        })
    }

    /// The memory will be used again (a bounce buffer the pool keeps).
    pub fn mark_reusable(&self) {
        self.reusable.store(true, Ordering::Relaxed);
    }

    /// The chunk of this memory holding all of `[addr, addr + len)`, as
    /// (chunk index, chunk base, chunk length); `None` when the range is not
    /// inside one chunk.
    fn chunk_of(&self, addr: usize, len: usize) -> Option<(u32, usize, usize)> {
        let offset = addr.checked_sub(self.base)?;
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let chunk = offset / knobs::FIXED_BUFFER_CHUNK;
        let chunk_start = chunk * knobs::FIXED_BUFFER_CHUNK;
        let chunk_len = (self.len - chunk_start).min(knobs::FIXED_BUFFER_CHUNK);
        (end <= chunk_start + chunk_len).then_some((chunk as u32, self.base + chunk_start, chunk_len))
    }
}

impl Drop for RegistrableMemory {
    fn drop(&mut self) {
        if self.registered.load(Ordering::Acquire) {
            notify_retired();
        }
    }
}

/// Told when registered memory went away, to unregister it soon.
pub(crate) trait RetireListener: Send + Sync {
    fn memory_retired(&self);
}

type Listeners = Vec<(u32, Weak<dyn RetireListener>)>;
type Tables = Vec<(u32, Weak<Mutex<FixedTable>>)>;

/// The listeners, each with the process it was added in: a child of
/// `fork()` inherits the list, but not the workers behind it. Held across
/// `fork()` by the fork handler, like `TABLES` (see `rt/fork.rs`).
static LISTENERS: Mutex<Listeners> = Mutex::new(Vec::new());
/// Every live table with the process whose ring it is, for the fork handler
/// (outside the table's lock: a child may inherit a table locked for good).
static TABLES: Mutex<Tables> = Mutex::new(Vec::new());

/// Adds a listener for as long as it lives.
pub(crate) fn add_retire_listener(listener: Weak<dyn RetireListener>) {
    let pid = std::process::id();
    let mut listeners = LISTENERS.lock();
    listeners.retain(|(added_in, l)| *added_in == pid && l.strong_count() > 0);
    listeners.push((pid, listener));
}

fn notify_retired() {
    let pid = std::process::id();
    let live: Vec<Arc<dyn RetireListener>> = {
        let mut listeners = LISTENERS.lock();
        listeners.retain(|(added_in, l)| *added_in == pid && l.strong_count() > 0);
        listeners.iter().filter_map(|(_, l)| l.upgrade()).collect()
    };
    // Called outside the lock: a listener may do anything but call back in.
    for listener in live {
        listener.memory_retired();
    }
}

/// `io_uring_register` opcode: drop the whole buffer table (kernel ABI, 5.1+).
const IORING_UNREGISTER_BUFFERS: libc::c_uint = 1;

/// For the fork handler (`rt/fork.rs`): waits, until `deadline` at most, for
/// each of this process's rings to let go of its table (a run over
/// registered memory does once its in-flight requests have completed, a
/// fork being pending), and unregisters all its buffers. Only this
/// process's rings: a child of an earlier fork inherited the parent's table
/// list and ring descriptors, and unregistering through those would empty
/// the parent's tables under its requests. The tables are not held across
/// the fork: nothing registers while it is pending.
pub(crate) fn empty_tables_for_fork(deadline: Instant) -> crate::rt::fork::Held {
    let pid = std::process::id();
    let tables: Vec<Arc<Mutex<FixedTable>>> =
        TABLES.lock().iter().filter(|(owner, _)| *owner == pid).filter_map(|(_, t)| t.upgrade()).collect();
    for table in tables {
        if let Some(mut table) = table.try_lock_until(deadline) {
            table.unregister_all();
        }
    }
    None
}

/// The listener and table lists, held across `fork()` by the fork handler
/// (so that no other thread is inside them at the fork, and a child's new
/// handle can take them).
struct ListsHeld {
    _tables: MutexGuard<'static, Tables>,
    _listeners: MutexGuard<'static, Listeners>,
}

/// Takes the lists for the fork handler (`LISTENERS`, then `TABLES`).
pub(crate) fn hold_lists_for_fork(_: Instant) -> crate::rt::fork::Held {
    let listeners = LISTENERS.lock();
    let tables = TABLES.lock();
    Some(Box::new(ListsHeld { _tables: tables, _listeners: listeners }))
}

/// One registered slot of a ring's table.
struct Slot {
    key: (u64, u32),
    memory: Weak<RegistrableMemory>,
    /// The run that last used it (slots used by the current run are never
    /// replaced: its requests in flight name them).
    last_run: u64,
}

/// A ring's fixed-buffer table, set up (sparse) on first use. Shared with
/// the fork handler (see the module doc); the ring's run holds its lock.
pub(crate) struct FixedTable {
    slots: Vec<Option<Slot>>,
    by_key: HashMap<(u64, u32), usize>,
    ready: bool,
    disabled: bool,
    run: u64,
    /// The ring's descriptor while the ring lives (the fork handler's way in).
    ring_fd: Option<RawFd>,
    /// Chunks the kernel refused to register (not tried again).
    refused: HashMap<(u64, u32), Weak<RegistrableMemory>>,
    /// Registrations refused in a row; fixed buffers go off for this ring at
    /// [`MAX_REFUSALS`].
    refusals: u32,
}

/// Registrations refused in a row before a ring stops trying.
const MAX_REFUSALS: u32 = 3;


impl FixedTable {
    /// A table for `ring`, or `None` when fixed buffers are switched off.
    pub fn for_ring(ring: &IoUring) -> Option<Arc<Mutex<FixedTable>>> {
        if !knobs::settings().fixed_buffers {
            return None;
        }
        use std::os::fd::AsRawFd;
        let table = Arc::new(Mutex::new(FixedTable {
            slots: Vec::new(),
            by_key: HashMap::new(),
            ready: false,
            disabled: false,
            run: 0,
            ring_fd: Some(ring.as_raw_fd()),
            refused: HashMap::new(),
            refusals: 0,
        }));
        crate::rt::fork::install();
        let pid = std::process::id();
        let mut tables = TABLES.lock();
        tables.retain(|(owner, t)| *owner == pid && t.strong_count() > 0);
        tables.push((pid, Arc::downgrade(&table)));
        Some(table)
    }

    /// The ring is closing, idle: lets go of its buffers now (a forked
    /// child may hold the ring's descriptor, and with it the ring, for
    /// long), and keeps the fork handler away from the descriptor.
    pub fn ring_closing(&mut self) {
        self.unregister_all();
        self.ring_fd = None;
    }

    /// Unregisters everything (with the lock held, nothing in flight). On a
    /// failure the table is left as it is (the ring still holds them).
    fn unregister_all(&mut self) {
        let Some(fd) = self.ring_fd.filter(|_| self.ready) else { return };
        for _ in 0..8 {
            // SAFETY: `fd` is this table's live ring (cleared before it
            // closes); unregistering takes no memory from us.
            let rc = unsafe {
                libc::syscall(libc::SYS_io_uring_register, fd, IORING_UNREGISTER_BUFFERS, std::ptr::null::<u8>(), 0)
            };
            if rc == 0 {
                self.slots.clear();
                self.by_key.clear();
                self.ready = false;
                return;
            }
            if crate::error::last_errno() != libc::EINTR {
                return;
            }
        }
    }

    /// Marks the start of a run: slots this run uses are kept until the next.
    pub fn start_run(&mut self) {
        self.run += 1;
    }

    fn give_up(&mut self, what: &str, err: std::io::Error) {
        self.disabled = true;
        crate::rt::log::info_once(
            "fixed-buffers-off",
            &format!("io_uring fixed buffers are off ({what}: {err}); requests pin their pages one by one"),
        );
    }

    /// The table index to name in a READ_FIXED / WRITE_FIXED of `[addr,
    /// addr + len)` inside `memory`, registering its chunk first when no slot
    /// holds it yet; `None` when the request must be a plain one.
    pub fn index_for(&mut self, ring: &IoUring, memory: &Arc<RegistrableMemory>, addr: usize, len: usize) -> Option<u16> {
        if self.disabled || !memory.reusable.load(Ordering::Relaxed) {
            return None;
        }
        let (chunk, chunk_base, chunk_len) = memory.chunk_of(addr, len)?;
        let key = (memory.id, chunk);
        if let Some(&index) = self.by_key.get(&key) {
            let slot = self.slots[index].as_mut().expect("a keyed slot is occupied");
            slot.last_run = self.run;
            return Some(index as u16);
        }
        if self.refused.contains_key(&key) {
            return None;
        }
        // The fork handler empties the tables while a fork is pending, and
        // they must stay empty until the fork is done (see `rt/fork.rs`).
        if fork_pending() {
            return None;
        }
        if !self.ready {
            if let Err(e) = ring.submitter().register_buffers_sparse(knobs::FIXED_BUFFER_SLOTS) {
                self.give_up("IORING_REGISTER_BUFFERS2 (sparse)", e);
                return None;
            }
            self.slots = (0..knobs::FIXED_BUFFER_SLOTS).map(|_| None).collect();
            self.ready = true;
        }
        let index = self.victim()?;
        let iov = libc::iovec { iov_base: chunk_base as *mut libc::c_void, iov_len: chunk_len };
        // SAFETY: the chunk is mapped memory that `memory` describes; the
        // kernel pins its pages now and keeps them until the slot is
        // replaced or the ring closes, so a later unmap cannot pull them
        // out from under a request.
        if let Err(e) = unsafe { ring.submitter().register_buffers_update(index as u32, &[iov], None) } {
            // ENOMEM: pinning more would pass RLIMIT_MEMLOCK. The slot keeps
            // what it had; this chunk goes as plain requests from now on.
            self.refused.insert(key, Arc::downgrade(memory));
            self.refusals += 1;
            if self.refusals >= MAX_REFUSALS {
                self.give_up("IORING_REGISTER_BUFFERS_UPDATE", e);
            }
            return None;
        }
        self.refusals = 0;
        if let Some(old) = self.slots[index].take() {
            self.by_key.remove(&old.key);
        }
        memory.registered.store(true, Ordering::Release);
        self.slots[index] = Some(Slot { key, memory: Arc::downgrade(memory), last_run: self.run });
        self.by_key.insert(key, index);
        Some(index as u16)
    }

    /// A slot to (re)use: an empty one, else one whose memory is gone, else
    /// the least recently used one not named by the current run.
    fn victim(&self) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (index, slot) in self.slots.iter().enumerate() {
            match slot {
                None => return Some(index),
                Some(s) if s.memory.strong_count() == 0 => return Some(index),
                Some(s) if s.last_run != self.run && best.is_none_or(|(_, run)| s.last_run < run) => {
                    best = Some((index, s.last_run))
                }
                Some(_) => {}
            }
        }
        best.map(|(index, _)| index)
    }

    /// Empties `index` in the kernel's table and in ours (in ours only when
    /// the kernel did: else the next release tries again).
    fn clear_slot(&mut self, ring: &IoUring, index: usize) {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        // SAFETY: an empty iovec registers nothing; it releases the pages.
        if unsafe { ring.submitter().register_buffers_update(index as u32, &[empty], None) }.is_ok() {
            if let Some(old) = self.slots[index].take() {
                self.by_key.remove(&old.key);
            }
        }
    }

    /// Unregisters every slot whose memory is gone. Called between runs.
    pub fn release_retired(&mut self, ring: &IoUring) {
        self.refused.retain(|_, memory| memory.strong_count() > 0);
        let stale: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].as_ref().is_some_and(|s| s.memory.strong_count() == 0))
            .collect();
        for index in stale {
            self.clear_slot(ring, index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_memory_at_1_gib_and_refuse_ranges_across_a_boundary() {
        let gib = knobs::FIXED_BUFFER_CHUNK;
        let memory = RegistrableMemory::new(0x10_0000_0000, 2 * gib + 4096, true);
        let base = memory.base;
        assert_eq!(memory.chunk_of(base, 4096), Some((0, base, gib)));
        assert_eq!(memory.chunk_of(base + gib, 1 << 20), Some((1, base + gib, gib)));
        assert_eq!(memory.chunk_of(base + 2 * gib, 4096), Some((2, base + 2 * gib, 4096)));
        assert_eq!(memory.chunk_of(base + gib - 4096, 8192), None, "a range across chunks is a plain request");
        assert_eq!(memory.chunk_of(base + 2 * gib, 8192), None, "past the end");
        assert_eq!(memory.chunk_of(base - 1, 1), None, "before the start");
    }

    #[test]
    fn tokens_never_share_an_id() {
        let a = RegistrableMemory::new(4096, 4096, true);
        let b = RegistrableMemory::new(4096, 4096, true);
        assert_ne!(a.id, b.id, "the same address must get a new id");
    }
}
