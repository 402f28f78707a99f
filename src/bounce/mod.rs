//! The bounce path, in one folder: what a caller's memory goes through when
//! it cannot take direct I/O (not page-locked, not contiguous host memory).
//!
//! * `pool.rs`: bounce buffers, sized to the op (page-rounded),
//!   pre-faulted, reused by size, drawn from the process-wide budget
//!   (`DEEPNVME_BOUNCE_MAX_MB`).
//! * `copy/`: the copies between a bounce buffer and the caller's memory:
//!   one thread's streaming copy, and the process's kept copy helpers that
//!   take pieces of a large copy beside the calling thread.
//! * `window.rs`: a blocking bounced op larger than one window, streamed
//!   through bounded windows on the handle's workers (`WindowedOp`), copying
//!   between windows on the calling thread.
//! * `read_ahead.rs`: how many of a bounced read's windows are in flight.
//!
//! The rule these copies obey (the ownership rule, and the order ops take
//! effect in) is written once, in `op/caller.rs`, beside the op it governs;
//! the ordering point that enforces the order is `handle/order.rs`. A
//! windowed op's life: `op/mod.rs` decides it bounces and builds the
//! `WindowedOp` (`window.rs`), `handle/windowed.rs` admits it and runs its
//! chunks on the workers, and `window.rs` copies each window in or out,
//! `read_ahead.rs` deciding how far the reads run ahead.

pub(crate) mod copy;
pub(crate) mod pool;
pub(crate) mod read_ahead;
pub(crate) mod window;

pub(crate) use pool::{hold_for_fork, BounceBuffer, Purpose};
