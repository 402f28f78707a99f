//! Ops take effect in submission order, on the Rust API: a seeded,
//! model-based check of one `IoHandle` against a byte-exact reference model
//! (the same model as tests/python/test_caller_memory_model.py).
//!
//! The rule: for caller memory that overlaps on one handle, ops take effect
//! in the order they were submitted (a later op's bytes are never
//! overwritten by an earlier op's; a write sends what its buffer holds after
//! every earlier op on it), and file bytes likewise (a read after a write of
//! the same file bytes sees the write). Effects are only promised once
//! `wait()` or a blocking op (which waits for everything pending) returned,
//! so the model is compared only then, and no memory of an op in flight is
//! touched meanwhile.
//!
//! * Regressions: `pread(v, A, async)` then `read_into(v, B)` into one plain
//!   `Vec<u8>` of 64 MiB must leave B in it; `pread(v, A, async)` then
//!   `write_from(v, out)` must write A.
//! * The model: a random sequence of `pread`/`pwrite` (async or blocking),
//!   `read_into`/`write_from`, `wait()`, pauses (async ops finish while the
//!   caller is away) and caller writes into idle memory, at page-aligned,
//!   512-aligned and odd file offsets and buffer positions, over three
//!   pre-filled files of fixed size and sub-ranges (`BufferDesc::from_raw_parts`,
//!   overlapping ones included) of a `LockedBuffer`, manager-pinned memory
//!   and a plain `Vec<u8>` (bounced). The model is a `Vec<u8>` per base
//!   buffer and file, each op applied at submit; after every wait/blocking op
//!   every byte of every base and file is compared, and the return counts.
//! * The same on a handle of 1 MiB blocks with ops up to 12 MiB: blocking
//!   ops on the plain base stream through bounce windows, a read keeping a
//!   varying number of them in flight (the test fails if a seed made none).
//! * The same with two threads sharing the handle, each with its own buffers
//!   and files, waits from either thread (one thread's `wait()` finishes the
//!   other's ops); each thread's state is compared at the end, after a final
//!   wait from each thread.
//!
//! Both engines (io_uring skipped, loudly, where the kernel refuses it); a
//! fixed seed and a random one, printed on stderr and named in any failure.
//! `DEEPNVME_MODEL_SEED=<n>` replaces the random seed to reproduce one. A
//! watchdog aborts the test binary (naming the test) if a run hangs.
//!
//! A binary of its own (not a module of `tests/core/`): its runs lock more
//! memory than a default RLIMIT_MEMLOCK allows beside other tests (they hold
//! SERIAL), and the random seed is one per binary, replayed by `--test
//! core_caller_memory_model`.

use deepnvme::test_support as common;

use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
// DeepSpeed's calls (raw buffers, i64 offsets, async as a flag): their semantics are under test.
use deepnvme::test_support::calls as ds;
use deepnvme::{BufferDesc, EngineKind, FileTarget, IoHandle, LockedBuffer};

const FIXED_SEED: u64 = 20261201;
const PAGE: usize = 4096;
const MIB: usize = 1 << 20;
/// The model's handle: 64 KiB blocks (ops split and queue), depth 8, two workers.
const BLOCK: usize = 64 << 10;
const QUEUE_DEPTH: usize = 8;
const IOP: usize = 2;
const MODEL_OPS: usize = 150;
const THREAD_OPS: usize = 90;
const WINDOWED_MODEL_OPS: usize = 60;
const MIN_WINDOWED_OPS: usize = 4;
/// `knobs::BOUNCE_WINDOW_BYTES`: a bounced blocking op larger than this streams.
const BOUNCE_WINDOW: usize = 4 * MIB;
const REGRESSION_BYTES: usize = 64 * MIB;
/// A run that takes longer than this hangs: the watchdog aborts the binary.
const WATCHDOG: Duration = Duration::from_secs(240);

/// One test at a time: each times its own ops, and together they would lock
/// more memory than a default RLIMIT_MEMLOCK allows.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Prints past libtest's capture, so the seeds always show.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The random seed of this run (one per test binary): DEEPNVME_MODEL_SEED,
/// else a fresh one.
fn random_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(fresh_or_given_seed)
}

fn fresh_or_given_seed() -> u64 {
    match std::env::var("DEEPNVME_MODEL_SEED") {
        Ok(v) if !v.trim().is_empty() => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("DEEPNVME_MODEL_SEED={v:?}: {e}"))
        }
        _ => {
            // std's per-process random hash keys; no RNG crate needed.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id() as u64);
            h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
            h.finish() & 0xFFFF_FFFF
        }
    }
}

