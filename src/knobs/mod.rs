//! Every knob of deepnvme in one place: DeepSpeed's handle defaults, the
//! limits the core enforces, and every environment variable it reads (read
//! once per process, on first use). Other structs derive from these values
//! instead of repeating them; the README's "Knobs" table is [`VARIABLES`]
//! (a test checks that the two agree).
//!
//! KvikIO's `defaults` module is the model: one place to look up what a
//! setting is called, what it defaults to, and what it does.

use std::sync::OnceLock;

// ---------------------------------------------------------------------------
// DeepSpeed's `aio_handle(...)` defaults and the limits the core enforces.
// ---------------------------------------------------------------------------

/// Bytes per I/O request (`block_size`).
pub(crate) const DEFAULT_BLOCK_SIZE: usize = 1 << 20;
/// Requests in flight per worker (`queue_depth`).
pub(crate) const DEFAULT_QUEUE_DEPTH: usize = 128;
/// One submit syscall per request instead of one per batch (`single_submit`).
pub(crate) const DEFAULT_SINGLE_SUBMIT: bool = false;
/// Keep the queue topped up instead of submit-then-wait (`overlap_events`).
pub(crate) const DEFAULT_OVERLAP_EVENTS: bool = false;
/// Worker threads an op is split across (`intra_op_parallelism`).
pub(crate) const DEFAULT_INTRA_OP_PARALLELISM: usize = 1;

/// The largest queue depth: io_uring's ring size limit (`IORING_MAX_ENTRIES`).
pub(crate) const MAX_QUEUE_DEPTH: usize = 32768;
/// The most worker threads one handle may start.
pub(crate) const MAX_INTRA_OP_PARALLELISM: usize = 1024;
/// DeepSpeed's alignment unit: `get_alignment()` = parallelism x this.
pub(crate) const DEEPSPEED_ALIGNMENT_UNIT: usize = 512;
/// O_DIRECT alignment assumed when the kernel does not report
/// `STATX_DIOALIGN`: 4 KiB satisfies every common logical block size.
pub(crate) const CONSERVATIVE_DIO_ALIGNMENT: usize = 4096;

/// DeepSpeed's cuFile `min_io_threshold_size_kb`.
pub(crate) const GDS_MIN_IO_THRESHOLD_SIZE_KB: usize = 8192;
/// The smallest GDS block size: cuFile's max direct-I/O size is
/// `block_size / 1024` KiB, which must be at least 1.
pub(crate) const GDS_MIN_BLOCK_SIZE: usize = 1024;
/// The most threads the GDS piece pool starts (each runs one blocking cuFile
/// call at a time); pieces past that wait for a thread.
pub(crate) const GDS_MAX_PIECE_THREADS: usize = 64;

/// How many times a transfer that keeps answering EAGAIN is resubmitted
/// before it fails naming the errno (with a growing pause in between).
pub(crate) const MAX_EAGAIN_RETRIES: u32 = 64;
/// A blocking CPU op of at most this many bytes, with no other op pending,
/// runs on the calling thread instead of going to a worker and back: the
/// two thread hand-offs cost more than a small transfer (a 4 KiB
/// `sync_pread` round trip is mostly them). Small enough to finish at once,
/// so the call needs no signal polling.
pub(crate) const INLINE_MAX_BYTES: usize = 256 << 10;
/// Requests on files that io_uring punts for (tmpfs, ramfs), run on psync,
/// are whole multiples of this (keeps the O_DIRECT alignment a run had)...
pub(crate) const PUNTING_FS_REQUEST_GRAIN: usize = 1 << 20;
/// ... and at most this large, unless the handle's block size is larger
/// (each request there is one lock round trip: as large as a run allows).
pub(crate) const PUNTING_FS_MAX_REQUEST: usize = 1 << 30;
/// How often a blocking wait called from Python looks for a pending signal
/// (Ctrl-C), so that KeyboardInterrupt ends it promptly.
pub(crate) const SIGNAL_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);
/// How many times in a row a transfer interrupted by a signal (EINTR, no
/// byte moved) is resubmitted before it fails naming the errno. Signals are
/// normal (a profiler's SIGPROF, SIGCHLD), so the bound is far above what
/// any real workload reaches; it only keeps a signal storm from spinning
/// forever.
pub(crate) const MAX_EINTR_RETRIES: u32 = 100_000;

