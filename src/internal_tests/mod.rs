//! Tests of the core's internals (engines, slice plans, the bounce
//! decision, the handle's failure containment) on real files, real
//! io_uring and real mlock. They live inside the crate because what they
//! drive is crate-private; their helpers are the crate's `test_support`.

mod engines;
mod plans;
mod misuse;
mod robustness;
mod streams;
