//! One order for every op, from every thread (`src/handle/order.rs`, the
//! rule in `src/op/caller.rs`).
//!
//! * Reproductions of issue 30: while one thread's blocking op runs (a
//!   windowed `sync_pwrite`/`sync_pread` of a plain buffer, DeepSpeed's
//!   `write`), a second thread submits an async write over the same file
//!   bytes and waits. The blocking op was admitted first, so it must take
//!   effect whole, first: the file ends with the second write's bytes only,
//!   and the blocking read returns none of them.
//! * The model: three threads share buffers (locked, manager-pinned, plain)
//!   and files, each mixing every entry point (async and blocking
//!   `pread`/`pwrite`, `read_into`/`write_from`, `read`/`write`) with sizes
//!   that hit the inline, queued and windowed paths. After each round every
//!   thread is joined, one `wait()` finishes the rest, and every byte of
//!   every buffer and file must equal a reference model that applied the ops
//!   in the order the handle admitted them (the sequence number each op got,
//!   [`test_support::last_admitted_seq`]). Each thread's own ops must have
//!   increasing numbers. A fixed seed and a random one (printed;
//!   `DEEPNVME_MODEL_SEED=<n>` replays one), both engines, a watchdog.
//! * The model on growing files: the files start empty, writes land
//!   anywhere (leaving holes), and each read is of bytes its own thread wrote
//!   earlier, often with that write still pending. The order makes such a
//!   read see the write, so none may be refused as past the end of the file,
//!   and each file must end as long as the model says.

use deepnvme::test_support as common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use deepnvme::test_support::calls as ds;
use deepnvme::test_support::OpRequest;
use deepnvme::{BufferDesc, Direction, EngineKind, FileTarget, IoHandle, LockedBuffer};

const MIB: usize = 1 << 20;
const FIXED_SEED: u64 = 20261202;

/// Aborts the binary when a run hangs (an ordering deadlock must fail, not stall CI).
struct Watchdog(Option<mpsc::Sender<()>>);

fn watchdog(what: String, limit: Duration) -> Watchdog {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("{what} did not finish in {} s (a hang?): aborting", limit.as_secs());
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.take();
    }
}

/// A locked (page-locked, manager-managed) copy of `data`.
fn locked_with(data: &[u8]) -> LockedBuffer {
    let mut b = LockedBuffer::new(data.len()).expect("a locked buffer");
    b.copy_from_slice(data);
    b
}

fn locked_desc(b: &LockedBuffer) -> BufferDesc {
    // SAFETY: the buffer outlives every op on it (each is waited for here).
    unsafe { BufferDesc::from_raw_parts(b.as_ptr(), b.len()) }
}

/// One test at a time: each times a second thread against the first.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// (pages equal to `a`, pages equal to `b`, other pages).
fn page_census(got: &[u8], a: &[u8], b: &[u8]) -> (usize, usize, usize) {
    let mut census = (0, 0, 0);
    for (i, g) in got.chunks(4096).enumerate() {
        let r = i * 4096..i * 4096 + g.len();
        if g == &b[r.clone()] {
            census.1 += 1;
        } else if g == &a[r] {
            census.0 += 1;
        } else {
            census.2 += 1;
        }
    }
    census
}