fn seeds(test: &str) -> [u64; 2] {
    let random = random_seed();
    say(&format!(
        "{test}: model seeds: fixed {FIXED_SEED}, random {random}{}",
        if std::env::var_os("DEEPNVME_MODEL_SEED").is_some() { " (DEEPNVME_MODEL_SEED)" } else { "" }
    ));
    [FIXED_SEED, random]
}

fn repro(test: &str, seed: u64) -> String {
    format!(
        "reproduce: DEEPNVME_MODEL_SEED={seed} cargo test --test core_caller_memory_model {test} \
         (the seed replaces the random one; the fixed one is {FIXED_SEED})"
    )
}

/// Aborts the process if not dropped within `limit`: a hung op must fail
/// the run, not stall it.
struct Watchdog(Option<mpsc::Sender<()>>);

fn watchdog(what: String, limit: Duration) -> Watchdog {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            say(&format!("{what} did not finish in {} s (a hang?): aborting", limit.as_secs()));
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.take(); // disconnects: the watchdog thread ends
    }
}

fn model_handle(engine: EngineKind) -> IoHandle {
    handle_with(engine, BLOCK, QUEUE_DEPTH, false, true, IOP)
}

fn engine_name(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Uring => "io_uring",
        EngineKind::Psync => "psync",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

// ------------------------------------------------------------ regressions --

/// (pages equal to `a`, pages equal to `b`, other pages) of 4 KiB pages.
fn page_census(got: &[u8], a: &[u8], b: &[u8]) -> (usize, usize, usize) {
    let (mut na, mut nb, mut other) = (0, 0, 0);
    for (i, g) in got.chunks(PAGE).enumerate() {
        let r = i * PAGE..(i * PAGE + g.len());
        if g == &b[r.clone()] {
            nb += 1;
        } else if g == &a[r] {
            na += 1;
        } else {
            other += 1;
        }
    }
    (na, nb, other)
}

fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter().zip(want).position(|(g, w)| g != w).or((got.len() != want.len()).then(|| got.len().min(want.len())))
}

#[test]
fn regression_async_pread_then_blocking_read_into_one_plain_vec() {
    let _g = serial();
    let dir = TempDir::new("model-rr");
    let (a, b) = (pattern(1, REGRESSION_BYTES), pattern(2, REGRESSION_BYTES));
    let (pa, pb) = (dir.file("A.bin"), dir.file("B.bin"));
    write_file(&pa, &a);
    write_file(&pb, &b);
    for engine in engines() {
        let _w = watchdog(format!("regression read-then-read on {engine:?}"), WATCHDOG);
        let h = handle_with(engine, MIB, 8, false, false, 2);
        // The pause lets the first read finish while the caller is elsewhere.
        let pauses_ms = [100u64, 300, 50, 0];
        for (round, &pause) in pauses_ms.iter().enumerate() {
            let mut v = vec![0u8; REGRESSION_BYTES]; // plain memory: bounced
            let desc = heap_desc(&mut v);
            assert_eq!(ds::pread(&h, desc, FileTarget::Path(&pa), 0, true).unwrap(), 0);
            std::thread::sleep(Duration::from_millis(pause));
            let rc = h.read_into(&mut v, FileTarget::Path(&pb), 0).unwrap();
            if v != b || rc != 2 {
                let (na, nb, other) = page_census(&v, &a, &b);
                panic!(
                    "round {} of {} (pause {pause} ms, engine {}): pread(v, A, async) then read_into(v, B) into \
                     one plain Vec of {} MiB: read_into returned {rc} (want 2) and v must hold B, but of its {} \
                     4-KiB pages {na} hold A's bytes, {nb} B's, {other} neither; first wrong byte at {:?}",
                    round + 1,
                    pauses_ms.len(),
                    engine_name(engine),
                    REGRESSION_BYTES >> 20,
                    REGRESSION_BYTES / PAGE,
                    first_diff(&v, &b)
                );
            }
        }
        assert_eq!(h.wait().unwrap(), 0);
    }
}