// ---------------------------------------------------------------------------
// Environment variables.
// ---------------------------------------------------------------------------

/// `uring` or `psync`: forces the transfer engine.
pub(crate) const ENGINE_ENV: &str = "DEEPNVME_ENGINE";
/// `quiet` (or `0`, `off`): no informational lines on stderr.
pub(crate) const LOG_ENV: &str = "DEEPNVME_LOG";
/// `1`: a `gds_handle` may be created without GPUDirect Storage.
pub(crate) const GDS_CPU_ONLY_ENV: &str = "DEEPNVME_GDS_CPU_ONLY";
/// The libcufile to load (a path or a name), instead of the default search.
pub(crate) const CUFILE_LIB_ENV: &str = "DEEPNVME_CUFILE_LIB";
/// The libcuda to load (a path or a name), instead of the default search.
pub(crate) const CUDA_LIB_ENV: &str = "DEEPNVME_CUDA_LIB";
/// cuFile's own variable naming its JSON config; a user's value is kept.
pub(crate) const CUFILE_ENV_PATH_JSON: &str = "CUFILE_ENV_PATH_JSON";

/// The most bytes of idle bounce buffers kept for reuse, in MiB.
pub(crate) const BOUNCE_POOL_MB_ENV: &str = "DEEPNVME_BOUNCE_POOL_MB";
/// Default of [`BOUNCE_POOL_MB_ENV`].
pub(crate) const DEFAULT_BOUNCE_POOL_MB: usize = 1024;
/// The most bytes of bounce memory in use at once, process-wide, in MiB.
pub(crate) const BOUNCE_MAX_MB_ENV: &str = "DEEPNVME_BOUNCE_MAX_MB";
/// Default of [`BOUNCE_MAX_MB_ENV`]: a quarter of the machine's memory, at
/// most this many MiB.
pub(crate) const DEFAULT_BOUNCE_MAX_MB_CEILING: usize = 16 << 10;
/// One bounce window of a blocking op on bounced memory (at least a block
/// per worker): small, so that its bytes are copied while the device's
/// writes into it are still in the CPU's cache.
pub(crate) const BOUNCE_WINDOW_BYTES: usize = 4 << 20;
/// The windows such an op streams through: enough to keep the handle's
/// queue (parallelism x depth x block) full, plus two being copied, within
/// these bounds.
pub(crate) const BOUNCE_WINDOWS_MIN: usize = 3;
pub(crate) const BOUNCE_WINDOWS_MAX: usize = 64;
/// The most bytes of windows one blocking op holds (more windows only when
/// they are small).
pub(crate) const BOUNCE_WINDOWS_MAX_BYTES: usize = 256 << 20;
/// A bounced read's chunk whose wait took less than this was already done:
/// the copy, not the device, is behind, and fewer windows ahead keep the
/// next chunk's bytes in the CPU's cache until they are copied.
pub(crate) const BOUNCE_READY_WAIT: std::time::Duration = std::time::Duration::from_micros(20);
/// A bounced read lowers its read-ahead only while its copier spent less
/// than 1/N of its recent time waiting for chunks: a device that delivers
/// chunks in bursts (a VM's disk) leaves some done early, but the copier
/// still waits for most of its time, and fewer windows would starve it.
pub(crate) const BOUNCE_COPY_BOUND_WAIT_SHARE: u64 = 4;
/// One piece of a host copy shared with the copy helpers
/// (`bounce/copy/helpers.rs`): large enough that claiming it costs nothing
/// next to copying it, small enough that a 4 MiB window has eight. Copies
/// of two pieces or more are shared.
pub(crate) const COPY_PIECE_BYTES: usize = 512 << 10;
/// At most this many copy helpers (one per CPU beyond the first).
pub(crate) const COPY_HELPERS_MAX: usize = 7;
/// How long a copying thread spins for a helper's last piece before it
/// sleeps: about one piece's copy.
pub(crate) const COPY_SPIN_FOR_LAST_PIECE: std::time::Duration = std::time::Duration::from_micros(100);
/// Seed of the model-based tests' op sequences (tests only; unset: a fixed
/// seed and one random seed, printed).
pub(crate) const MODEL_SEED_ENV: &str = "DEEPNVME_MODEL_SEED";

/// `1`: print the process's I/O statistics on stderr at exit.
pub(crate) const STATS_ENV: &str = "DEEPNVME_STATS";

