//! The io_uring engine: one ring per worker thread, `queue_depth` slots.
//!
//! AioParams keep DeepSpeed's meaning:
//! * `overlap_events = false`: push a batch of up to `queue_depth` pieces,
//!   wait until all of them (and any resubmitted remainders) complete, repeat;
//! * `overlap_events = true`: keep the ring topped up, reaping at least one
//!   completion at a time and refilling the freed slots at once;
//! * `single_submit = true`: one `io_uring_enter` submit per piece; else one
//!   per batch (or per refill).
//!
//! A worker's ring also runs streams (`Engine::run_stream`): runs of
//! several queued ops in flight at once, each checked and reported on its
//! own, so that the ring does not drain between back-to-back ops.
//!
//! Every completion is checked. A short transfer resubmits its remainder,
//! EINTR/EAGAIN resubmit the same piece, and any other result stops new
//! submissions; the engine still drains what is in flight (the kernel may be
//! writing into those buffers) before it reports the first error.
//!
//! Files: `ring.rs` (the ring, its slots and its primitives: push, submit,
//! reap, drain, and how a completion settles its piece), `run.rs` (the
//! `Engine` impl and one run of pieces), `stream.rs` (back-to-back runs).

mod ring;
mod run;
mod stream;

pub(crate) use ring::probe;
pub use ring::UringEngine;