#[test]
fn regression_async_pread_then_blocking_write_from_one_plain_vec() {
    let _g = serial();
    let dir = TempDir::new("model-rw");
    let (a, old) = (pattern(3, REGRESSION_BYTES), pattern(4, REGRESSION_BYTES));
    let (pa, out) = (dir.file("A.bin"), dir.file("out.bin"));
    write_file(&pa, &a);
    for engine in engines() {
        let _w = watchdog(format!("regression read-then-write on {engine:?}"), WATCHDOG);
        let h = handle_with(engine, MIB, 8, false, false, 2);
        let pauses_ms = [50u64, 100, 0, 200];
        for (round, &pause) in pauses_ms.iter().enumerate() {
            let mut v = old.clone(); // plain memory holding `old`
            let desc = heap_desc(&mut v);
            assert_eq!(ds::pread(&h, desc, FileTarget::Path(&pa), 0, true).unwrap(), 0);
            std::thread::sleep(Duration::from_millis(pause));
            let rc = h.write_from(&v, FileTarget::Path(&out), 0).unwrap();
            let written = read_file(&out);
            if written != a || v != a || rc != 2 {
                let (nold, na, other) = page_census(&written, &old, &a);
                panic!(
                    "round {} of {} (pause {pause} ms, engine {}): pread(v, A, async) then write_from(v, out) from \
                     one plain Vec of {} MiB: write_from returned {rc} (want 2); out must hold A (v after the read), \
                     but of its {} 4-KiB pages {na} hold A's bytes, {nold} v's old bytes, {other} neither (first \
                     wrong byte at {:?}); v itself {} A afterwards",
                    round + 1,
                    pauses_ms.len(),
                    engine_name(engine),
                    REGRESSION_BYTES >> 20,
                    written.len() / PAGE,
                    first_diff(&written, &a),
                    if v == a { "holds" } else { "does not hold" }
                );
            }
        }
        assert_eq!(h.wait().unwrap(), 0);
    }
}

// ------------------------------------------------------------------ model --

enum Mem {
    /// `LockedBuffer`: page-locked, used directly.
    Locked(LockedBuffer),
    /// Memory from the process-wide manager (common::Pinned), used directly.
    Pinned(Pinned),
    /// A plain heap Vec: bounced. Never resized, so it never moves.
    Heap(Vec<u8>),
}

struct Base {
    name: String,
    mem: Mem,
    model: Vec<u8>,
}

// SAFETY: the memory is owned by the value; the raw pointers handed to ops
// are only used while the owning thread waits for them.
unsafe impl Send for Base {}

impl Base {
    fn new(name: String, mut mem: Mem, init: &[u8]) -> Base {
        let len = init.len();
        match &mut mem {
            Mem::Locked(b) => b[..len].copy_from_slice(init),
            Mem::Pinned(p) => p.as_mut_slice()[..len].copy_from_slice(init),
            Mem::Heap(v) => v.copy_from_slice(init),
        }
        Base { name, mem, model: init.to_vec() }
    }
    fn ptr(&self) -> *mut u8 {
        match &self.mem {
            Mem::Locked(b) => b.as_ptr(),
            Mem::Pinned(p) => p.ptr(),
            Mem::Heap(v) => v.as_ptr() as *mut u8,
        }
    }
    fn len(&self) -> usize {
        self.model.len()
    }
    /// `[start, start + len)` as an op's buffer (overlapping others freely).
    fn desc(&self, start: usize, len: usize) -> BufferDesc {
        assert!(start + len <= self.len());
        // SAFETY: inside the base's memory, which lives until the ops on it are waited for.
        unsafe { BufferDesc::from_raw_parts(self.ptr().add(start), len) }
    }
    /// The memory now. Only called with nothing in flight on it.
    fn actual(&self) -> &[u8] {
        // SAFETY: `len` bytes of this base's memory.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) }
    }
    fn set(&mut self, start: usize, data: &[u8]) {
        // SAFETY: inside the memory; nothing in flight (the caller's write).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(start), data.len()) };
        self.model[start..start + data.len()].copy_from_slice(data);
    }
}

struct File {
    name: String,
    path: PathBuf,
    model: Vec<u8>,
}