/// `0`: io_uring rings never register memory as fixed buffers.
pub(crate) const FIXED_BUFFERS_ENV: &str = "DEEPNVME_FIXED_BUFFERS";
/// Fixed-buffer slots per worker ring (registered lazily, reused least
/// recently used first); io_uring allows 16,384.
pub(crate) const FIXED_BUFFER_SLOTS: u32 = 256;
/// The most bytes one fixed-buffer registration covers: the kernel refuses
/// an iovec over 1 GiB, so larger memory is registered in 1 GiB chunks.
pub(crate) const FIXED_BUFFER_CHUNK: usize = 1 << 30;

/// `0`: mappings of 2 MiB and more (locked tensors, bounce buffers) do not
/// ask for transparent huge pages (`src/pinned/page_buffer.rs`).
pub(crate) const HUGE_PAGES_ENV: &str = "DEEPNVME_HUGE_PAGES";

/// `0`: a worker drains its ring before it starts the next op (see
/// [`MAX_STREAMED_OPS`]).
pub(crate) const OP_STREAM_ENV: &str = "DEEPNVME_OP_STREAM";
/// The most ops one worker ring streams back to back before it lets its
/// ring drain once (so that a fork, which waits for a ring's run, and the
/// release of freed registered memory are never put off for long).
pub(crate) const MAX_STREAMED_OPS: usize = 256;

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The Rust core, at run time (read once, here).
    Core,
    /// The Python package (`bindings/deepnvme`), at import or load time.
    Python,
    /// The build (`bindings/setup.py`, `bindings/install.sh`).
    Build,
    /// The test and benchmark scripts.
    Tests,
}

/// One environment variable: its name, default and meaning.
#[derive(Clone, Copy, Debug)]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// Who reads it.
    pub scope: Scope,
    /// What holds when it is unset.
    pub default: &'static str,
    /// What its values do.
    pub meaning: &'static str,
}

