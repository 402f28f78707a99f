//! The engine per file: which engine moves an op's bytes, given the file
//! system its file is on.
//!
//! io_uring moves a read or write itself only when the file system can do
//! it without blocking (`IOCB_NOWAIT`). tmpfs and ramfs cannot: every
//! request goes to a kernel worker thread (`iou-wrk-*`), one at a time per
//! file, which costs a hand-off and a wake-up and loses to plain
//! pread/pwrite on the handle's own threads (docs/perf/fast_device.md). So
//! ops on such files run on the psync engine, decided per op from the
//! file's `statfs` type, unless the engine was chosen explicitly
//! (`DEEPNVME_ENGINE`, or [`crate::HandleConfig::engine`]): an explicit
//! choice applies to every file. Said once per file system on stderr.
//!
//! [`Routed`] wraps every engine a handle makes: it holds the psync engine
//! for such files and counts the runs each engine made (handle and process
//! statistics, which is how the tests see which engine ran an op).

use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::psync::PsyncEngine;
use super::contract::{AioParams, Engine, EngineKind, StreamRun, StreamSource};
use super::fixed;
pub(crate) use super::filesystem::punting_fs_of;
pub use super::filesystem::{punting_fs, PuntingFs};
use super::piece::Segment;
use crate::error::{Direction, TransferError};
use crate::knobs::{self, EngineChoice};
use crate::stats::{self, Counters};

/// Whether a handle whose engine is `kind` picks the engine per file:
/// only io_uring that nobody asked for by name.
pub(crate) fn follows_files(asked: Option<EngineKind>, kind: EngineKind) -> bool {
    kind == EngineKind::Uring && asked.is_none() && matches!(knobs::settings().engine, Ok(EngineChoice::Auto))
}

/// The engine a handle made with `asked` (as [`crate::HandleConfig::engine`])
/// would move bytes of the file open on `fd` with, and the file system that
/// decided it when that was not the handle's engine.
pub fn engine_for_file(asked: Option<EngineKind>, fd: RawFd) -> crate::Result<(EngineKind, Option<PuntingFs>)> {
    let kind = match asked {
        Some(k) => k,
        None => super::default_kind()?,
    };
    match punting_fs(fd) {
        Some(fs) if follows_files(asked, kind) => Ok((EngineKind::Psync, Some(fs))),
        _ => Ok((kind, None)),
    }
}

/// The parameters a psync run of `bytes` on such a file uses instead of
/// `params`. There is no device queue to fill, only a copy: a write holds
/// the file's inode lock for its whole copy, so a second writer thread only
/// waits (one thread per worker, as the stock op's io_submit copies), and
/// each request is a lock round trip, so a request is as large as the run
/// allows; reads copy in parallel, a thread per core among the op's
/// `workers` (more would only take turns), one request each.
pub(crate) fn psync_params(direction: Direction, params: &AioParams, bytes: usize, workers: usize) -> AioParams {
    let threads = match direction {
        Direction::Write => 1,
        Direction::Read => {
            // (available_parallelism reads cgroup files: asked once.)
            static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
            let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            params.queue_depth.clamp(1, (cores / workers.max(1)).max(1))
        }
    };
    let grain = knobs::PUNTING_FS_REQUEST_GRAIN;
    let block = bytes.div_ceil(threads).div_ceil(grain).saturating_mul(grain).min(knobs::PUNTING_FS_MAX_REQUEST);
    AioParams { queue_depth: threads, block_size: block.max(params.block_size), ..*params }
}

/// The rule, in one line (`deepnvme info`).
pub const FILE_ENGINE_RULE: &str = "files on tmpfs and ramfs use the psync engine (io_uring could only hand their reads and \
                        writes to kernel worker threads); an engine chosen explicitly (DEEPNVME_ENGINE, \
                        HandleConfig::engine) applies to every file";

