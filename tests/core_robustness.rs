//! Regression tests for lifetimes and failure containment in the handle:
//! * the caller's handle on a direct (pinned) buffer lives until `wait()`
//!   finishes the op — torch must not free and reuse the memory under the I/O;
//! * a slice that panics fails its op (an error from `wait()`), it does not
//!   hang `wait()` or the handle's drop, and the handle keeps working;
//! * an async submit does not wait behind another thread's blocking call.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use deepnvme::{Direction, FileTarget, OpRequest, Result, Staging};

/// Stands for the torch glue's reference to a tensor: records when it is let go.
struct TensorRef {
    released: Arc<AtomicBool>,
}

impl Staging for TensorRef {
    fn copy_to_bounce(&mut self, _bounce: &mut [u8]) -> Result<()> {
        panic!("a pinned buffer must not bounce")
    }
    fn copy_from_bounce(&mut self, _bounce: &[u8]) -> Result<()> {
        panic!("a pinned buffer must not bounce")
    }
}

impl Drop for TensorRef {
    fn drop(&mut self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_direct_buffer_is_held_until_wait_finishes_the_op() {
    let dir = TempDir::new("keepalive");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        let data = pattern(11, 1 << 20);
        let src = Pinned::with(&data);
        let path = dir.file(&format!("k-{engine:?}.bin"));
        let released = Arc::new(AtomicBool::new(false));
        let req = OpRequest {
            direction: Direction::Write,
            target: FileTarget::Path(&path),
            file_offset: 0,
            buffer: src.desc(),
            staging: Some(Box::new(TensorRef { released: released.clone() })),
            validate: false,
        };
        assert_eq!(h.submit(req, true).unwrap(), 0);
        assert!(!released.load(Ordering::SeqCst), "{engine:?}: the tensor was let go while its op was in flight");
        assert_eq!(h.wait().unwrap(), 1);
        assert!(released.load(Ordering::SeqCst), "{engine:?}: the tensor was kept after the op finished");
        assert_bytes_eq(&read_file(&path), &data, "file after the write");
    }
}


/// A front end's staging for host memory that it cannot promise stays put
/// (the pyo3 front end's torch tensors): it neither says `memory_is_fixed`
/// nor reports a `current_extent`. Counts the copies it is asked to make.
struct MovableHost {
    ptr: *mut u8,
    len: usize,
    copies_out: Arc<std::sync::atomic::AtomicUsize>,
}
// SAFETY: the test keeps the memory alive and unaliased until `wait()`.
unsafe impl Send for MovableHost {}
impl Staging for MovableHost {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        bounce[..self.len].copy_from_slice(unsafe { std::slice::from_raw_parts(self.ptr, self.len) });
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        self.copies_out.fetch_add(1, Ordering::SeqCst);
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }.copy_from_slice(&bounce[..self.len]);
        Ok(())
    }
}

/// The engines copy a bounced read into the caller's memory block by block
/// only when the staging promises that memory cannot move. Otherwise the
/// bytes reach it once, at wait(), through the staging (the heap corruption
/// this guards against: a tensor whose storage was swapped got the rest of
/// its read written into freed memory).
#[test]
fn a_bounced_read_into_memory_that_may_move_goes_through_its_staging_at_wait() {
    let dir = TempDir::new("movable");
    let len = (4 << 20) + 4094; // unaligned, divisible by the parallelism
    let data = pattern(21, len);
    let path = dir.file("m.bin");
    write_file(&path, &data);
    for engine in engines() {
        let h = handle_with(engine, 64 << 10, 8, false, true, 2);
        let mut dst = vec![0u8; len];
        let copies_out = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let staging = MovableHost { ptr: dst.as_mut_ptr(), len, copies_out: copies_out.clone() };
        let req = OpRequest {
            direction: Direction::Read,
            target: FileTarget::Path(&path),
            file_offset: 0,
            buffer: heap_desc(&mut dst),
            staging: Some(Box::new(staging)),
            validate: false,
        };
        assert_eq!(h.submit(req, true).unwrap(), 0);
        assert_eq!(h.wait().unwrap(), 1);
        assert_eq!(copies_out.load(Ordering::SeqCst), 1, "{engine:?}: the read did not go through the staging");
        assert_bytes_eq(&dst, &data, "buffer after the read");
    }
}
