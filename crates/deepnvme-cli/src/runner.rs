//! What `bench` and `tune` share: the benchmark file (a temp file that is
//! removed afterwards, or the user's), the I/O buffer (locked through the
//! process-wide pinned manager), the handle for one set of knobs, one timed
//! pass over the file, CPU time from getrusage, and Ctrl-C handling.
//!
//! A pass moves the file in ops of the buffer's size at increasing offsets.
//! Each op is submitted asynchronously and then waited for, so progress can
//! be reported as every op finishes: the handle's `wait()` finishes *all*
//! pending ops, so waiting per op is the only way to see single completions
//! through its public API. It costs next to nothing, because a worker drains
//! its queue at the end of every op slice anyway; queueing the next op ahead
//! would only save the thread hand-off (tens of microseconds per op).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::args::{fmt_size, CliError};
use crate::core_api::{self, Direction, EngineKind, FileTarget, HandleConfig, IoHandle, LockMode, LockedBuffer, PageAlignedBuffer};
use crate::progress::Progress;

/// GB as the tool reports it: 10^9 bytes (as fio's "GB/s" and disk vendors).
pub const GB: f64 = 1e9;

/// The handle knobs of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AioConfig {
    pub block_size: usize,
    pub queue_depth: usize,
    pub single_submit: bool,
    pub overlap_events: bool,
    pub parallelism: usize,
}

impl AioConfig {
    /// DeepSpeed's `aio_handle()` defaults: 1 MiB blocks, queue depth 128,
    /// no single submit, no overlap, one worker.
    pub fn deepspeed_handle_defaults() -> AioConfig {
        let d = HandleConfig::default();
        AioConfig {
            block_size: d.block_size,
            queue_depth: d.queue_depth,
            single_submit: d.single_submit,
            overlap_events: d.overlap_events,
            parallelism: d.intra_op_parallelism,
        }
    }

    pub fn handle_config(&self, engine: Option<EngineKind>) -> HandleConfig {
        HandleConfig {
            block_size: self.block_size,
            queue_depth: self.queue_depth,
            single_submit: self.single_submit,
            overlap_events: self.overlap_events,
            intra_op_parallelism: self.parallelism,
            engine,
        }
    }

    /// The handle's own checks of these knobs (positive, queue depth and
    /// workers within limits), as a usage message.
    pub fn check(&self, engine: Option<EngineKind>) -> Result<(), String> {
        self.handle_config(engine)
            .validate()
            .map_err(|e| e.to_string().trim_start_matches("invalid argument: ").to_string())
    }

    /// Creates a handle with these knobs (its workers and rings).
    pub fn open_handle(&self, engine: Option<EngineKind>) -> Result<IoHandle, CliError> {
        IoHandle::new(self.handle_config(engine)).map_err(|e| CliError::Failed(format!("creating the I/O handle: {e}")))
    }
}