/// Every environment variable deepnvme reads, anywhere in the repository.
pub const VARIABLES: &[EnvVar] = &[
    EnvVar {
        name: ENGINE_ENV,
        scope: Scope::Core,
        default: "io_uring where the kernel allows it (psync for files on tmpfs and ramfs), else psync",
        meaning: "`uring` or `psync`: the transfer engine for every handle and every file (chosen once, said once on stderr)",
    },
    EnvVar {
        name: LOG_ENV,
        scope: Scope::Core,
        default: "informational lines on",
        meaning: "`quiet` (or `0`, `off`) silences informational lines, `1` (or `on`, `info`) keeps them; errors always print",
    },
    EnvVar {
        name: GDS_CPU_ONLY_ENV,
        scope: Scope::Core,
        default: "unset: creating a `gds_handle` without GPUDirect Storage raises",
        meaning: "`1`: such a `gds_handle` is created and serves CPU tensors only",
    },
    EnvVar {
        name: CUFILE_LIB_ENV,
        scope: Scope::Core,
        default: "`libcufile.so.0`, `libcufile.so`, `libcufile.so.1`, then `libcufile.so.12` and other spellings",
        meaning: "the libcufile to load (a path or a name); only that one is tried",
    },
    EnvVar {
        name: CUDA_LIB_ENV,
        scope: Scope::Core,
        default: "`libcuda.so.1`, `libcuda.so`, then `libcuda.so.12` and other spellings",
        meaning: "the libcuda to load (a path or a name); only that one is tried",
    },
    EnvVar {
        name: CUFILE_ENV_PATH_JSON,
        scope: Scope::Core,
        default: "a private config (DeepSpeed's keys) unless `/etc/cufile.json` exists",
        meaning: "cuFile's config file; a value the user set is never replaced",
    },
    EnvVar {
        name: BOUNCE_POOL_MB_ENV,
        scope: Scope::Core,
        default: "`1024`",
        meaning: "MiB of idle bounce buffers (for unpinned, device or strided memory) kept for reuse; `0` keeps none",
    },
    EnvVar {
        name: BOUNCE_MAX_MB_ENV,
        scope: Scope::Core,
        default: "a quarter of physical memory, at most 16384",
        meaning: "MiB of bounce memory that ops not yet finished may hold, process-wide; an async op on unpinned \
                  memory past it fails naming this variable (blocking ops stream through small windows instead)",
    },
    EnvVar {
        name: MODEL_SEED_ENV,
        scope: Scope::Tests,
        default: "unset: a fixed seed and one random seed, printed",
        meaning: "the seed of the model-based caller-memory tests' op sequences, to replay a failure",
    },
    EnvVar {
        name: FIXED_BUFFERS_ENV,
        scope: Scope::Core,
        default: "`1`",
        meaning: "`0`: io_uring never registers locked or bounce memory as fixed buffers (each request then pins \
                  its pages itself, as libaio does)",
    },
    EnvVar {
        name: OP_STREAM_ENV,
        scope: Scope::Core,
        default: "`1`",
        meaning: "`0`: a worker waits for its ring to drain before it starts the next queued op (else back-to-back \
                  ops stream through one ring, with requests of the next op filling the slots the last one frees)",
    },
    EnvVar {
        name: HUGE_PAGES_ENV,
        scope: Scope::Core,
        default: "`1`",
        meaning: "`0`: locked tensors and bounce buffers of 2 MiB and more do not ask for transparent huge pages \
                  (`MADV_HUGEPAGE`, huge-page aligned); THP set to `never` refuses them anyway. With THP's `defrag` \
                  at `madvise` (the usual default) the kernel may compact memory while such a buffer is first \
                  faulted in, once per buffer",
    },
    EnvVar {
        name: STATS_ENV,
        scope: Scope::Core,
        default: "unset: no report",
        meaning: "`1`: at exit, print ops, bytes read/written, bounced bytes, failures and p50/p99 latency on stderr",
    },
    EnvVar {
        name: "DEEPNVME_DEEPSPEED_HOOK",
        scope: Scope::Python,
        default: "`1`",
        meaning: "`0` turns off the import hook that makes DeepSpeed's op builders load deepnvme",
    },
    EnvVar {
        name: "DEEPNVME_OPS",
        scope: Scope::Python,
        default: "`all`",
        meaning: "the ops deepnvme takes over from DeepSpeed's builders: `all`, `none`, or a comma-separated list of `pin_memory`, `async_io`, `gds` (`async_io` or `gds` imply `pin_memory`); the others stay DeepSpeed's JIT-built C++, on deepnvme's pinned manager",
    },
    EnvVar {
        name: "DEEPNVME_FRONTEND",
        scope: Scope::Python,
        default: "unset: the compiled modules while they match the running torch, else the pyo3 front end (said once on stderr)",
        meaning: "`pyo3` or `compiled`: the front end DeepSpeed's op builders load (`deepnvme.frontend`, or DeepSpeed's own bindings compiled against the core)",
    },
    EnvVar {
        name: "DEEPNVME_WHEEL_CHECK",
        scope: Scope::Tests,
        default: "`1`: `tests/run-all.sh` runs `tests/wheel-check.sh`",
        meaning: "`0` skips the wheel check (the abi3 wheel built by maturin, installed into a fresh compiler-less venv, the suite run there)",
    },
    EnvVar {
        name: "DEEPNVME_PREBUILT_CORE",
        scope: Scope::Build,
        default: "unset: cargo builds the core",
        meaning: "a folder with a core built elsewhere (`tests/gpu/stage-core.sh`), for machines without Rust",
    },
    EnvVar {
        name: "DEEPNVME_ACCEPT_BINDING_HASHES",
        scope: Scope::Build,
        default: "unset: only deepspeed 0.19.8's hashes are accepted",
        meaning: "`1`: build DeepSpeed binding files whose sha256 differs (printed in the build log)",
    },
    EnvVar {
        name: "DEEPNVME_VENV",
        scope: Scope::Build,
        default: "`~/.cache/deepnvme-venv`",
        meaning: "the Python environment `bindings/install.sh` and `tests/run-all.sh` create and reuse",
    },
    EnvVar {
        name: "DEEPNVME_TORCH_VERSION",
        scope: Scope::Build,
        default: "`2.15.0`",
        meaning: "the torch `bindings/install.sh` installs",
    },
    EnvVar {
        name: "DEEPNVME_DEEPSPEED_VERSION",
        scope: Scope::Build,
        default: "`0.19.8`",
        meaning: "the deepspeed `bindings/install.sh` installs",
    },
    EnvVar {
        name: "DEEPNVME_WHEELHOUSE",
        scope: Scope::Build,
        default: "unset: PyPI",
        meaning: "a folder of wheels to install from, offline (the GPU check)",
    },
    EnvVar {
        name: "DEEPNVME_TEST_REQUIRE_URING",
        scope: Scope::Tests,
        default: "unset: io_uring cases skip (loudly) where the kernel refuses io_uring",
        meaning: "set: such a skip is a failure",
    },
    EnvVar {
        name: "DEEPNVME_GDS_TEST_DIR",
        scope: Scope::Tests,
        default: "`target/gds-test`",
        meaning: "where the Rust GPU tests put their file (it must accept cuFile)",
    },
    EnvVar {
        name: "DEEPNVME_GDS_BENCH_MB",
        scope: Scope::Tests,
        default: "`0` (not measured)",
        meaning: "MiB moved by the GPU tests' side-by-side GB/s measurement",
    },
    EnvVar {
        name: "DEEPNVME_GPU_TEST_DIR",
        scope: Scope::Tests,
        default: "`target/gpu-test`",
        meaning: "where `tests/gpu/run.sh` puts its files",
    },
    EnvVar {
        name: "DEEPNVME_GPU_BENCH_MB",
        scope: Scope::Tests,
        default: "`512`",
        meaning: "MiB moved by `tests/gpu/test_gds.py`'s GB/s measurement",
    },
    EnvVar {
        name: "DEEPNVME_GPU_FAKE_UDEV",
        scope: Scope::Tests,
        default: "unset",
        meaning: "`1`: `tests/gpu/run.sh` fakes the udev entries cuFile needs on a VM without a udev database",
    },
    EnvVar {
        name: "DEEPNVME_BLESS_API",
        scope: Scope::Tests,
        default: "unset",
        meaning: "set: `tests/public_api.rs` rewrites `tests/public_api.txt` (the public surface, changed on purpose)",
    },
];

