//! The core's integration tests that can share one process: each module
//! was its own binary before (`core_errors`, ...). A module joins here only
//! if it reads nothing process-wide (peaks or counts of memory, descriptors
//! or threads), sets no environment variable and no RLIMIT, never forks and
//! locks little memory; the others stay binaries of their own, each saying
//! why at its top.
//!
//! tests/run-all.sh runs `errors`, `unaligned` and `knobs` again with
//! io_uring disabled: `cargo test --test core -- errors:: unaligned:: knobs::`.

// The helpers every test shares (src/test_support.rs).
use deepnvme::test_support as common;

mod block_devices;
mod errors;
mod huge_pages;
mod knobs;
mod robustness;
mod unaligned;
mod zram;