impl File {
    fn new(name: String, path: PathBuf, data: Vec<u8>) -> File {
        write_file(&path, &data);
        File { name, path, model: data }
    }
    fn len(&self) -> usize {
        self.model.len()
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Pread,
    Pwrite,
    ReadInto,
    WriteFrom,
    Wait,
    Pause,
    Poke,
}

const KINDS: [Kind; 7] =
    [Kind::Pread, Kind::Pwrite, Kind::ReadInto, Kind::WriteFrom, Kind::Wait, Kind::Pause, Kind::Poke];

#[derive(Clone)]
struct Op {
    kind: Kind,
    base: usize,
    start: usize,
    len: usize,
    file: usize,
    offset: usize,
    is_async: bool,
    pause_ms: u64,
    data: Vec<u8>,
}

impl Op {
    fn of(kind: Kind) -> Op {
        Op { kind, base: 0, start: 0, len: 0, file: 0, offset: 0, is_async: false, pause_ms: 0, data: vec![] }
    }
}

fn chance(rng: &mut Rng, percent: usize) -> bool {
    rng.range(0, 99) < percent
}

fn pick_len(rng: &mut Rng, limit: usize) -> usize {
    let r = rng.range(0, 99);
    let n = if r < 15 {
        rng.range(1, 2047) * 2
    } else if r < 40 {
        rng.range(1, 16) * PAGE
    } else if r < 70 {
        rng.range(1, 511) * 512
    } else {
        rng.range(PAGE.min(limit), limit)
    };
    let n = n.min(limit);
    (n - n % IOP).max(IOP)
}

/// A position in `0..=span`: page-aligned mostly, some 512-aligned or odd.
fn pick_pos(rng: &mut Rng, span: usize) -> usize {
    let r = rng.range(0, 99);
    if r < 25 || span == 0 {
        if r < 15 || span < PAGE {
            0
        } else {
            span - span % PAGE
        }
    } else if r < 60 {
        rng.range(0, span / PAGE) * PAGE
    } else if r < 80 {
        rng.range(0, span / 512) * 512
    } else {
        rng.range(0, span)
    }
}

/// One op's effect on a model: (op index, destination name, start, bytes,
/// source name, source start).
type Effect = (usize, String, usize, Vec<u8>, Option<String>, usize);

/// One thread's ops on a (maybe shared) handle, its bases and files, its model.
struct Model {
    rng: Rng,
    bases: Vec<Base>,
    files: Vec<File>,
    weights: [usize; 7],
    /// Return counts are exact only with one thread on the handle.
    check_counts: bool,
    history: Vec<String>,
    /// Own async ops since this thread's last wait/blocking op.
    pending: usize,
    last: Option<(usize, usize, usize)>,
    checked_after: usize,
    /// Every model's bytes at the last good check, by name.
    snapshot: Vec<(String, Vec<u8>)>,
    /// Since then, each op's effect.
    window: Vec<Effect>,
    context: String,
    /// The handle's geometry, for reports.
    handle: String,
    /// Blocking ops on the plain (heap) base of more than a bounce window.
    windowed_ops: usize,
}

impl Model {
    fn new(
        seed: u64,
        prefix: &str,
        dir: &TempDir,
        sizes: &[usize],
        file_sizes: &[usize],
        weights: [usize; 7],
    ) -> Model {
        let mut rng = Rng::new(seed);
        let mut bases = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let mut init = vec![0u8; size];
            rng.fill(&mut init);
            let (kind, mem) = match i % 3 {
                0 => ("locked", Mem::Locked(LockedBuffer::new(size).expect("a LockedBuffer"))),
                1 => ("heap", Mem::Heap(vec![0u8; size])),
                _ => ("pinned", Mem::Pinned(Pinned::new(size))),
            };
            bases.push(Base::new(format!("{prefix}{kind}"), mem, &init));
        }
        let mut files = Vec::new();
        for (i, &size) in file_sizes.iter().enumerate() {
            let mut data = vec![0u8; size];
            rng.fill(&mut data);
            let name = format!("{prefix}f{i}");
            files.push(File::new(name.clone(), dir.file(&format!("{name}.bin")), data));
        }
        let mut m = Model {
            rng,
            bases,
            files,
            weights,
            check_counts: true,
            history: Vec::new(),
            pending: 0,
            last: None,
            checked_after: 0,
            snapshot: Vec::new(),
            window: Vec::new(),
            context: String::new(),
            handle: format!("handle block {BLOCK}, depth {QUEUE_DEPTH}, parallelism {IOP}"),
            windowed_ops: 0,
        };
        m.take_snapshot();
        m
    }

    fn take_snapshot(&mut self) {
        self.snapshot = self.bases.iter().map(|b| (b.name.clone(), b.model.clone())).collect();
        self.snapshot.extend(self.files.iter().map(|f| (f.name.clone(), f.model.clone())));
    }

