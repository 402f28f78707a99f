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

/// A front end's staging for movable host memory that can say where the
/// memory is now (the front ends' torch tensors): the engines may copy into
/// it only while the caller is in a call on the op. `moved` makes it report
/// another place (a tensor whose storage was swapped).
struct TrackedHost {
    ptr: *mut u8,
    len: usize,
    moved: Arc<AtomicBool>,
}
// SAFETY: the test keeps the memory alive until `wait()`.
unsafe impl Send for TrackedHost {}
impl Staging for TrackedHost {
    fn copy_to_bounce(&mut self, _bounce: &mut [u8]) -> Result<()> {
        panic!("contiguous host memory is copied by the core")
    }
    fn copy_from_bounce(&mut self, _bounce: &[u8]) -> Result<()> {
        panic!("contiguous host memory is copied by the core")
    }
    fn current_extent(&self) -> Option<(usize, usize)> {
        let moved = self.moved.load(Ordering::SeqCst);
        Some((self.ptr as usize + if moved { 4096 } else { 0 }, self.len))
    }
}

fn tracked_request<'a>(
    direction: Direction,
    path: &'a std::path::Path,
    dst: &mut [u8],
    moved: &Arc<AtomicBool>,
) -> OpRequest<'a> {
    let staging = TrackedHost { ptr: dst.as_mut_ptr(), len: dst.len(), moved: moved.clone() };
    OpRequest {
        direction,
        target: FileTarget::Path(path),
        file_offset: 0,
        buffer: heap_desc(dst),
        staging: Some(Box::new(staging)),
        validate: false,
    }
}

/// Memory at an odd address bounces (O_DIRECT needs alignment).
fn unaligned(v: &mut Vec<u8>, len: usize) -> &mut [u8] {
    v.resize(len + 1, 0);
    &mut v[1..]
}

/// Submits a blocking op over movable memory whose call is interrupted at
/// its first poll (as Ctrl-C does in a front end): the op stays in flight.
fn submit_interrupted_at_once(h: &deepnvme::IoHandle, direction: Direction, path: &std::path::Path, memory: &mut [u8]) {
    let moved = Arc::new(AtomicBool::new(false));
    let req = tracked_request(direction, path, memory, &moved);
    let mut interrupt = || Err(deepnvme::Error::Interrupted("test".into()));
    let r = h.submit_blocking_with(req, std::time::Duration::ZERO, &mut interrupt);
    assert!(r.is_err(), "the {direction:?} finished before the first poll; make it longer");
}

/// An async bounced read into movable memory writes nothing into it before
/// `wait()` (the caller may swap or free the storage until then), and all of
/// it in `wait()`; a storage swapped before `wait()` gets nothing at all.
#[test]
fn an_async_bounced_read_touches_movable_memory_only_inside_wait() {
    let dir = TempDir::new("gate-read");
    let len = 8 << 20;
    let data = pattern(31, len);
    let path = dir.file("r.bin");
    write_file(&path, &data);
    for engine in engines() {
        let h = handle_with(engine, 256 << 10, 8, false, true, 2);
        for swap in [false, true] {
            let mut backing = Vec::new();
            let dst = unaligned(&mut backing, len);
            dst.fill(0xEE);
            let moved = Arc::new(AtomicBool::new(false));
            assert_eq!(h.submit(tracked_request(Direction::Read, &path, dst, &moved), true).unwrap(), 0);
            // Long enough for the whole read to complete in the device.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let untouched = dst.iter().all(|&b| b == 0xEE);
            assert!(untouched, "{engine:?}: the read wrote into the caller's memory before wait()");
            moved.store(swap, Ordering::SeqCst);
            let waited = h.wait();
            if swap {
                assert!(waited.is_err(), "{engine:?}: a swapped buffer must fail its read");
                assert!(dst.iter().all(|&b| b == 0xEE), "{engine:?}: a swapped buffer got bytes");
            } else {
                assert_eq!(waited.unwrap(), 1);
                assert_bytes_eq(dst, &data, "buffer after wait()");
            }
        }
    }
}

/// A blocking bounced write copies the caller's bytes in block by block
/// while the call runs; when the call is interrupted (Ctrl-C in a front end)
/// it first copies in everything not yet copied, so the caller may reuse
/// its memory at once and the file still gets what was given.
#[test]
fn an_interrupted_blocking_write_writes_what_it_was_given() {
    let dir = TempDir::new("gate-write");
    let len = 32 << 20;
    let data = pattern(41, len);
    for engine in engines() {
        let h = handle_with(engine, 64 << 10, 4, false, true, 2);
        let path = dir.file(&format!("w-{engine:?}.bin"));
        let mut backing = Vec::new();
        let src = unaligned(&mut backing, len);
        src.copy_from_slice(&data);
        submit_interrupted_at_once(&h, Direction::Write, &path, src);
        src.fill(0); // the caller reuses its memory as soon as the call returned
        assert_eq!(h.wait().unwrap(), 1);
        assert_bytes_eq(&read_file(&path), &data, "file after an interrupted write");
    }
}

/// An interrupted blocking read stops writing into movable memory when the
/// call returns; the next `wait()` delivers every byte.
#[test]
fn an_interrupted_blocking_read_leaves_movable_memory_alone_until_wait() {
    let dir = TempDir::new("gate-read-int");
    let len = 32 << 20;
    let data = pattern(51, len);
    let path = dir.file("r.bin");
    write_file(&path, &data);
    for engine in engines() {
        let h = handle_with(engine, 64 << 10, 4, false, true, 2);
        let mut backing = Vec::new();
        let dst = unaligned(&mut backing, len);
        dst.fill(0xEE);
        submit_interrupted_at_once(&h, Direction::Read, &path, dst);
        let at_return = dst.to_vec();
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(dst == &at_return[..], "{engine:?}: bytes reached the caller's memory after the call returned");
        assert_eq!(h.wait().unwrap(), 1);
        assert_bytes_eq(dst, &data, "buffer after wait()");
    }
}