/// Waits until `ready` says the first thread's op is well under way.
fn once_under_way(ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Bytes this process has read from storage (`/proc/self/io`), O_DIRECT included.
fn storage_read_bytes() -> usize {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("read_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn file_len(path: &std::path::Path) -> usize {
    std::fs::metadata(path).map(|m| m.len() as usize).unwrap_or(0)
}

/// How the second thread's async write holds its bytes.
#[derive(Clone, Copy, Debug)]
enum SecondBuffer {
    Plain,
    Locked,
}

/// The first thread's blocking write of `first`, the second's async write
/// of `second` over the same bytes once 16 MiB are written: the file must
/// end as `second`, whole.
fn blocking_write_then_async_write(engine: EngineKind, inline: bool, second_kind: SecondBuffer) {
    let len = if inline { 64 * MIB } else { 256 * MIB };
    let dir = TempDir::new("order-ww");
    let path = dir.file("f.bin");
    let (first, second) = (pattern(1, len), pattern(2, len));
    let h = handle_with(engine, MIB, 32, false, true, 2);
    let mut plain_second = second.clone();
    let locked_second = locked_with(&second);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            // SAFETY: `first` outlives the call, which only reads it.
            let desc = unsafe { BufferDesc::from_raw_parts(first.as_ptr() as *mut u8, len) };
            if inline {
                ds::transfer_inline(&h, request(Direction::Write, FileTarget::Path(&path), 0, desc)).map(|()| 1)
            } else {
                ds::pwrite(&h, desc, FileTarget::Path(&path), 0, false)
            }
        });
        once_under_way(|| file_len(&path) >= 16 * MIB);
        let desc = match second_kind {
            SecondBuffer::Plain => heap_desc(&mut plain_second),
            SecondBuffer::Locked => locked_desc(&locked_second),
        };
        assert_eq!(ds::pwrite(&h, desc, FileTarget::Path(&path), 0, true).unwrap(), 0);
        h.wait().expect("the second write");
        writer.join().unwrap().expect("the blocking write");
    });
    let got = std::fs::read(&path).unwrap();
    let census = page_census(&got, &first, &second);
    assert_eq!(
        census,
        (0, len / 4096, 0),
        "{engine:?}, {} then an async write from {second_kind:?} memory: (pages of the blocking write, of the \
         later async write, other); the blocking write must take effect whole, first",
        if inline { "DeepSpeed's write()" } else { "a windowed sync_pwrite" }
    );
}

#[test]
fn a_blocking_windowed_write_takes_effect_whole_before_a_later_async_write() {
    let _g = serial();
    for engine in engines() {
        let _w = watchdog(format!("windowed write vs async write on {engine:?}"), Duration::from_secs(240));
        blocking_write_then_async_write(engine, false, SecondBuffer::Locked);
        blocking_write_then_async_write(engine, false, SecondBuffer::Plain);
    }
}

#[test]
fn deepspeed_write_takes_effect_whole_before_a_later_async_write() {
    let _g = serial();
    for engine in engines() {
        let _w = watchdog(format!("write() vs async write on {engine:?}"), Duration::from_secs(240));
        blocking_write_then_async_write(engine, true, SecondBuffer::Plain);
        blocking_write_then_async_write(engine, true, SecondBuffer::Locked);
    }
}

/// A blocking windowed read of the old bytes, and an async write of new
/// ones over them submitted once the read is under way: the read returns
/// the old bytes only, and the file ends with the new ones.
#[test]
fn a_blocking_windowed_read_sees_none_of_a_later_async_write() {
    let _g = serial();
    let len = 256 * MIB;
    let dir = TempDir::new("order-rw");
    let path = dir.file("f.bin");
    let (old, new) = (pattern(3, len), pattern(4, len));
    for engine in engines() {
        let _w = watchdog(format!("windowed read vs async write on {engine:?}"), Duration::from_secs(240));
        write_file(&path, &old);
        let h = handle_with(engine, MIB, 32, false, true, 2);
        let mut back = vec![0u8; len];
        let mut second = new.clone();
        let started = Arc::new(AtomicBool::new(false));
        let read_before = storage_read_bytes();
        std::thread::scope(|s| {
            let back_desc = heap_desc(&mut back);
            let (flag, hr, p) = (started.clone(), &h, &path);
            let reader = s.spawn(move || {
                flag.store(true, Ordering::SeqCst);
                ds::pread(hr, back_desc, FileTarget::Path(p), 0, false)
            });
            once_under_way(|| started.load(Ordering::SeqCst) && storage_read_bytes() >= read_before + 16 * MIB);
            assert_eq!(ds::pwrite(&h, heap_desc(&mut second), FileTarget::Path(&path), 0, true).unwrap(), 0);
            h.wait().expect("the async write");
            reader.join().unwrap().expect("the blocking read");
        });
        assert_eq!(page_census(&back, &old, &new), (len / 4096, 0, 0), "{engine:?}: the blocking read's pages (old, new, other)");
        let file = std::fs::read(&path).unwrap();
        assert_eq!(page_census(&file, &old, &new), (0, len / 4096, 0), "{engine:?}: the file's pages (old, new, other)");
    }
}

// ------------------------------------------------------------------ model --

/// Buffers every thread shares: locked, manager-pinned, plain.
const BASE_BYTES: usize = 24 * MIB;
const FILE_BYTES: usize = 24 * MIB;
const THREADS: usize = 3;
const ROUNDS: usize = 5;
const OPS_PER_THREAD: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Entry {
    Pread,
    Pwrite,
    ReadInto,
    WriteFrom,
    /// DeepSpeed's `read`/`write`.
    InlineRead,
    InlineWrite,
}