    /// The next op: depends on the seed and the op sequence only, never on timing.
    fn next_op(&mut self) -> Op {
        let allowed: Vec<Kind> =
            KINDS.iter().copied().filter(|&k| k != Kind::Poke || (self.pending == 0 && self.check_counts)).collect();
        let total: usize = allowed.iter().map(|&k| self.weights[k as usize]).sum();
        let mut pick = self.rng.range(0, total - 1);
        let mut kind = allowed[0];
        for &k in &allowed {
            let w = self.weights[k as usize];
            if pick < w {
                kind = k;
                break;
            }
            pick -= w;
        }
        let mut op = Op::of(kind);
        match kind {
            Kind::Wait => {}
            Kind::Pause => op.pause_ms = [1u64, 4, 20][self.rng.range(0, 2)],
            Kind::Poke => {
                op.base = self.rng.range(0, self.bases.len() - 1);
                let size = self.bases[op.base].len();
                let n = self.rng.range(1, (64 << 10).min(size));
                op.start = self.rng.range(0, size - n);
                op.data = vec![0u8; n];
                self.rng.fill(&mut op.data);
            }
            _ => {
                op.file = self.rng.range(0, self.files.len() - 1);
                let fsize = self.files[op.file].len();
                match self.last {
                    // The same memory again (the reported pattern), maybe another file.
                    Some((b, s, n)) if chance(&mut self.rng, 35) => {
                        op.base = b;
                        op.start = s;
                        op.len = n.min(fsize);
                    }
                    _ => {
                        op.base = self.rng.range(0, self.bases.len() - 1);
                        let size = self.bases[op.base].len();
                        op.len = pick_len(&mut self.rng, size.min(fsize));
                        op.start = pick_pos(&mut self.rng, size - op.len);
                    }
                }
                op.offset = pick_pos(&mut self.rng, fsize - op.len);
                op.is_async = matches!(kind, Kind::Pread | Kind::Pwrite) && chance(&mut self.rng, 65);
                self.last = Some((op.base, op.start, op.len));
            }
        }
        op
    }

    fn describe(&self, op: &Op) -> String {
        match op.kind {
            Kind::Wait => "wait()".into(),
            Kind::Pause => format!("pause {} ms", op.pause_ms),
            Kind::Poke => format!("caller writes {} B into {}[{}:]", op.data.len(), self.bases[op.base].name, op.start),
            k => {
                let (b, f) = (&self.bases[op.base].name, &self.files[op.file].name);
                let arrow = if matches!(k, Kind::Pread | Kind::ReadInto) { "<-" } else { "->" };
                let name = match k {
                    Kind::Pread => "pread",
                    Kind::Pwrite => "pwrite",
                    Kind::ReadInto => "read_into",
                    _ => "write_from",
                };
                let a = if matches!(k, Kind::Pread | Kind::Pwrite) {
                    format!(", async={}", op.is_async)
                } else {
                    String::new()
                };
                format!("{name}({b}[{}:{}] {arrow} {f}@{}, {} B{a})", op.start, op.start + op.len, op.offset, op.len)
            }
        }
    }

