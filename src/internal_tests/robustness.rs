//! Failure containment in the handle: a slice that panics fails its op
//! without hanging `wait()` or the handle, and an async submit never waits
//! behind another thread's blocking call.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::test_support::*;
use crate::engine::Engine;
use crate::op::work::{OpCompletion, OpWork, PreparedOp};
use crate::{Error, FileTarget, Result};

/// A slice that panics on the worker.
struct PanickingWork;

impl OpWork for PanickingWork {
    fn slice_count(&self) -> usize {
        2
    }
    fn run_slice(&self, index: usize, _engine: &mut dyn Engine) -> Result<()> {
        if index == 1 {
            panic!("injected panic in slice 1");
        }
        Ok(())
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        Error::Engine(format!("slice {index}: {detail}"))
    }
}

struct CountFinish(Arc<AtomicUsize>);

impl OpCompletion for CountFinish {
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        outcome
    }
}

#[test]
fn a_panicking_slice_fails_its_op_without_hanging_the_handle() {
    let dir = TempDir::new("panic");
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, false, 2);
        let finished = Arc::new(AtomicUsize::new(0));
        let op = PreparedOp { work: Arc::new(PanickingWork), completion: Box::new(CountFinish(finished.clone())), meta: Default::default() };
        assert_eq!(h.dispatch_prepared(op, true).unwrap(), 0);
        let err = h.wait().expect_err("the panicking op must fail");
        let msg = err.to_string();
        assert!(msg.contains("panic") && msg.contains("injected panic in slice 1"), "{msg}");
        assert_eq!(finished.load(Ordering::SeqCst), 1, "the op was finished once");
        // The worker that panicked got a fresh engine and still works.
        let data = pattern(3, 64 << 10);
        let src = Pinned::with(&data);
        let path = dir.file(&format!("after-{engine:?}.bin"));
        assert_eq!(h.pwrite(src.desc(), FileTarget::Path(&path), 0, false).unwrap(), 1);
        assert_bytes_eq(&read_file(&path), &data, "write after the panic");
    }
}

/// Records the thread each slice ran on, and the engine kind it ran with.
struct ThreadRecordingWork(Arc<crate::rt::sync::Mutex<Vec<(std::thread::ThreadId, crate::engine::EngineKind)>>>);

impl OpWork for ThreadRecordingWork {
    fn slice_count(&self) -> usize {
        2
    }
    fn run_slice(&self, _index: usize, engine: &mut dyn Engine) -> Result<()> {
        self.0.lock().push((std::thread::current().id(), engine.kind()));
        Ok(())
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        Error::Engine(format!("slice {index}: {detail}"))
    }
}

/// A small blocking op with nothing pending runs on the calling thread (no
/// hand-off to a worker and back); a large one, or one queued behind an
/// async op, goes to the workers; a panic in an inline run fails the op and
/// the next op still runs.
#[test]
fn small_blocking_ops_run_on_the_calling_thread_and_the_rest_on_workers() {
    use crate::op::work::OpMeta;
    let me = std::thread::current().id();
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        let meta = |bytes: usize| OpMeta { bytes: bytes as u64, may_run_inline: true, ..Default::default() };
        let most = crate::knobs::INLINE_MAX_BYTES;
        let cases = [(4096, false, true), (most, false, true), (most + 1, false, false), (4096, true, false)];
        for (bytes, is_async_first, inline) in cases {
            let finished = Arc::new(AtomicUsize::new(0));
            if is_async_first {
                let threads = Arc::new(crate::rt::sync::Mutex::new(Vec::new()));
                let work = Arc::new(ThreadRecordingWork(threads));
                let op = PreparedOp { work, completion: Box::new(CountFinish(finished.clone())), meta: meta(bytes) };
                assert_eq!(h.dispatch_prepared(op, true).unwrap(), 0);
            }
            let threads = Arc::new(crate::rt::sync::Mutex::new(Vec::new()));
            let work = Arc::new(ThreadRecordingWork(threads.clone()));
            let op = PreparedOp { work, completion: Box::new(CountFinish(finished.clone())), meta: meta(bytes) };
            let counted = h.dispatch_prepared(op, false).unwrap();
            assert_eq!(counted, 1 + usize::from(is_async_first), "{engine:?} {bytes}: ops counted");
            assert_eq!(finished.load(Ordering::SeqCst), counted, "{engine:?} {bytes}: each finished once");
            let ran_here = threads.lock().iter().all(|(t, _)| *t == me);
            assert_eq!(threads.lock().len(), 2, "{engine:?} {bytes}: every slice ran");
            assert_eq!(ran_here, inline, "{engine:?} {bytes} (async op pending: {is_async_first}): where it ran");
        }
        let finished = Arc::new(AtomicUsize::new(0));
        let completion = Box::new(CountFinish(finished.clone()));
        let op = PreparedOp { work: Arc::new(PanickingWork), completion, meta: meta(4096) };
        let err = h.dispatch_prepared(op, false).expect_err("the panicking inline op must fail");
        assert!(err.to_string().contains("injected panic in slice 1"), "{err}");
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        let threads = Arc::new(crate::rt::sync::Mutex::new(Vec::new()));
        let work = Arc::new(ThreadRecordingWork(threads.clone()));
        let op = PreparedOp { work, completion: Box::new(CountFinish(finished)), meta: meta(4096) };
        assert_eq!(h.dispatch_prepared(op, false).unwrap(), 1, "{engine:?}: the handle works after an inline panic");
    }
}

