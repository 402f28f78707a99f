//! Helpers of every test of the core: its unit tests and `internal_tests/`
//! (`cfg(test)`), and the integration tests in `tests/`, which get this
//! module through the `test-support` feature (the package's dev-dependency
//! on itself turns it on). One copy, no `#[path]`: a temp dir under the
//! checkout's target dir (real ext4, so O_DIRECT is real), the one seeded
//! generator ([`Rng`], [`pattern`]), pinned/heap buffers, raw descriptors
//! and /proc readers. Not part of the API.
#![allow(missing_docs)]

use std::fs;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{BufferDesc, Direction, EngineKind, FileTarget, HandleConfig, IoHandle, PinnedMemoryManager};

pub mod zram;

/// The sequence number the handle gave the op this thread had admitted last
/// (on any handle; 0 before the first): the order the model tests apply ops in.
pub fn last_admitted_seq() -> u64 {
    crate::handle::LAST_ADMITTED.with(|last| last.get())
}

/// A directory removed on drop, under the checkout's `target/tmp` (the
/// checkout's file system, so O_DIRECT is real there).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/target/tmp");
        let path = Path::new(root)
            .join("deepnvme-core-tests")
            .join(format!("{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("creating the test directory");
        TempDir { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The tests' one seeded generator (xorshift64*): every seeded byte and
/// random choice of a test comes from it. Deterministic per seed, good
/// enough to make every byte distinct-ish. 
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// `len` pseudo-random bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// Asserts two byte slices are equal, reporting the first difference
/// instead of dumping megabytes.
#[track_caller]
pub fn assert_bytes_eq(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length differs");
    if got == want {
        return; // memcmp; the byte loop below only runs to report a failure
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        panic!(
            "{what}: {n} bytes differ, first at byte {i} (got {:#04x}, want {:#04x})",
            got[i], want[i]
        );
    }
}

/// Reports a skipped check on stderr, past libtest's output capture (which
/// hides `eprintln!` of passing tests), so a skip is never silent.
pub fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// The engines to run every test body with. io_uring is skipped (loudly)
/// only when the kernel refuses it, unless DEEPNVME_TEST_REQUIRE_URING is
/// set, which turns the skip into a failure.
pub fn engines() -> Vec<EngineKind> {
    match crate::engine::io_uring_status() {
        Ok(()) => vec![EngineKind::Uring, EngineKind::Psync],
        Err(why) => {
            if std::env::var_os("DEEPNVME_TEST_REQUIRE_URING").is_some() {
                panic!("io_uring is unavailable ({why}) but DEEPNVME_TEST_REQUIRE_URING is set");
            }
            skip(&format!("io_uring engine not tested: io_uring is unavailable here: {why}"));
            vec![EngineKind::Psync]
        }
    }
}

pub fn config(engine: EngineKind) -> HandleConfig {
    HandleConfig { engine: Some(engine), ..HandleConfig::default() }
}

pub fn handle(engine: EngineKind) -> IoHandle {
    IoHandle::new(config(engine)).expect("creating a handle")
}

pub fn handle_with(
    engine: EngineKind,
    block_size: usize,
    queue_depth: usize,
    single_submit: bool,
    overlap_events: bool,
    intra_op_parallelism: usize,
) -> IoHandle {
    IoHandle::new(HandleConfig {
        block_size,
        queue_depth,
        single_submit,
        overlap_events,
        intra_op_parallelism,
        engine: Some(engine),
    })
    .expect("creating a handle")
}

/// Page-locked memory from the process-wide manager, freed on drop.
pub struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value.
unsafe impl Send for Pinned {}
// SAFETY: `&self` methods only read the memory; writes take `&mut self`.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(len: usize) -> Pinned {
        let ptr = PinnedMemoryManager::shared()
            .alloc(len)
            .unwrap_or_else(|e| panic!("pinned alloc of {len} bytes for a test buffer: {e}"));
        Pinned { ptr, len }
    }
    pub fn with(data: &[u8]) -> Pinned {
        let mut p = Pinned::new(data.len());
        p.as_mut_slice().copy_from_slice(data);
        p
    }
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes of our mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, unique through &mut.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    /// The whole region as a buffer.
    pub fn desc(&self) -> BufferDesc {
        // SAFETY: the memory outlives every op on this desc (each is waited for here).
        unsafe { BufferDesc::from_raw_parts(self.ptr(), self.len) }
    }
    /// A narrow `[off, off + len)` of the region.
    pub fn narrow(&self, off: usize, len: usize) -> BufferDesc {
        assert!(off + len <= self.len);
        // SAFETY: inside the region.
        unsafe { BufferDesc::from_raw_parts(self.ptr().add(off), len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        assert!(PinnedMemoryManager::shared().free(self.ptr.as_ptr()), "freeing a pinned test buffer");
    }
}

/// A plain heap buffer as an op buffer (not pinned: it must bounce).
pub fn heap_desc(v: &mut [u8]) -> BufferDesc {
    // SAFETY: the memory outlives every op on this desc (each is waited for here).
    unsafe { BufferDesc::from_raw_parts(v.as_mut_ptr(), v.len()) }
}

pub fn request<'a>(direction: Direction, target: FileTarget<'a>, file_offset: i64, buffer: BufferDesc) -> OpRequest<'a> {
    OpRequest { direction, target, file_offset, buffer, staging: None, validate: false }
}

/// Number of open descriptors of this process.
pub fn open_fd_count() -> usize {
    fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// VmLck of this process, in bytes.
pub fn vm_locked_bytes() -> usize {
    let status = fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmLck:")).expect("VmLck line");
    let kb: usize = line.split_whitespace().nth(1).expect("VmLck value").parse().expect("VmLck number");
    kb * 1024
}

/// VmPin of this process (`mm->pinned_vm`: pages pinned by io_uring buffer
/// registration), in bytes.
pub fn vm_pinned_bytes() -> usize {
    let status = fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmPin:")).expect("VmPin line");
    line.split_whitespace().nth(1).expect("VmPin value").parse::<usize>().expect("VmPin number") * 1024
}

/// Dirty pages of the mappings of this process that hold any of
/// `[addr, addr + len)`, from /proc/self/smaps, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirtyKib {
    /// Pages this process alone maps (after fork(): copies made for it).
    pub private: usize,
    /// Pages shared with another process (after fork(): copy-on-write).
    pub shared: usize,
}

/// Bytes the process's copy helpers have copied so far (`bounce/copy/helpers.rs`).
pub fn copy_helper_bytes() -> u64 {
    crate::bounce::copy::helper_bytes()
}

/// How many copy helpers this process has (starting them if it has none yet).
pub fn copy_helper_count() -> usize {
    crate::bounce::copy::helper_count()
}

/// The name (`comm`) of each of this process's threads, from /proc/self/task.
pub fn thread_names() -> Vec<String> {
    fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_string())
        .collect()
}