/// Checks that every op of a pass can be split evenly among the workers, as
/// DeepSpeed requires (`nbytes % intra_op_parallelism == 0`).
pub fn check_split(size: u64, op_bytes: u64, parallelism: usize) -> Result<(), String> {
    let p = parallelism as u64;
    let last = match size % op_bytes {
        0 => op_bytes,
        r => r,
    };
    let ops = [("each op (the smaller of --size and --buffer-size)", op_bytes.min(size)), ("the last op (--size modulo --buffer-size)", last)];
    for (what, n) in ops {
        if n % p != 0 {
            return Err(format!(
                "{what} is {n} bytes, which does not divide evenly among {parallelism} workers \
                 (DeepSpeed requires each op's bytes to be a multiple of intra_op_parallelism); \
                 use sizes that are multiples of {parallelism}"
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The file

/// The file a benchmark reads and writes. Removed on drop when the tool
/// created it and `--keep` was not given; a file that already existed is
/// never removed.
pub struct BenchFile {
    path: PathBuf,
    remove: bool,
    existed: bool,
}

impl BenchFile {
    /// `file` names the file; otherwise a temp file `.deepnvme-TAG-PID.tmp`
    /// is created in `dir` (default: the current directory).
    pub fn open(file: Option<&Path>, dir: Option<&Path>, keep: bool, tag: &str) -> Result<BenchFile, CliError> {
        if let Some(path) = file {
            return match std::fs::metadata(path) {
                Ok(m) if m.is_file() => Ok(BenchFile { path: path.to_path_buf(), remove: false, existed: true }),
                Ok(_) => Err(CliError::Failed(format!("{} exists and is not a regular file", path.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    create_new(path)?;
                    Ok(BenchFile { path: path.to_path_buf(), remove: !keep, existed: false })
                }
                Err(e) => Err(CliError::Failed(format!("cannot use {}: {e}", path.display()))),
            };
        }
        let dir = dir.unwrap_or(Path::new("."));
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(CliError::Failed(format!("{} is not a directory", dir.display()))),
            Err(e) => return Err(CliError::Failed(format!("cannot use directory {}: {e}", dir.display()))),
        }
        let path = dir.join(format!(".deepnvme-{tag}-{}.tmp", std::process::id()));
        create_new(&path)?;
        Ok(BenchFile { path, remove: !keep, existed: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file was there before the tool ran.
    pub fn existed(&self) -> bool {
        self.existed
    }

    /// Whether the file is removed when the run ends.
    pub fn removed_after(&self) -> bool {
        self.remove
    }

    /// Current size in bytes.
    pub fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Warns when the first `size` bytes cannot all be on disk after a
    /// write pass (the file occupies fewer bytes than that): reads of holes
    /// never reach the device, so read GB/s would be inflated. A write path
    /// that truncates the file (O_TRUNC on every op) shows up this way.
    pub fn warn_if_sparse(&self, size: u64) {
        use std::os::unix::fs::MetadataExt;
        let Ok(m) = std::fs::metadata(&self.path) else { return };
        let on_disk = m.blocks() * 512;
        if on_disk < size {
            eprintln!(
                "deepnvme: warning: after writing {} to {}, the file occupies only {} on disk; \
                 it has holes (was it truncated by an op?), and reads of holes never reach the device",
                fmt_size(size),
                self.path.display(),
                fmt_size(on_disk)
            );
        }
    }

    /// Fails early when the file system cannot hold `size` bytes of file.
    pub fn check_space(&self, size: u64) -> Result<(), CliError> {
        let need = size.saturating_sub(self.len());
        if need == 0 {
            return Ok(());
        }
        let Some(free) = free_bytes(&self.path) else { return Ok(()) };
        if free < need {
            return Err(CliError::Failed(format!(
                "not enough free space for {} of test file at {}: {} free (use --size or --dir)",
                fmt_size(size),
                self.path.display(),
                fmt_size(free)
            )));
        }
        Ok(())
    }
}

impl Drop for BenchFile {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn create_new(path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map(drop)
        .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", path.display())))
}

fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills a zeroed struct from a valid C string.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) != 0 {
            return None;
        }
        Some(s.f_bavail as u64 * s.f_frsize as u64)
    }
}

// ---------------------------------------------------------------------------
// The buffer

/// Page-aligned I/O memory, filled with a non-repeating pattern.
///
/// It is allocated locked ([`LockedBuffer`], from the process-wide pinned
/// manager), as
/// DeepSpeed's `new_cpu_locked_tensor` does, so the handle recognises it and
/// moves bytes straight to/from it. When RLIMIT_MEMLOCK forbids locking that
/// much (8 MiB is a common default for non-root users), the buffer falls back
/// to unlocked page-aligned memory that the tool declares usable for direct
/// I/O: O_DIRECT does not need mlock (the kernel pins the pages of each
/// request itself), and the memory is touched up front so no page fault is
/// timed. The result says which one was used.
pub struct BenchBuffer {
    memory: BenchMemory,
    lock_error: Option<String>,
}

enum BenchMemory {
    Locked(LockedBuffer),
    Unlocked(PageAlignedBuffer),
}

impl BenchBuffer {
    pub fn new(len: usize) -> Result<BenchBuffer, CliError> {
        let failed = |e: core_api::Error| CliError::Failed(format!("allocating the {} I/O buffer: {e}", fmt_size(len as u64)));
        let mut buf = match LockedBuffer::new(len) {
            Ok(b) => BenchBuffer { memory: BenchMemory::Locked(b), lock_error: None },
            Err(e) if core_api::is_lock_error(&e) => {
                let fallback = PageAlignedBuffer::new(len, LockMode::None).map_err(failed)?;
                BenchBuffer { memory: BenchMemory::Unlocked(fallback), lock_error: Some(e.to_string()) }
            }
            Err(e) => return Err(failed(e)),
        };
        buf.fill();
        Ok(buf)
    }

    /// xorshift64 words: incompressible enough, and every page gets touched.
    fn fill(&mut self) {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for chunk in self.bytes_mut().chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.memory {
            BenchMemory::Locked(b) => b,
            BenchMemory::Unlocked(b) => b.as_slice(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            BenchMemory::Locked(b) => b,
            BenchMemory::Unlocked(b) => b.as_mut_slice(),
        }
    }

    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// True when the memory is locked (pinned-manager memory).
    pub fn locked(&self) -> bool {
        matches!(self.memory, BenchMemory::Locked(_))
    }

    /// Why locking failed, when it did.
    pub fn lock_error(&self) -> Option<&str> {
        self.lock_error.as_deref()
    }
}

// ---------------------------------------------------------------------------
// Timing

/// User + system CPU seconds of the whole process, all threads included
/// (the handle's workers and any io_uring kernel workers of the process).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a zeroed struct.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        r
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// One timed pass over the file.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    pub bytes: u64,
    pub secs: f64,
    pub cpu_secs: f64,
}

impl Pass {
    pub fn gb_per_s(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / GB / self.secs
        } else {
            f64::INFINITY
        }
    }
}

/// Moves `size` bytes between the file and `buf`, in ops of `buf.len()`
/// bytes at increasing offsets (see the module doc), reporting progress.
pub fn run_pass(
    handle: &IoHandle,
    buf: &mut BenchBuffer,
    path: &Path,
    size: u64,
    direction: Direction,
    progress: &mut Progress,
) -> Result<Pass, CliError> {
    let op_bytes = buf.len() as u64;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut done = 0u64;
    while done < size {
        if interrupted() {
            return Err(CliError::Interrupted);
        }
        let len = op_bytes.min(size - done) as usize;
        let fail = |e: core_api::Error| CliError::Failed(format!("{} pass failed: {e}", direction.verb()));
        // One async op, waited for, as DeepSpeed's swappers issue them.
        let target = FileTarget::Path(path);
        let outcome = match direction {
            Direction::Read => {
                let bytes = &mut buf.bytes_mut()[..len];
                handle.scope(move |s| s.read(bytes, target, done))
            }
            Direction::Write => {
                let bytes = &buf.bytes()[..len];
                handle.scope(move |s| s.write(bytes, target, done))
            }
        };
        outcome.and_then(|submitted| submitted).map_err(fail)?;
        done += len as u64;
        progress.update(done, size, t0.elapsed().as_secs_f64());
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_secs = cpu_seconds() - cpu0;
    progress.finish();
    Ok(Pass { bytes: size, secs, cpu_secs })
}

/// Best (highest GB/s) and mean GB/s of several passes, and CPU s/GB over all.
#[derive(Clone, Debug)]
pub struct Summary {
    pub passes: Vec<Pass>,
}

impl Summary {
    pub fn best_gb_per_s(&self) -> f64 {
        self.passes.iter().map(Pass::gb_per_s).fold(0.0, f64::max)
    }
    pub fn mean_gb_per_s(&self) -> f64 {
        if self.passes.is_empty() {
            return 0.0;
        }
        self.passes.iter().map(Pass::gb_per_s).sum::<f64>() / self.passes.len() as f64
    }
    pub fn cpu_per_gb(&self) -> f64 {
        let cpu: f64 = self.passes.iter().map(|p| p.cpu_secs).sum();
        let bytes: u64 = self.passes.iter().map(|p| p.bytes).sum();
        cpu / (bytes as f64 / GB)
    }
}

// ---------------------------------------------------------------------------
// Ctrl-C

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The first SIGINT/SIGTERM asks the run to stop after the op in flight (so
/// the temp file is removed); a second one kills the process as usual.
pub fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bench --help` states these defaults ("[default: 1M]" and so on).
    #[test]
    fn handle_defaults_are_deepspeeds() {
        let k = AioConfig::deepspeed_handle_defaults();
        assert_eq!(
            k,
            AioConfig { block_size: 1 << 20, queue_depth: 128, single_submit: false, overlap_events: false, parallelism: 1 }
        );
        assert!(k.check(None).is_ok());
        let too_deep = AioConfig { queue_depth: 40000, ..k }.check(None).unwrap_err();
        assert!(too_deep.starts_with("queue_depth 40000"), "{too_deep}");
    }

    #[test]
    fn split_rules() {
        assert!(check_split(1 << 30, 256 << 20, 1).is_ok());
        assert!(check_split(1 << 30, 256 << 20, 8).is_ok());
        assert!(check_split(1000, 4096, 3).is_err());
        assert!(check_split(4097, 4096, 2).is_err());
        assert!(check_split(4096 * 3, 4096 * 2, 2).is_ok());
    }
}