/// A blocking op of at most one block runs on the calling thread as plain
/// pread/pwrite syscalls (one request per slice: an io_uring round trip only
/// adds a wake-up); a larger inline op uses the handle's own engine; and a
/// one-block op through a real file still moves the right bytes.
#[test]
fn one_block_blocking_ops_use_plain_syscalls_on_the_calling_thread() {
    use crate::engine::EngineKind;
    use crate::op::work::OpMeta;
    let me = std::thread::current().id();
    let dir = TempDir::new("one-request");
    let block = 4096;
    for engine in engines() {
        let h = handle_with(engine, block, 4, false, true, 2);
        for (bytes, expected) in [(block, EngineKind::Psync), (block + 1, engine), (8 * block, engine)] {
            let ran = Arc::new(crate::rt::sync::Mutex::new(Vec::new()));
            let meta = OpMeta { bytes: bytes as u64, may_run_inline: true, ..Default::default() };
            let work = Arc::new(ThreadRecordingWork(ran.clone()));
            let op = PreparedOp { work, completion: Box::new(CountFinish(Arc::new(AtomicUsize::new(0)))), meta };
            assert_eq!(h.dispatch_prepared(op, false).unwrap(), 1);
            assert_eq!(*ran.lock(), vec![(me, expected); 2], "{engine:?}, an op of {bytes} bytes");
        }
        let data = pattern(11, 2 * block);
        let path = dir.file(&format!("{engine:?}.bin"));
        write_file(&path, &data);
        let dst = Pinned::new(block);
        assert_eq!(h.pread(dst.desc(), FileTarget::Path(&path), block as i64, false).unwrap(), 1);
        assert_bytes_eq(dst.as_slice(), &data[block..], &format!("{engine:?}: one block read at {block}"));
    }
}

/// A slice that blocks until released, to hold a blocking call open.
struct GatedWork {
    started: Arc<AtomicBool>,
    open: Arc<AtomicBool>,
    /// Set when the gate gave up waiting: something kept it from being opened.
    timed_out: Arc<AtomicBool>,
}