#[derive(Clone, Debug)]
#[allow(dead_code)] // `thread` and `is_async` are read through Debug, in failure reports
struct ModelOp {
    thread: usize,
    entry: Entry,
    is_async: bool,
    base: usize,
    start: usize,
    file: usize,
    offset: usize,
    len: usize,
    seq: u64,
}

impl ModelOp {
    fn reads(&self) -> bool {
        matches!(self.entry, Entry::Pread | Entry::ReadInto | Entry::InlineRead)
    }
}

/// Shared memory as raw addresses (the threads' ops never touch the same
/// bytes at once except through the handle, which orders them).
#[derive(Clone, Copy)]
struct Raw(usize, usize);

fn pick(rng: &mut Rng) -> (Entry, bool, usize) {
    let entry = match rng.range(0, 5) {
        0 => Entry::Pread,
        1 => Entry::Pwrite,
        2 => Entry::ReadInto,
        3 => Entry::WriteFrom,
        4 => Entry::InlineRead,
        _ => Entry::InlineWrite,
    };
    let is_async = matches!(entry, Entry::Pread | Entry::Pwrite) && rng.range(0, 1) == 0;
    // Lengths: small (inline), a few MiB (queued), above a bounce window (windowed).
    let len = match rng.range(0, 3) {
        0 => 2 * rng.range(1, 8) * 512,
        1 => 2 * rng.range(1, 256) * 4096,
        2 => 2 * rng.range(2 * MIB / 4096, 4 * MIB / 4096) * 4096,
        _ => 2 * rng.range(5 * MIB / 2 / 4096, 8 * MIB / 2 / 4096) * 4096 + 1024,
    };
    (entry, is_async, len)
}

/// Whether the files start full (any op anywhere) or empty (a read only of
/// bytes its own thread wrote before it, so that the file is long enough
/// in the order the handle promises).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Files {
    Full,
    Growing,
}