/// Says once per file system that its files run on psync.
pub(crate) fn note_routed(fs: PuntingFs, path: Option<&Path>) {
    // Every routed slice passes here: format nothing once it was said.
    static TMPFS: AtomicBool = AtomicBool::new(false);
    static RAMFS: AtomicBool = AtomicBool::new(false);
    let said = match fs {
        PuntingFs::Tmpfs => &TMPFS,
        PuntingFs::Ramfs => &RAMFS,
    };
    if said.swap(true, Ordering::Relaxed) {
        return;
    }
    let file = path.map(|p| format!(" ({})", p.display())).unwrap_or_default();
    crate::rt::log::info_once(
        &format!("file-engine-{}", fs.name()),
        &format!(
            "files on {}{file} use the psync engine: io_uring could only hand their reads and writes to kernel \
             worker threads ({}=uring keeps io_uring for them)",
            fs.name(),
            knobs::ENGINE_ENV
        ),
    );
}

/// What a handle's engines are made with: whether they follow files, and
/// the handle's counters (none for a one-shot transfer without a handle).
#[derive(Clone, Default)]
pub(crate) struct EngineRoute {
    pub follows_files: bool,
    pub counters: Option<Arc<Counters>>,
}

/// An engine of a handle: its own engine, and the psync engine for files
/// io_uring punts for (when the handle follows files). Counts runs.
pub(crate) struct Routed {
    inner: Box<dyn Engine>,
    for_files: Option<Box<Routed>>,
    counters: Option<Arc<Counters>>,
}

impl Routed {
    pub fn new(inner: Box<dyn Engine>, queue_depth: usize, route: &EngineRoute) -> Routed {
        let for_files = (route.follows_files && inner.kind() != EngineKind::Psync).then(|| {
            Box::new(Routed { inner: Box::new(PsyncEngine::new(queue_depth)), for_files: None, counters: route.counters.clone() })
        });
        Routed { inner, for_files, counters: route.counters.clone() }
    }

    fn count(&self, runs: u64) {
        let kind = self.inner.kind();
        if let Some(c) = &self.counters {
            c.record_runs(kind, runs);
        }
        stats::process_counters().record_runs(kind, runs);
    }
}

/// Counts the runs a stream starts.
struct Counting<'a> {
    source: &'a mut dyn StreamSource,
    runs: u64,
}

impl StreamSource for Counting<'_> {
    fn next_run(&mut self) -> Option<StreamRun> {
        let run = self.source.next_run();
        self.runs += run.is_some() as u64;
        run
    }
    fn run_done(&mut self, n: usize, outcome: std::result::Result<(), TransferError>) {
        self.source.run_done(n, outcome)
    }
}

impl Engine for Routed {
    fn kind(&self) -> EngineKind {
        self.inner.kind()
    }
    fn run_with(
        &mut self,
        direction: Direction,
        segments: &[Segment],
        params: &AioParams,
        memory: Option<&Arc<fixed::RegistrableMemory>>,
    ) -> std::result::Result<(), TransferError> {
        self.count(1);
        self.inner.run_with(direction, segments, params, memory)
    }
    fn run_stream(&mut self, source: &mut dyn StreamSource) {
        let mut counting = Counting { source, runs: 0 };
        self.inner.run_stream(&mut counting);
        let runs = counting.runs;
        self.count(runs);
    }
    fn streams_runs(&self) -> bool {
        self.inner.streams_runs()
    }
    fn release_retired(&mut self) {
        self.inner.release_retired()
    }
    fn quiesce(&mut self) {
        self.inner.quiesce();
        if let Some(p) = &mut self.for_files {
            p.quiesce();
        }
    }
    fn is_broken(&self) -> bool {
        self.inner.is_broken()
    }
    fn for_file_system(&mut self, _fs: PuntingFs) -> Option<&mut dyn Engine> {
        Some(self.for_files.as_deref_mut()? as &mut dyn Engine)
    }
}
