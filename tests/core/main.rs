//! The core's integration tests that can share one process: each module
//! was its own binary before (`core_errors`, ...). A module joins here only
//! if it reads nothing process-wide (peaks or counts of memory, descriptors
//! or threads), sets no environment variable and no RLIMIT, never forks and
//! locks little memory; the others stay binaries of their own, each saying
//! why at its top.
//!
//! tests/run-all.sh runs `errors`, `unaligned` and `knobs` again with
//! io_uring disabled: `cargo test --test core -- errors:: unaligned:: knobs::`.

// The helpers every integration binary shares (tests/common/mod.rs).
#[path = "../common/mod.rs"]
mod common;

mod block_devices;
mod errors;
mod knobs;
mod robustness;
mod unaligned;

/// The generator gives the bytes the crate's internal tests' twin gives
/// (`test_support::the_generator_is_tests_commons_twin` pins the same).
#[test]
fn the_generator_is_test_supports_twin() {
    use common::{pattern, Rng};
    assert_eq!(pattern(1, 16), [122, 72, 33, 154, 226, 179, 131, 13, 103, 157, 254, 241, 121, 76, 196, 84]);
    assert_eq!(pattern(1, 5), pattern(1, 16)[..5], "a short tail takes the word's first bytes");
    let mut rng = Rng::new(0x9A7);
    let picks: Vec<usize> = (0..1000).map(|_| rng.range(3, 9)).collect();
    assert!(picks.iter().all(|&p| (3..=9).contains(&p)));
    assert!((3..=9).all(|v| picks.contains(&v)), "every value of the range comes up");
}