fn run_thread(
    h: &IoHandle,
    bases: &[Raw],
    files: &[PathBuf],
    kind: Files,
    thread: usize,
    seed: u64,
) -> Result<Vec<ModelOp>, String> {
    let mut rng = Rng::new(seed ^ (thread as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut done: Vec<ModelOp> = Vec::new();
    for _ in 0..OPS_PER_THREAD {
        let (mut entry, is_async, mut len) = pick(&mut rng);
        let mut file = rng.range(0, files.len() - 1);
        let mut offset = rng.range(0, (FILE_BYTES - len) / 512) * 512 + if rng.range(0, 2) == 0 { 6 } else { 0 };
        if kind == Files::Growing && matches!(entry, Entry::Pread | Entry::ReadInto | Entry::InlineRead) {
            let own_writes: Vec<&ModelOp> = done.iter().filter(|op| !op.reads()).collect();
            if own_writes.is_empty() {
                entry = Entry::Pwrite;
            } else {
                let w = own_writes[rng.range(0, own_writes.len() - 1)];
                len = len.min(w.len);
                file = w.file;
                offset = w.offset + rng.range(0, w.len - len);
            }
        }
        let is_async = is_async && matches!(entry, Entry::Pread | Entry::Pwrite);
        let base = rng.range(0, bases.len() - 1);
        let start = rng.range(0, (bases[base].1 - len) / 512) * 512 + if rng.range(0, 2) == 0 { 2 } else { 0 };
        let start = start.min(bases[base].1 - len);
        let offset = offset.min(FILE_BYTES - len);
        // SAFETY: inside the base, which outlives the round.
        let desc = unsafe { BufferDesc::from_raw_parts((bases[base].0 + start) as *mut u8, len) };
        let target = FileTarget::Path(&files[file]);
        let before = last_admitted_seq();
        let outcome = match entry {
            Entry::Pread => ds::pread(h, desc, target, offset as i64, is_async),
            Entry::Pwrite => ds::pwrite(h, desc, target, offset as i64, is_async),
            Entry::ReadInto => {
                // SAFETY: as above; the handle orders this op after earlier ones on these bytes.
                let slice = unsafe { std::slice::from_raw_parts_mut(desc.ptr(), len) };
                h.read_into(slice, target, offset as u64)
            }
            Entry::WriteFrom => {
                // SAFETY: as above.
                let slice = unsafe { std::slice::from_raw_parts(desc.ptr() as *const u8, len) };
                h.write_from(slice, target, offset as u64)
            }
            Entry::InlineRead => ds::transfer_inline(h, OpRequest::new(Direction::Read, target, offset as i64, desc)).map(|()| 0),
            Entry::InlineWrite => ds::transfer_inline(h, OpRequest::new(Direction::Write, target, offset as i64, desc)).map(|()| 0),
        };
        let op = ModelOp { thread, entry, is_async, base, start, file, offset, len, seq: last_admitted_seq() };
        if let Err(e) = outcome {
            return Err(format!("thread {thread}: {op:?} failed: {e}"));
        }
        if op.seq <= before {
            return Err(format!("thread {thread}: {op:?} got no later sequence number than its thread's last ({before})"));
        }
        done.push(op);
    }
    Ok(done)
}

fn run_model(engine: EngineKind, kind: Files, seed: u64) -> Result<(), String> {
    let dir = TempDir::new("order-model");
    let mut rng = Rng::new(seed);
    let init: Vec<Vec<u8>> = (0..3).map(|i| pattern(seed.wrapping_add(i), BASE_BYTES)).collect();
    let locked = locked_with(&init[0]);
    let pinned = Pinned::with(&init[1]);
    let mut plain = init[2].clone();
    let bases = [Raw(locked.as_ptr() as usize, BASE_BYTES), Raw(pinned.ptr() as usize, BASE_BYTES), Raw(plain.as_mut_ptr() as usize, BASE_BYTES)];
    let files: Vec<PathBuf> = (0..2).map(|i| dir.file(&format!("f{i}.bin"))).collect();
    let mut model_bases = init.clone();
    let mut model_files: Vec<Vec<u8>> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let data = match kind {
            Files::Full => pattern(seed.wrapping_add(10 + i as u64), FILE_BYTES),
            Files::Growing => Vec::new(),
        };
        write_file(f, &data);
        model_files.push(data);
    }
    let h = handle_with(engine, 64 << 10, 8, false, true, 2);
    let mut history: Vec<ModelOp> = Vec::new();
    // Three rounds of growing files keep CI short; each round reads behind pending writes.
    let rounds = if kind == Files::Growing { 3 } else { ROUNDS };
    for round in 0..rounds {
        if kind == Files::Growing {
            // Each round grows its files from nothing.
            for (f, model) in files.iter().zip(&mut model_files) {
                write_file(f, &[]);
                model.clear();
            }
        }
        let round_seed = rng.next_u64();
        let barrier = Barrier::new(THREADS);
        let results: Vec<Result<Vec<ModelOp>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (h, bases, files, barrier) = (&h, &bases, &files, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        run_thread(h, bases, files, kind, t, round_seed)
                    })
                })
                .collect();
            handles.into_iter().map(|j| j.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
        });
        h.wait().map_err(|e| format!("round {round}: the final wait failed: {e}"))?;
        let mut ops = Vec::new();
        for r in results {
            ops.extend(r.map_err(|e| format!("round {round}: {e}"))?);
        }
        ops.sort_by_key(|op| op.seq);
        for op in &ops {
            let (b, f) = (&mut model_bases[op.base], &mut model_files[op.file]);
            if op.reads() {
                if f.len() < op.offset + op.len {
                    return Err(format!("round {round}: {op:?} succeeded past the model's end of file ({})", f.len()));
                }
                b[op.start..op.start + op.len].copy_from_slice(&f[op.offset..op.offset + op.len]);
            } else {
                if f.len() < op.offset + op.len {
                    f.resize(op.offset + op.len, 0);
                }
                f[op.offset..op.offset + op.len].copy_from_slice(&b[op.start..op.start + op.len]);
            }
        }
        history.extend(ops);
        // SAFETY: every op is finished; the bases are ours again.
        let actual_bases: [&[u8]; 3] =
            [unsafe { std::slice::from_raw_parts(bases[0].0 as *const u8, BASE_BYTES) }, pinned.as_slice(), &plain];
        for (i, got) in actual_bases.iter().enumerate() {
            if let Some(at) = got.iter().zip(&model_bases[i]).position(|(g, w)| g != w) {
                return Err(format!("round {round}: buffer {i} differs from the model at byte {at}\n{}", describe(&history, Some((i, at)), None)));
            }
        }
        for (i, f) in files.iter().enumerate() {
            let got = std::fs::read(f).map_err(|e| e.to_string())?;
            if let Some(at) = got.iter().zip(&model_files[i]).position(|(g, w)| g != w) {
                return Err(format!("round {round}: file {i} differs from the model at byte {at}\n{}", describe(&history, None, Some((i, at)))));
            }
            if got.len() != model_files[i].len() {
                return Err(format!("round {round}: file {i} is {} bytes, the model's {}", got.len(), model_files[i].len()));
            }
        }
    }
    Ok(())
}