/// The engine a process asked for through [`ENGINE_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EngineChoice {
    /// Not set: io_uring where the kernel allows it, else psync.
    Auto,
    Uring,
    Psync,
}

/// The core's environment, read once per process (on first use).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// [`ENGINE_ENV`]; `Err` holds the value that is neither `uring` nor `psync`.
    pub engine: Result<EngineChoice, String>,
    /// [`LOG_ENV`] says quiet.
    pub quiet: bool,
    /// [`GDS_CPU_ONLY_ENV`] is `1`.
    pub gds_cpu_only: bool,
    /// [`CUFILE_LIB_ENV`], when set and not blank.
    pub cufile_lib: Option<String>,
    /// [`CUDA_LIB_ENV`], when set and not blank.
    pub cuda_lib: Option<String>,
    /// [`STATS_ENV`] is `1`.
    pub stats_at_exit: bool,
    /// [`BOUNCE_POOL_MB_ENV`] in bytes.
    pub bounce_pool_max_bytes: usize,
    /// [`BOUNCE_MAX_MB_ENV`] in bytes.
    pub bounce_max_bytes: usize,
    /// [`FIXED_BUFFERS_ENV`] is not `0`.
    pub fixed_buffers: bool,
    /// [`OP_STREAM_ENV`] is not `0`.
    pub op_stream: bool,
    /// [`HUGE_PAGES_ENV`] is not `0`.
    pub huge_pages: bool,
    /// What is wrong with each variable above whose value could not be
    /// read (it then has its default); a handle refuses to start while any
    /// is (see [`malformed_settings`]).
    pub malformed: Vec<String>,
}

/// A whole number of MiB from `name` (`default` when unset or blank); any
/// other value is recorded in `malformed`.
fn mib_from(name: &str, default: impl FnOnce() -> usize, malformed: &mut Vec<String>) -> usize {
    mib_value(name, non_blank(name), default, malformed)
}

fn mib_value(name: &str, value: Option<String>, default: impl FnOnce() -> usize, malformed: &mut Vec<String>) -> usize {
    match value {
        None => default(),
        Some(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
            malformed.push(format!("{name}={v:?} is not a whole number of MiB"));
            default()
        }),
    }
}

/// An on/off switch from `name` (`default` when unset or blank): `1`,
/// `true`, `on`, `yes` or `0`, `false`, `off`, `no`; any other value is
/// recorded in `malformed`.
fn switch_from(name: &str, default: bool, malformed: &mut Vec<String>) -> bool {
    switch_value(name, non_blank(name), default, malformed)
}

fn switch_value(name: &str, value: Option<String>, default: bool, malformed: &mut Vec<String>) -> bool {
    let Some(v) = value else { return default };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => true,
        "0" | "false" | "off" | "no" => false,
        _ => {
            malformed.push(format!("{name}={v:?} is neither 1 nor 0"));
            default
        }
    }
}