    /// Submits `op` and applies it to the model; Ok(true) at a checkpoint.
    fn step(&mut self, h: &IoHandle, op: &Op) -> Result<bool, String> {
        let index = self.history.len();
        let line = format!("#{index} {}", self.describe(op));
        self.history.push(line);
        match op.kind {
            Kind::Pause => {
                std::thread::sleep(Duration::from_millis(op.pause_ms));
                return Ok(false);
            }
            Kind::Poke => {
                self.bases[op.base].set(op.start, &op.data);
                let name = self.bases[op.base].name.clone();
                self.window.push((index, name, op.start, op.data.clone(), None, 0));
                return Ok(false);
            }
            Kind::Wait => {
                let rc = h.wait().map_err(|e| self.report(&format!("op #{index} failed: {e}"), None))?;
                let want = self.pending;
                self.count(rc, want, index)?;
                return Ok(true);
            }
            _ => {}
        }
        let (s, n, off) = (op.start, op.len, op.offset);
        let reading = matches!(op.kind, Kind::Pread | Kind::ReadInto);
        if !op.is_async && matches!(self.bases[op.base].mem, Mem::Heap(_)) && n > BOUNCE_WINDOW {
            self.windowed_ops += 1;
        }
        // The model takes the op's effect now, in submission order.
        {
            let (base, file) = (&mut self.bases[op.base], &mut self.files[op.file]);
            if reading {
                base.model[s..s + n].copy_from_slice(&file.model[off..off + n]);
                self.window.push((
                    index,
                    base.name.clone(),
                    s,
                    base.model[s..s + n].to_vec(),
                    Some(file.name.clone()),
                    off,
                ));
            } else {
                file.model[off..off + n].copy_from_slice(&base.model[s..s + n]);
                self.window.push((
                    index,
                    file.name.clone(),
                    off,
                    file.model[off..off + n].to_vec(),
                    Some(base.name.clone()),
                    s,
                ));
            }
        }
        let base = &self.bases[op.base];
        let path = self.files[op.file].path.clone();
        let target = FileTarget::Path(&path);
        let result = match op.kind {
            Kind::Pread => ds::pread(h, base.desc(s, n), target, off as i64, op.is_async),
            Kind::Pwrite => ds::pwrite(h, base.desc(s, n), target, off as i64, op.is_async),
            Kind::ReadInto => {
                // SAFETY: the base's memory; the call waits for every earlier op first.
                let slice = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(s), n) };
                h.read_into(slice, target, off as u64)
            }
            _ => {
                // SAFETY: as above; a write only reads it.
                let slice = unsafe { std::slice::from_raw_parts(base.ptr().add(s) as *const u8, n) };
                h.write_from(slice, target, off as u64)
            }
        };
        let rc = result.map_err(|e| self.report(&format!("op #{index} failed: {e}"), None))?;
        self.history[index] += &format!(" -> {rc}");
        if op.is_async {
            if rc != 0 {
                return Err(self.report(&format!("op #{index} (async) returned {rc}, want 0"), None));
            }
            self.pending += 1;
            return Ok(false);
        }
        let want = self.pending + 1;
        self.count(rc, want, index)?;
        Ok(true)
    }

    fn count(&mut self, rc: usize, want: usize, index: usize) -> Result<(), String> {
        self.pending = 0;
        if self.check_counts && rc != want {
            return Err(self.report(&format!("op #{index} returned {rc}; want {want} (the ops it finished)"), None));
        }
        Ok(())
    }

    /// Compares every byte of every base and file with the model.
    fn check(&mut self, when: &str) -> Result<(), String> {
        let mut found = None;
        for b in &self.bases {
            if b.actual() != &b.model[..] {
                found = Some((b.name.clone(), b.actual().to_vec(), b.model.clone()));
                break;
            }
        }
        if found.is_none() {
            for f in &self.files {
                let got = read_file(&f.path);
                if got != f.model {
                    found = Some((f.name.clone(), got, f.model.clone()));
                    break;
                }
            }
        }
        if let Some((name, got, want)) = found {
            let what = if got.len() != want.len() {
                format!("{name}: {} bytes, the model has {}", got.len(), want.len())
            } else {
                let i = first_diff(&got, &want).unwrap();
                let last = (0..got.len()).rev().find(|&j| got[j] != want[j]).unwrap();
                let differ = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                let hex = |v: &[u8]| v[i..(i + 16).min(v.len())].iter().map(|b| format!("{b:02x}")).collect::<String>();
                format!(
                    "{name}: {differ} bytes differ from the model, first at byte {i} (got {} want {}), \
                     last at byte {last}",
                    hex(&got),
                    hex(&want)
                )
            };
            let at = first_diff(&got, &want).map(|i| (name.as_str(), i, &got[..]));
            return Err(self.report(&format!("after {when}: {what}"), at));
        }
        self.checked_after = self.history.len();
        self.take_snapshot();
        self.window.clear();
        Ok(())
    }

    /// Whose bytes `got` holds at `byte` of `name`.
    fn attribute(&self, name: &str, byte: usize, got: &[u8]) -> Vec<String> {
        let seen = &got[byte..(byte + 16).min(got.len())];
        let snap = |n: &str| self.snapshot.iter().find(|(s, _)| s == n).map(|(_, v)| v);
        let mut found = Vec::new();
        if let Some(old) = snap(name) {
            if old.get(byte..byte + seen.len()) == Some(seen) {
                found.push("the bytes it held at the last good check (as if no op since had run)".to_string());
            }
        }
        for (index, dest, start, data, src, src_start) in &self.window {
            if dest != name || byte < *start || byte >= start + data.len() {
                continue;
            }
            let part = &data[byte - start..(byte - start + seen.len()).min(data.len())];
            if part == &seen[..part.len()] {
                found.push(format!("op #{index}'s bytes"));
            } else if let Some(src) = src {
                let at = src_start + byte - start;
                if snap(src).and_then(|v| v.get(at..at + part.len())) == Some(&seen[..part.len()]) {
                    found.push(format!(
                        "what op #{index}'s source {src} held at the last good check (the ops before #{index} on \
                         {src} had not taken effect)"
                    ));
                }
            }
        }
        found
    }

    fn touches(&self, line_index: usize, name: &str, byte: usize) -> bool {
        self.window.iter().any(|(index, dest, start, data, src, src_start)| {
            *index == line_index
                && ((dest == name && (*start..start + data.len()).contains(&byte))
                    || (src.as_deref() == Some(name) && (*src_start..src_start + data.len()).contains(&byte)))
        })
    }

    fn report(&self, what: &str, at: Option<(&str, usize, &[u8])>) -> String {
        let mut lines =
            vec![format!("{what} [{}; {}]", self.context, self.handle)];
        if let Some((name, byte, got)) = at {
            let found = self.attribute(name, byte, got);
            lines.push(format!(
                "what {name} holds at byte {byte} is {}",
                if found.is_empty() { "none of the recent ops' bytes".to_string() } else { found.join(" or ") }
            ));
        }
        let since = &self.history[self.checked_after..];
        lines.push(format!("ops since the last good check ({} ops before it):", self.checked_after));
        match at {
            Some((name, byte, _)) if since.len() > 40 => {
                lines
                    .push(format!("  ({} ops; those that touched {name} byte {byte}, then the last 12:)", since.len()));
                for (k, line) in since.iter().enumerate() {
                    if self.touches(self.checked_after + k, name, byte) {
                        lines.push(format!("  {line}"));
                    }
                }
                lines.push("  ...".into());
                lines.extend(since[since.len() - 12..].iter().map(|l| format!("  {l}")));
            }
            _ => lines.extend(since.iter().map(|l| format!("  {l}"))),
        }
        lines.join("\n")
    }
}