/// The ops that touched the differing byte, in admission order.
fn describe(history: &[ModelOp], base: Option<(usize, usize)>, file: Option<(usize, usize)>) -> String {
    history
        .iter()
        .filter(|op| {
            base.is_some_and(|(b, at)| op.base == b && (op.start..op.start + op.len).contains(&at))
                || file.is_some_and(|(f, at)| op.file == f && (op.offset..op.offset + op.len).contains(&at))
        })
        .map(|op| format!("  {op:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_model(kind: Files) {
    let _g = serial();
    let random = std::env::var("DEEPNVME_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("core_order model ({kind:?} files): seeds {FIXED_SEED} and {random} (DEEPNVME_MODEL_SEED={random} replays the second)");
    for engine in engines() {
        for seed in [FIXED_SEED, random] {
            let _w = watchdog(format!("the order model on {engine:?}, {kind:?} files, seed {seed}"), Duration::from_secs(300));
            if let Err(e) = run_model(engine, kind, seed) {
                panic!("{engine:?}, {kind:?} files, seed {seed} (DEEPNVME_MODEL_SEED={seed} cargo test --test core_order): {e}");
            }
        }
    }
}

#[test]
fn threads_sharing_buffers_and_files_match_the_model_in_admission_order() {
    check_model(Files::Full);
}

#[test]
fn reads_of_bytes_a_pending_write_grew_the_file_by_see_them() {
    check_model(Files::Growing);
}

/// Small blocking reads run on the calling thread when nothing is pending;
/// they are admitted like every op, so each returns exactly the bytes of
/// the last write admitted before it, never a later one's or a mix, while
/// another thread keeps writing the same bytes.
#[test]
fn small_inline_reads_see_exactly_the_writes_admitted_before_them() {
    let _g = serial();
    const LEN: usize = 64 << 10;
    const ROUNDS: usize = 1500;
    let dir = TempDir::new("order-inline");
    let path = dir.file("f.bin");
    for engine in engines() {
        let _w = watchdog(format!("inline reads vs writes on {engine:?}"), Duration::from_secs(240));
        write_file(&path, &vec![0u8; LEN]);
        let h = handle_with(engine, 4096, 8, false, true, 1);
        let (writes, reads) = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut done = Vec::with_capacity(ROUNDS);
                let mut buf = vec![0u8; LEN];
                for i in 0..ROUNDS {
                    let fill = (i % 255 + 1) as u8;
                    buf.fill(fill);
                    assert_eq!(ds::pwrite(&h, heap_desc(&mut buf), FileTarget::Path(&path), 0, true).unwrap(), 0);
                    done.push((last_admitted_seq(), fill));
                    h.wait().unwrap();
                }
                done
            });
            let mut seen = Vec::with_capacity(ROUNDS);
            let mut back = vec![0u8; LEN];
            for _ in 0..ROUNDS {
                h.read_into(&mut back, FileTarget::Path(&path), 0).unwrap();
                let first = back[0];
                let whole = back.iter().all(|&b| b == first);
                seen.push((last_admitted_seq(), whole.then_some(first)));
            }
            (writer.join().unwrap(), seen)
        });
        let mut torn = 0;
        let mut stale_or_early = Vec::new();
        for (seq, got) in &reads {
            let want = writes.iter().rfind(|(w, _)| w < seq).map_or(0, |(_, f)| *f);
            match got {
                None => torn += 1,
                Some(g) if *g != want => stale_or_early.push((*seq, *g, want)),
                _ => {}
            }
        }
        assert!(
            torn == 0 && stale_or_early.is_empty(),
            "{engine:?}: of {ROUNDS} reads, {torn} mixed two writes and {} saw another write than the last one \
             admitted before them (seq, got, want): {:?}",
            stale_or_early.len(),
            &stale_or_early[..stale_or_early.len().min(5)]
        );
    }
}
