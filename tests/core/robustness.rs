//! Regression tests for lifetimes and failure containment in the handle:
//! * the caller's handle on a direct (pinned) buffer lives until `wait()`
//!   finishes the op — torch must not free and reuse the memory under the I/O;
//! * a slice that panics fails its op (an error from `wait()`), it does not
//!   hang `wait()` or the handle's drop, and the handle keeps working;
//! * an async submit does not wait behind another thread's blocking call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::{OpRequest, Staging};
use deepnvme::{Direction, FileTarget, Result};

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
        assert_eq!(ds::submit(&h, req, true).unwrap(), 0);
        assert!(!released.load(Ordering::SeqCst), "{engine:?}: the tensor was let go while its op was in flight");
        assert_eq!(h.wait().unwrap(), 1);
        assert!(released.load(Ordering::SeqCst), "{engine:?}: the tensor was kept after the op finished");
        assert_bytes_eq(&read_file(&path), &data, "file after the write");
    }
}


/// A front end's staging for host memory that can move (a torch tensor):
/// the core must copy it only inside `hold_still`, which records the thread
/// it ran on.
struct MovableHost {
    holds: Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
}
impl Staging for MovableHost {
    fn copy_to_bounce(&mut self, _bounce: &mut [u8]) -> Result<()> {
        panic!("contiguous host memory is copied by the core")
    }
    fn copy_from_bounce(&mut self, _bounce: &[u8]) -> Result<()> {
        panic!("contiguous host memory is copied by the core")
    }
    fn hold_still(&self, access: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.holds.lock().unwrap().push(std::thread::current().id());
        access()
    }
}

/// A bounced read into memory that may move reaches it once, inside the
/// front end's `hold_still`, on the thread that waits: never from an I/O
/// thread (the heap corruption this guards against: a tensor whose storage
/// was swapped got the rest of its read written into freed memory).
#[test]
fn a_bounced_read_into_memory_that_may_move_is_copied_by_the_waiting_thread_while_held() {
    let dir = TempDir::new("movable");
    let len = (4 << 20) + 4094; // unaligned, divisible by the parallelism
    let data = pattern(21, len);
    let path = dir.file("m.bin");
    write_file(&path, &data);
    for engine in engines() {
        let h = handle_with(engine, 64 << 10, 8, false, true, 2);
        let mut dst = vec![0u8; len];
        let holds = Arc::new(std::sync::Mutex::new(Vec::new()));
        let req = OpRequest {
            direction: Direction::Read,
            target: FileTarget::Path(&path),
            file_offset: 0,
            buffer: heap_desc(&mut dst),
            staging: Some(Box::new(MovableHost { holds: holds.clone() })),
            validate: false,
        };
        assert_eq!(ds::submit(&h, req, true).unwrap(), 0);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(holds.lock().unwrap().is_empty(), "{engine:?}: copied before wait()");
        let waiter = std::thread::spawn({
            let h = &h as *const deepnvme::IoHandle as usize;
            // SAFETY: the handle outlives the join below.
            move || (std::thread::current().id(), unsafe { &*(h as *const deepnvme::IoHandle) }.wait().unwrap())
        });
        let (waiter_id, finished) = waiter.join().unwrap();
        assert_eq!(finished, 1);
        let holds = holds.lock().unwrap().clone();
        assert!(!holds.is_empty() && holds.iter().all(|t| *t == waiter_id), "{engine:?}: copies ran on {holds:?}, not the waiting thread");
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
    let r = ds::submit_polling(h, req, false, std::time::Duration::ZERO, &mut interrupt);
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
            assert_eq!(ds::submit(&h, tracked_request(Direction::Read, &path, dst, &moved), true).unwrap(), 0);
            // Long enough for the whole read to complete in the device.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let untouched = dst.iter().all(|&b| b == 0xEE);
            assert!(untouched, "{engine:?}: the read wrote into the caller's memory before wait()");
            moved.store(swap, Ordering::SeqCst);
            let waited = h.wait();
            if swap {
                let e = waited.expect_err("a swapped buffer must fail its read");
                let replaced = |e: &deepnvme::Error| {
                    matches!(e, deepnvme::Error::StorageReplaced { given, now, .. } if now.0 == given.0 + 4096)
                };
                let typed = replaced(&e) || matches!(&e, deepnvme::Error::Many { first, .. } if replaced(first));
                assert!(typed, "{engine:?}: the error says the storage was replaced, with both extents: {e:?}");
                assert!(dst.iter().all(|&b| b == 0xEE), "{engine:?}: a swapped buffer got bytes");
            } else {
                assert_eq!(waited.unwrap(), 1);
                assert_bytes_eq(dst, &data, "buffer after wait()");
            }
        }
    }
}

/// A blocking bounced write larger than a bounce window, interrupted (Ctrl-C
/// in a front end) as it starts: it still writes everything it was given
/// before the call returns the interruption, so the caller may reuse its
/// memory at once and nothing it wrote is lost; nothing stays pending.
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
        assert_bytes_eq(&read_file(&path), &data, "file after an interrupted write");
        assert_eq!(h.wait().unwrap(), 0, "{engine:?}: the write finished in its call");
    }
}

/// The same for a write straight from pinned memory (queued to the workers,
/// no bounce): the interrupted call returns only once its I/O has ended,
/// so reusing the memory at once changes nothing in the file.
#[test]
fn an_interrupted_blocking_write_of_pinned_memory_writes_what_it_was_given() {
    let dir = TempDir::new("gate-write-pinned");
    let len = 4 << 20; // within an 8 MiB RLIMIT_MEMLOCK; 1024 requests, still running at the first poll
    let data = pattern(43, len);
    for engine in engines() {
        // Small blocks, few in flight: the write is still running at the first poll.
        let h = handle_with(engine, 4096, 2, false, true, 2);
        let path = dir.file(&format!("w-{engine:?}.bin"));
        let mut src = Pinned::with(&data);
        let req = OpRequest {
            direction: Direction::Write,
            target: FileTarget::Path(&path),
            file_offset: 0,
            buffer: src.desc(),
            staging: None,
            validate: false,
        };
        let mut interrupt = || Err(deepnvme::Error::Interrupted("test".into()));
        let r = ds::submit_polling(&h, req, false, std::time::Duration::ZERO, &mut interrupt);
        assert!(
            matches!(r, Err(deepnvme::Error::Interrupted(_))),
            "{engine:?}: the interruption is returned (or the write beat the first poll: make it longer): {r:?}"
        );
        src.as_mut_slice().fill(0); // the caller reuses its memory as soon as the call returned
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_bytes_eq(&read_file(&path), &data, "file after an interrupted write of pinned memory");
        // Its I/O ended in the call; finishing it (closing, counting) is left to wait().
        assert!(h.wait().unwrap() <= 1, "{engine:?}: only the interrupted write was pending");
    }
}

/// An interrupted blocking read (larger than a bounce window) stops at its
/// next window and stays pending: once the call returns, nothing reaches
/// the caller's memory until the next `wait()`, which delivers every byte.
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
        assert_eq!(h.wait().unwrap(), 1, "{engine:?}: the interrupted read stays pending until wait()");
        assert_bytes_eq(dst, &data, "buffer after wait()");
    }
}