impl OpWork for GatedWork {
    fn slice_count(&self) -> usize {
        1
    }
    fn run_slice(&self, _index: usize, _engine: &mut dyn Engine) -> Result<()> {
        self.started.store(true, Ordering::SeqCst);
        let start = Instant::now();
        while !self.open.load(Ordering::SeqCst) {
            if start.elapsed() > Duration::from_secs(5) {
                self.timed_out.store(true, Ordering::SeqCst);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        Error::Engine(format!("slice {index}: {detail}"))
    }
}

#[test]
fn an_async_submit_does_not_wait_behind_a_blocking_call() {
    let dir = TempDir::new("async-not-serial");
    let h = Arc::new(handle_with(engines()[0], 4096, 4, false, true, 2));
    let started = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicUsize::new(0));
    let blocking = {
        let (h, started, open, finished) = (h.clone(), started.clone(), open.clone(), finished.clone());
        let timed_out = timed_out.clone();
        std::thread::spawn(move || {
            let work = GatedWork { started, open, timed_out };
            let op = PreparedOp { work: Arc::new(work), completion: Box::new(CountFinish(finished)), meta: Default::default() };
            h.dispatch_prepared(op, false)
        })
    };
    // Wait until the blocking call's op is running on a worker.
    let start = Instant::now();
    while !started.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(started.load(Ordering::SeqCst), "the blocking call never started");
    // The async submit returns while the blocking call is still held open.
    let data = pattern(5, 8192);
    let src = Pinned::with(&data);
    let path = dir.file("async.bin");
    assert_eq!(h.pwrite(src.desc(), FileTarget::Path(&path), 0, true).unwrap(), 0);
    open.store(true, Ordering::SeqCst);
    // The blocking call counts everything pending when it waited.
    let counted = blocking.join().unwrap().unwrap();
    let rest = h.wait().unwrap();
    assert_eq!(counted + rest, 2, "both ops counted exactly once");
    assert!(!timed_out.load(Ordering::SeqCst), "the async submit waited for the blocking call to end");
    assert_bytes_eq(&read_file(&path), &data, "async write");
}
/// A read slice whose engine run panics while other pieces are in the
/// kernel (an injected fault after its third completion).
struct PanicMidRun {
    fd: i32,
    mem: usize,
    len: usize,
}

impl OpWork for PanicMidRun {
    fn slice_count(&self) -> usize {
        1
    }
    fn run_slice(&self, _index: usize, engine: &mut dyn Engine) -> Result<()> {
        let seg = crate::engine::Segment { fd: self.fd, file_offset: 0, addr: self.mem as *mut u8, len: self.len };
        let params = crate::engine::AioParams { block_size: 1 << 20, queue_depth: 32, single_submit: false, overlap_events: true };
        // The third completion panics, with the rest of the run in flight.
        crate::engine::fault::panic_after_completions(2);
        engine.run_with(crate::Direction::Read, &[seg], &params, None).map_err(Error::from)
    }
    fn slice_error(&self, index: usize, detail: String) -> Error {
        Error::Engine(format!("slice {index}: {detail}"))
    }
}

/// After a panic inside an engine run, `wait()` returns only once the
/// kernel has stopped writing into the op's memory: memory the caller
/// reuses right after `wait()` is never overwritten by the abandoned reads.
#[test]
fn a_panic_mid_run_waits_for_the_kernel_before_the_op_fails() {
    let dir = TempDir::new("panic-mid-run");
    let len = 48 << 20;
    let path = dir.file("f.bin");
    write_file(&path, &pattern(8, len));
    for engine in engines() {
        let h = handle_with(engine, 1 << 20, 32, false, true, 1);
        let mem = Pinned::new(len);
        let fd = open_fd(&path, libc::O_RDONLY | libc::O_DIRECT);
        let finished = Arc::new(AtomicUsize::new(0));
        let work = PanicMidRun { fd, mem: mem.ptr() as usize, len };
        let op = PreparedOp { work: Arc::new(work), completion: Box::new(CountFinish(finished.clone())), meta: Default::default() };
        assert_eq!(h.dispatch_prepared(op, true).unwrap(), 0);
        let err = h.wait().expect_err("the panicking op fails");
        assert!(err.to_string().contains("panic"), "{err}");
        // The caller reuses the memory at once: nothing may land in it now.
        // SAFETY: bytes of this test's own live mapping, which nothing else writes meanwhile.
        let mine = unsafe { std::slice::from_raw_parts_mut(mem.ptr(), len) };
        mine.fill(0xA5);
        std::thread::sleep(Duration::from_millis(300));
        let overwritten = mine.iter().filter(|&&b| b != 0xA5).count();
        assert_eq!(overwritten, 0, "{engine:?}: {overwritten} bytes written into memory after wait() returned");
        close_fd(fd);
    }
}

/// A completion whose finish panics after a pause (so another thread is
/// waiting for the op by then).
struct PanickingFinish;

impl OpCompletion for PanickingFinish {
    fn finish(&mut self, _outcome: Result<()>) -> Result<()> {
        std::thread::sleep(Duration::from_millis(200));
        panic!("injected panic in finish");
    }
}

/// A panic while an op is finished fails that op with an error naming the
/// panic, and the op still counts as finished for every waiter: a second
/// thread's `wait()` returns, and the handle takes new ops.
#[test]
fn a_panic_in_finishing_an_op_fails_it_and_releases_every_waiter() {
    use crate::op::work::OpMeta;
    for engine in engines() {
        let h = handle_with(engine, 4096, 4, false, true, 2);
        let threads = Arc::new(crate::rt::sync::Mutex::new(Vec::new()));
        let meta = OpMeta { bytes: 8192, ..Default::default() };
        let op = PreparedOp { work: Arc::new(ThreadRecordingWork(threads)), completion: Box::new(PanickingFinish), meta };
        assert_eq!(h.dispatch_prepared(op, true).unwrap(), 0);
        let (first, second) = std::thread::scope(|s| {
            let first = s.spawn(|| h.wait());
            std::thread::sleep(Duration::from_millis(50));
            let second = s.spawn(|| h.wait());
            (first.join().unwrap(), second.join().unwrap())
        });
        let failed = [&first, &second].into_iter().filter(|r| r.is_err()).count();
        assert_eq!(failed, 1, "{engine:?}: one wait reports the panic: {first:?} / {second:?}");
        let err = first.as_ref().err().or(second.as_ref().err()).unwrap().to_string();
        assert!(err.contains("injected panic in finish"), "{engine:?}: {err}");
        assert_eq!(h.pending_ops(), 0, "{engine:?}: the op left the queue");
        let finished = Arc::new(AtomicUsize::new(0));
        let op = PreparedOp {
            work: Arc::new(ThreadRecordingWork(Arc::new(crate::rt::sync::Mutex::new(Vec::new())))),
            completion: Box::new(CountFinish(finished.clone())),
            meta,
        };
        assert_eq!(h.dispatch_prepared(op, false).unwrap(), 1, "{engine:?}: the handle works after the panic");
    }
}