/// Weights by `Kind` (Pread, Pwrite, ReadInto, WriteFrom, Wait, Pause, Poke).
const WEIGHTS: [usize; 7] = [40, 30, 10, 8, 10, 6, 4];

fn run_model_one_thread(engine: EngineKind, seed: u64) -> Result<(), String> {
    let dir = TempDir::new("model-one");
    let h = model_handle(engine);
    let m = Model::new(seed, "", &dir, &[MIB, 2 * MIB, 512 << 10], &[4 * MIB, 3 * MIB + 512, 2 * MIB + 6], WEIGHTS);
    run_one_thread(&h, m, MODEL_OPS, 0, format!("seed {seed}, engine {}", engine_name(engine))).map(drop)
}

/// Blocking ops on the plain base that are larger than a bounce window
/// (4 MiB) stream through windows (src/bounce/window.rs), and a read keeps a
/// varying number of them in flight (src/bounce/read_ahead.rs): the handle's
/// queue (2 workers x 8 x 1 MiB) gives such an op 6 windows.
fn run_model_windowed(engine: EngineKind, seed: u64) -> Result<(), String> {
    let dir = TempDir::new("model-windowed");
    let h = handle_with(engine, MIB, QUEUE_DEPTH, false, true, IOP);
    let mut m = Model::new(seed, "", &dir, &[MIB, 14 * MIB, 512 << 10], &[12 * MIB, 9 * MIB + 512], WEIGHTS);
    m.handle = format!("handle block {MIB}, depth {QUEUE_DEPTH}, parallelism {IOP}");
    let context = format!("seed {seed}, engine {}, ops up to 12 MiB", engine_name(engine));
    let helped_before = copy_helper_bytes();
    m = run_one_thread(&h, m, WINDOWED_MODEL_OPS, MIN_WINDOWED_OPS, context)?;
    match m.windowed_ops {
        n if n < MIN_WINDOWED_OPS => Err(format!(
            "seed {seed}: only {n} blocking ops on the plain base were larger than a bounce window (want {MIN_WINDOWED_OPS})"
        )),
        // The windows' 4 MiB copies are shared with the copy helpers
        // (bounce/copy/helpers.rs): this model checks that path's bytes too.
        _ if copy_helper_count() > 0 && copy_helper_bytes() == helped_before => Err(format!(
            "seed {seed}: no copy helper took a piece of any window's copy ({} windowed ops)",
            m.windowed_ops
        )),
        _ => Ok(()),
    }
}