/// This process's threads, less the kernel's io_uring workers (`iou-wrk-*`:
/// the kernel adds them to a ring's owner when a request blocks, more of
/// them on a loaded machine, and they leave on their own timer after the
/// ring is gone): those are not the library's to start or stop.
pub fn threads_but_io_uring_workers() -> usize {
    thread_names().iter().filter(|comm| !comm.starts_with("iou-wrk-")).count()
}

pub fn dirty_kib_of(addr: usize, len: usize) -> DirtyKib {
    DirtyKib { private: smaps_kib_of(addr, len, "Private_Dirty"), shared: smaps_kib_of(addr, len, "Shared_Dirty") }
}

/// The sum of one /proc/self/smaps field (`Private_Dirty`, `AnonHugePages`,
/// ...) over this process's mappings that hold any of `[addr, addr + len)`,
/// in KiB.
pub fn smaps_kib_of(addr: usize, len: usize, field: &str) -> usize {
    let smaps = fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let lo = usize::from_str_radix(lo, 16).unwrap_or(0);
            let hi = usize::from_str_radix(hi, 16).unwrap_or(0);
            inside = lo < addr + len && addr < hi;
        } else if inside && first.strip_suffix(':') == Some(field) {
            total += line.split_whitespace().nth(1).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
        }
    }
    total
}

/// Opens a file with raw flags (O_CLOEXEC added); panics on failure.
pub fn open_fd(path: &Path, flags: i32) -> RawFd {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600 as libc::c_uint) };
    assert!(fd >= 0, "open {}: {}", path.display(), std::io::Error::last_os_error());
    fd
}

pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller owns fd.
    assert_eq!(unsafe { libc::close(fd) }, 0, "close fd {fd}: {}", std::io::Error::last_os_error());
}

/// Whether `fd` is still an open descriptor.
pub fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only inspects the descriptor table.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Writes `data` to a fresh file (plain buffered I/O, no library code).
pub fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).expect("writing a fixture file");
}

pub fn read_file(path: &Path) -> Vec<u8> {
    fs::read(path).expect("reading back a file")
}