/// What is wrong with the environment, naming every malformed variable
/// (`config::check_settings` refuses to make a handle with it).
pub(crate) fn malformed_settings() -> Option<String> {
    let malformed = &settings().malformed;
    (!malformed.is_empty()).then(|| {
        format!("{} (the environment is read once per process: fix or unset it and restart)", malformed.join("; "))
    })
}

fn non_blank(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// [`LOG_ENV`]: `quiet`, `0`, `off` (also `false`, `no`) silence
/// informational lines; `1`, `on`, `info` (also `true`, `yes`) or unset keep
/// them; any other value is recorded in `malformed` (and lines stay on).
fn quiet_value(name: &str, value: Option<String>, malformed: &mut Vec<String>) -> bool {
    let Some(v) = value else { return false };
    match v.trim().to_ascii_lowercase().as_str() {
        "quiet" | "0" | "off" | "false" | "no" => true,
        "1" | "on" | "info" | "true" | "yes" => false,
        _ => {
            malformed.push(format!("{name}={v:?} is neither quiet (0, off) nor on (1, info)"));
            false
        }
    }
}

/// Parses an engine name as [`ENGINE_ENV`] takes it.
pub(crate) fn parse_engine(value: &str) -> Option<EngineChoice> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Some(EngineChoice::Auto),
        "uring" | "io_uring" | "iouring" => Some(EngineChoice::Uring),
        "psync" | "pread" | "threads" => Some(EngineChoice::Psync),
        _ => None,
    }
}

impl Settings {
    /// Reads the variables now (tests use this; everyone else [`settings`]).
    pub fn from_env() -> Settings {
        let engine = match non_blank(ENGINE_ENV) {
            None => Ok(EngineChoice::Auto),
            Some(v) => parse_engine(&v).ok_or(v),
        };
        let mut malformed = Vec::new();
        let m = &mut malformed;
        Settings {
            engine,
            quiet: quiet_value(LOG_ENV, non_blank(LOG_ENV), m),
            gds_cpu_only: switch_from(GDS_CPU_ONLY_ENV, false, m),
            cufile_lib: non_blank(CUFILE_LIB_ENV),
            cuda_lib: non_blank(CUDA_LIB_ENV),
            stats_at_exit: switch_from(STATS_ENV, false, m),
            bounce_pool_max_bytes: mib_from(BOUNCE_POOL_MB_ENV, || DEFAULT_BOUNCE_POOL_MB, m).saturating_mul(1 << 20),
            bounce_max_bytes: mib_from(BOUNCE_MAX_MB_ENV, default_bounce_max_mb, m).saturating_mul(1 << 20),
            fixed_buffers: switch_from(FIXED_BUFFERS_ENV, true, m),
            op_stream: switch_from(OP_STREAM_ENV, true, m),
            huge_pages: switch_from(HUGE_PAGES_ENV, true, m),
            malformed,
        }
    }
}

/// A quarter of physical memory in MiB, at most [`DEFAULT_BOUNCE_MAX_MB_CEILING`].
fn default_bounce_max_mb() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let total_mb = ((pages.max(0) as u64 * page.max(0) as u64) >> 20) as usize;
    (total_mb / 4).clamp(256, DEFAULT_BOUNCE_MAX_MB_CEILING)
}

/// The process's settings, read from the environment on first use. (The
/// way in to every process-wide state, so it installs the fork handlers:
/// see `rt/fork.rs`.)
pub(crate) fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    if !crate::rt::fork::install() {
        // Once: later calls find the handlers' state already failed.
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let msg = "deepnvme: pthread_atfork failed: a fork() copies registered memory, and its child may find a lock held\n";
            // SAFETY: writes our own bytes to stderr; errors are ignored.
            let _ = unsafe { libc::write(libc::STDERR_FILENO, msg.as_ptr().cast(), msg.len()) };
        }
    }
    SETTINGS.get_or_init(Settings::from_env)
}

/// The fork handler's hook (`rt/fork.rs`): settles the settings' `OnceLock`
/// (a fork must not find it half set).
pub(crate) fn settle_for_fork(_: std::time::Instant) -> crate::rt::fork::Held {
    let _ = settings();
    None
}

#[cfg(test)]
mod tests;
