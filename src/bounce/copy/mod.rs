//! Host memory copies of the bounce path: `parallel_copy`, the one copy
//! between caller memory and a bounce buffer. Its parts: streaming
//! (non-temporal) stores for large copies (`streaming.rs`), and the
//! process's kept copy helpers, which take pieces of copies of 1 MiB and
//! more beside the calling thread (`helpers.rs`).

mod helpers;
mod streaming;

#[cfg(any(test, feature = "test-support"))]
pub(crate) use helpers::{helper_bytes, helper_count};

/// Copies `src` into `dst` (same length), sharing the pieces of a large
/// copy with the process's copy helpers (`helpers.rs`). It returns once
/// every byte is copied, by whichever thread.
pub(crate) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    // SAFETY: two slices of at least `n` bytes; a &mut never overlaps a &.
    unsafe { helpers::copy(dst.as_mut_ptr(), src.as_ptr(), n) };
}