/// The libcufile that `pip install nvidia-cufile` (a dependency of CUDA
/// torch) put into a Python environment here, if any: the deepnvme venv
/// (`$DEEPNVME_VENV`, default `~/.cache/deepnvme-venv`), the active venv, or
/// the system's site-packages.
pub fn pip_libcufile() -> Option<String> {
    let home_venv = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/deepnvme-venv"));
    let venvs = [std::env::var_os("DEEPNVME_VENV").map(PathBuf::from), home_venv, std::env::var_os("VIRTUAL_ENV").map(PathBuf::from)];
    let mut roots: Vec<PathBuf> = venvs.into_iter().flatten().map(|v| v.join("lib")).collect();
    roots.extend(["/opt/torch/.venv/lib", "/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    for root in roots {
        let Ok(pythons) = fs::read_dir(&root) else { continue };
        for py in pythons.filter_map(|e| e.ok()) {
            for sub in ["site-packages/nvidia/cu13/lib", "site-packages/nvidia/cufile/lib", "dist-packages/nvidia/cufile/lib"] {
                let p = py.path().join(sub).join("libcufile.so.0");
                if p.is_file() {
                    return Some(p.display().to_string());
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator's bytes stay what they were (a seed in a test's log
    /// replays the same data), and its choices stay in range.
    #[test]
    fn the_generator_is_stable() {
        assert_eq!(pattern(1, 16), [122, 72, 33, 154, 226, 179, 131, 13, 103, 157, 254, 241, 121, 76, 196, 84]);
        assert_eq!(pattern(1, 5), pattern(1, 16)[..5], "a short tail takes the word's first bytes");
        let mut rng = Rng::new(0x9A7);
        let picks: Vec<usize> = (0..1000).map(|_| rng.range(3, 9)).collect();
        assert!(picks.iter().all(|&p| (3..=9).contains(&p)));
        assert!((3..=9).all(|v| picks.contains(&v)), "every value of the range comes up");
    }
}

/// DeepSpeed's handle calls on a core [`IoHandle`], with the core's own
/// errors: what the front ends' `deepspeed::Handle` runs beneath its return
/// codes, write warning and GIL release, for the tests of those semantics.
/// They take what DeepSpeed's calls take (a raw [`BufferDesc`] whose
/// contract holds until the op is finished, an `i64` offset, `async` as a
/// flag); `IoHandle`'s public methods are the Rust API.
pub mod calls {
    use std::time::Duration;

    use crate::buffer::BufferDesc;
    use crate::config::HandleConfig;
    use crate::error::Result;
    use crate::file::FileTarget;
    use crate::handle::IoHandle;
    use crate::op::OpRequest;

    /// `pread(buffer, target, file_offset, async)`: a parallel read, async
    /// (returns 0) or blocking (returns how many ops finished: this one and
    /// every earlier pending one).
    pub fn pread(
        handle: &IoHandle,
        buffer: BufferDesc,
        target: FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        handle.pread(buffer, target, file_offset, is_async)
    }

    /// `pwrite(buffer, target, file_offset, async)`: as [`pread`], writing.
    pub fn pwrite(
        handle: &IoHandle,
        buffer: BufferDesc,
        target: FileTarget<'_>,
        file_offset: i64,
        is_async: bool,
    ) -> Result<usize> {
        handle.pwrite(buffer, target, file_offset, is_async)
    }

    /// `pread`/`pwrite`/`async_*`/`sync_*` with a whole request (a front
    /// end's staging, `validate`): 0 when async, else the ops finished.
    pub fn submit(handle: &IoHandle, request: OpRequest<'_>, is_async: bool) -> Result<usize> {
        handle.submit(request, is_async)
    }

    /// [`submit`], a blocking one waiting in steps of `poll` and calling
    /// `between` after each (the front ends run signal handlers there). An
    /// error from `between` ends the wait with the ops left pending, their
    /// buffers held, for a later `wait()`.
    pub fn submit_polling(
        handle: &IoHandle,
        request: OpRequest<'_>,
        is_async: bool,
        poll: Duration,
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<usize> {
        handle.submit_blocking_with(request, is_async, poll, between)
    }

    /// `wait()` in steps of `poll`, calling `between` after each; see [`submit_polling`].
    pub fn wait_polling(handle: &IoHandle, poll: Duration, between: &mut dyn FnMut() -> Result<()>) -> Result<usize> {
        handle.wait_with(poll, between)
    }

    /// `read`/`write`: one synchronous, unsplit transfer on the calling
    /// thread, after the pending ops it shares memory or file bytes with.
    pub fn transfer_inline(handle: &IoHandle, request: OpRequest<'_>) -> Result<()> {
        handle.transfer_inline(request)
    }

    /// `aio_read`/`aio_write`: one unsplit transfer on the calling thread
    /// with `config`'s parameters, without a handle (no worker threads).
    pub fn transfer_once(config: &HandleConfig, request: OpRequest<'_>) -> Result<()> {
        IoHandle::transfer_once(config, request)
    }
}


/// DeepSpeed's handle knobs, as the front ends pass them (checked by `config()`).
pub use crate::config::DeepSpeedKnobs;

// What the tests of the engine choice and GDS look at, beside the CLI's view (`crate::diag`).
pub use crate::buffer::Staging;
pub use crate::engine::choice::{engine_for_file, punting_fs, PuntingFs};
pub use crate::op::OpRequest;
pub const CUDA_LIB_ENV: &str = crate::knobs::CUDA_LIB_ENV;