/// Runs `ops` random ops on one thread (more, up to 8 times as many,
/// until `min_windowed` of them were windowed), checking after each wait.
fn run_one_thread(h: &IoHandle, mut m: Model, ops: usize, min_windowed: usize, context: String) -> Result<Model, String> {
    m.context = context;
    let out = (|| {
        m.check("setup")?;
        let mut done = 0;
        while done < ops || (m.windowed_ops < min_windowed && done < ops * 8) {
            done += 1;
            let op = m.next_op();
            if m.step(h, &op)? {
                let last = m.history.last().cloned().unwrap_or_default();
                m.check(&last)?;
            }
        }
        let wait = Op::of(Kind::Wait);
        m.step(h, &wait)?;
        m.check("the final wait()")
    })();
    let _ = h.wait(); // nothing in flight when the bases go
    out.map(|()| m)
}

fn run_model_two_threads(engine: EngineKind, seed: u64) -> Result<(), String> {
    let dir = TempDir::new("model-two");
    let h = model_handle(engine);
    // Thread 0 mostly submits; thread 1 waits often, so it finishes thread 0's ops.
    let weights = [[40, 30, 4, 3, 3, 6, 0], [40, 30, 10, 8, 18, 6, 0]];
    let mut models: Vec<Model> = (0..2)
        .map(|k| {
            let mut m = Model::new(
                seed.wrapping_mul(7919).wrapping_add(k as u64 + 1),
                &format!("t{k}."),
                &dir,
                &[MIB, 512 << 10, 768 << 10],
                &[2 * MIB, MIB + 512],
                weights[k],
            );
            m.check_counts = false;
            m.context = format!("seed {seed}, thread {k} of 2 sharing the handle, engine {}", engine_name(engine));
            m
        })
        .collect();
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let threads: Vec<_> = models
            .iter_mut()
            .map(|m| {
                let (h, barrier) = (&h, &barrier);
                s.spawn(move || -> Result<(), String> {
                    barrier.wait();
                    for _ in 0..THREAD_OPS {
                        let op = m.next_op();
                        m.step(h, &op)?;
                    }
                    let wait = Op::of(Kind::Wait);
                    m.step(h, &wait)?; // the final wait from each thread
                    Ok(())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err("the thread panicked".into()))).collect()
    });
    let leftover = h.wait();
    for (k, r) in results.into_iter().enumerate() {
        r.map_err(|e| format!("thread {k}: {e}"))?;
    }
    match leftover {
        Ok(0) => {}
        other => return Err(format!("after both threads' final wait(), wait() returned {other:?}, want Ok(0)")),
    }
    for (k, m) in models.iter_mut().enumerate() {
        m.checked_after = 0; // only the end is checked: every op is in the window
        m.check(&format!("both threads' final wait() (thread {k}'s state)"))?;
    }
    Ok(())
}

/// Runs `run` for every engine and both seeds (all of them, so one failure
/// does not hide another), then fails with the first failure in full and a
/// line per run.
fn run_seeds(test: &str, run: fn(EngineKind, u64) -> Result<(), String>) {
    let _g = serial();
    let seeds = seeds(test);
    let mut summary = Vec::new();
    let mut first: Option<(u64, String)> = None;
    for engine in engines() {
        for &seed in &seeds {
            let _w = watchdog(format!("{test} with seed {seed} on {engine:?}"), WATCHDOG);
            let started = Instant::now();
            let out = run(engine, seed);
            let line = format!(
                "{test}: seed {seed} on {}: {} in {:.2} s",
                engine_name(engine),
                if out.is_ok() { "passed" } else { "FAILED" },
                started.elapsed().as_secs_f64()
            );
            say(&line);
            summary.push(line);
            if let Err(message) = out {
                first.get_or_insert((seed, message));
            }
        }
    }
    if let Some((seed, message)) = first {
        panic!("{message}\n{}\nruns:\n  {}", repro(test, seed), summary.join("\n  "));
    }
}

#[test]
fn model_one_thread() {
    run_seeds("model_one_thread", run_model_one_thread);
}

#[test]
fn model_with_blocking_ops_larger_than_a_bounce_window() {
    run_seeds("model_with_blocking_ops_larger_than_a_bounce_window", run_model_windowed);
}

#[test]
fn model_two_threads_sharing_a_handle() {
    run_seeds("model_two_threads_sharing_a_handle", run_model_two_threads);
}
