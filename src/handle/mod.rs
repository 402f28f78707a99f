//! The DeepNVMe handle (`deepspeed_io_handle_t` without torch).
//!
//! A handle owns `intra_op_parallelism` worker threads, each with its own
//! engine (its own io_uring ring). A parallel op is cut into one slice per
//! worker; every worker gets its slice, and the op completes when all have
//! run. Ops are kept in submission order; `wait()` finishes them in that
//! order (validation, bounce copy-back, closing the files the handle opened)
//! and returns how many it finished — 0 when nothing was pending.
//!
//! **Order.** Ops on one handle take effect in submission order wherever
//! they share caller memory or file bytes and one of them writes there
//! (`op/caller.rs` states the rule): submitting an op first settles the
//! pending ops on the same memory (their slices end, a bounced read's bytes
//! are copied out, on the submitting thread), and an op's slices start only
//! once earlier ops on the same file bytes have run theirs (`after`). A
//! blocking op on bounced memory larger than a window first finishes every
//! pending op, then streams through the bounce windows (`bounce/window.rs`).
//!
//! A worker with an io_uring ring streams back-to-back ops (`QueuedRuns`):
//! the slices queued behind the one it runs start in the ring's slots as
//! they free up, instead of after the ring drains, except where a queued
//! slice shares bytes of a file with a started one and either writes.
//!
//! As in DeepSpeed, a blocking call (`sync_*`, `pread/pwrite(async=False)`)
//! submits and then waits for *every* pending op, and returns that count;
//! blocking calls and `wait()` are serialised per handle so that two threads
//! blocking on one handle each get their own count. A small blocking op
//! with nothing pending runs on the calling thread instead (no hand-off to
//! a worker and back): as plain pread/pwrite when it is one block, else on
//! the handle's calling-thread ring. Every ring is made before `new`
//! returns, so a handle holds the same descriptors from `new` to drop.
//!
//! Errors never abort: a failed slice fails its op, and `wait()` reports it
//! after finishing every other op. Dropping a handle finishes what is still
//! in flight (logging any failure), then stops and joins its workers.
//!
//! A handle belongs to the process that created it: in a child made by
//! fork() (which inherits the handle but none of its threads) every call
//! fails at once saying so, and dropping it leaks its parts instead of
//! waiting for threads that do not exist there.
//!
//! The handle's public methods are the Rust API (`read_into`/`write_from`,
//! `scope`, `submit_read`/`submit_write` and `wait`, statistics, GDS
//! registration); DeepSpeed's calls (`pread`/`pwrite` with `is_async`,
//! whole requests, `read`/`write`, `aio_read`) are `pub(crate)` and reached
//! from outside only through `crate::deepspeed`.
//!
//! One concern per file, each with the `impl IoHandle` methods of its
//! concern: `construction` (the handle's parts, `new`, `new_gds`, drop, the
//! process it belongs to), `reporting` (knobs, engine, pending ops,
//! statistics), `borrowed` (`read_into`/`write_from`), `owned` (owned
//! buffers, `submit_read`/`submit_write`, `Pending`), `scoped` (async ops
//! on borrowed memory), `device` (GDS routing), `registration` (GDS buffer
//! registration), `order`
//! (the one ordering point and the waits on its order) with `admission`
//! (its lock and sequence numbers), `submit` (the entry points that admit
//! and run ops), `outcome` (what a call reports), `latch` (an op in
//! flight, driven and parked ops), `workers` (threads and op streams),
//! `calling_thread` (ops on the caller's thread) and `windowed` (blocking
//! ops through bounce windows on the workers).

mod admission;
mod borrowed;
mod calling_thread;
mod construction;
mod device;
mod latch;
mod order;
mod outcome;
mod owned;
mod registration;
mod reporting;
mod scoped;
mod submit;
mod windowed;
mod workers;

pub use construction::IoHandle;
pub use owned::Pending;
pub use scoped::OpScope;
#[cfg(any(test, feature = "test-support", feature = "python"))]
pub(crate) use order::LAST_ADMITTED;
