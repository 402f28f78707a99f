//! [`IoHandle`]: its parts, its construction (`new`, `new_gds`) and its
//! drop, and the process it belongs to. Its workers (`deepnvme-io-N`) are
//! started through `rt/threads.rs`.


use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::Arc;

use crate::rt::sync::Mutex;

use super::device::*;
use super::latch::*;
use super::workers::*;
use crate::config::HandleConfig;
use crate::engine::choice::{self, EngineRoute, Routed};
use crate::engine::fixed::RetireListener;
use crate::engine::psync::PsyncEngine;
use crate::engine::{self, Engine, EngineKind, Submitter};
use crate::error::{Error, Result};
use crate::gds::GdsDriver;
use crate::knobs;
use crate::bounce::read_ahead::ReadAheadMemory;
use crate::pinned::PinnedMemoryManager;
use crate::stats::{self, Counters};
use crate::rt::threads::{self, Role};

/// A DeepNVMe I/O handle: `deepspeed_io_handle_t`, or with
/// [`IoHandle::new_gds`], `deepspeed_gds_handle_t`.
///
/// ```
/// use deepnvme::{FileTarget, HandleConfig, IoHandle};
///
/// let dir = std::env::temp_dir().join(format!("deepnvme-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("handle.bin");
/// let handle = IoHandle::new(HandleConfig { intra_op_parallelism: 2, ..HandleConfig::default() })?;
///
/// let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
/// assert_eq!(handle.write_from(&data, FileTarget::Path(&path), 0)?, 1); // one op finished
///
/// let mut back = vec![0u8; data.len()];
/// handle.read_into(&mut back, FileTarget::Path(&path), 0)?;
/// assert_eq!(back, data);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct IoHandle {
    pub(super) config: HandleConfig,
    pub(super) engine_kind: EngineKind,
    pub(super) workers: Vec<Worker>,
    pub(super) pending: Mutex<VecDeque<Arc<InFlight>>>,
    /// The ordering point's lock and sequence numbers (`order.rs`).
    pub(super) admission: super::admission::AdmissionLock,
    /// Engine of the ops that run on the calling thread (small blocking
    /// ops, `read`/`write`) with more than one request per slice; None only
    /// after it broke, until the next such op makes a new one.
    pub(super) inline_engine: Mutex<Option<Box<dyn Engine>>>,
    /// Engine of the calling thread's ops of one request per slice: a
    /// pread/pwrite each (see [`IoHandle::run_on_inline_engine`]). Depth 1:
    /// it never starts a thread.
    pub(super) one_request_engine: Mutex<Routed>,
    /// How this handle's engines are made (the engine per file, counters).
    pub(super) route: EngineRoute,
    pub(super) manager: &'static PinnedMemoryManager,
    pub(super) device_route: DeviceRoute,
    /// What this handle did (the process-wide counters get the same records).
    pub(super) counters: Arc<Counters>,
    pub(super) stream_tally: Arc<StreamTally>,
    /// Where this handle's bounced blocking reads left their read-ahead.
    pub(super) read_ahead: ReadAheadMemory,
    /// The process that created the handle. A child made by fork() inherits
    /// the handle but not its worker threads (and shares its rings with the
    /// parent), so every entry point refuses to run in another process.
    pub(super) creator_pid: u32,
    /// The same process as `threads` tells it: pid and fork generation
    /// (a descendant can have the creator's pid; see `threads::StartedIn`).
    pub(super) started_in: threads::StartedIn,
}

pub(super) fn resolve_engine(config: &HandleConfig) -> Result<EngineKind> {
    match config.engine {
        Some(EngineKind::Uring) => {
            engine::io_uring_status()
                .map_err(|why| Error::Engine(format!("io_uring is unavailable: {why}")))?;
            Ok(EngineKind::Uring)
        }
        Some(k) => Ok(k),
        None => engine::default_kind(),
    }
}

impl IoHandle {
    /// The channels to the workers still running.
    pub(super) fn worker_senders(&self) -> Vec<Arc<mpsc::Sender<WorkerMsg>>> {
        self.workers.iter().filter_map(|w| w.jobs.clone()).collect()
    }

    /// An aio handle: `intra_op_parallelism` workers, each with its engine.
    pub fn new(config: HandleConfig) -> Result<IoHandle> {
        Self::build(config, DeviceRoute::Bounce)
    }

    /// A GDS handle (`deepspeed_gds_handle_t`): contiguous CUDA buffers go
    /// through cuFile with `intra_op_parallelism` threads; everything else
    /// takes the CPU path on one worker, as in DeepSpeed. Without GPUDirect
    /// Storage this fails naming what is missing, unless
    /// `DEEPNVME_GDS_CPU_ONLY=1`, which makes a handle that serves
    /// CPU buffers only. May block (cuFile driver open).
    pub fn new_gds(config: HandleConfig) -> Result<IoHandle> {
        config.validate()?;
        crate::config::check_settings()?;
        let cpu_config = HandleConfig {
            intra_op_parallelism: 1,
            ..config.clone()
        };
        if let Err(why) = crate::gds::probe() {
            let why = why.to_string();
            if !knobs::settings().gds_cpu_only {
                return Err(crate::gds::unavailable(format!(
                    "gds_handle cannot be created: {why} (set {}=1 for a handle that serves CPU tensors only)",
                    knobs::GDS_CPU_ONLY_ENV
                )));
            }
            crate::rt::log::info_once(
                "gds-cpu-only",
                &format!(
                    "gds_handle without GPUDirect Storage ({why}); {}=1, so it serves CPU tensors only",
                    knobs::GDS_CPU_ONLY_ENV
                ),
            );
            return Self::build(cpu_config, DeviceRoute::GdsUnavailable(why));
        }
        let driver = GdsDriver::acquire(
            config.queue_depth,
            config.intra_op_parallelism,
            config.block_size,
        )?;
        let gds = GdsHalf {
            driver: Arc::new(driver),
            parallelism: config.intra_op_parallelism,
            block_size: config.block_size,
        };
        Self::build(cpu_config, DeviceRoute::Gds(gds))
    }

    pub(super) fn build(config: HandleConfig, device_route: DeviceRoute) -> Result<IoHandle> {
        config.validate()?;
        crate::config::check_settings()?;
        stats::report_at_exit_if_asked();
        let engine_kind = resolve_engine(&config)?;
        let counters = Arc::new(Counters::new());
        let route = EngineRoute {
            follows_files: choice::follows_files(config.engine, engine_kind),
            counters: Some(counters.clone()),
        };
        let mut workers = Vec::with_capacity(config.intra_op_parallelism);
        let stream_tally = Arc::new(StreamTally::default());
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        for index in 0..config.intra_op_parallelism {
            let (tx, rx) = mpsc::channel::<WorkerMsg>();
            let qd = config.queue_depth;
            let tally = stream_tally.clone();
            let ready = ready_tx.clone();
            let worker_route = route.clone();
            let thread = threads::spawn(Role::IoWorker, index, move || {
                worker_loop(engine_kind, worker_route, qd, rx, tally, ready)
            })?;
            let tx = Arc::new(tx);
            if engine_kind == EngineKind::Uring {
                let listener: Arc<dyn RetireListener> = tx.clone();
                crate::engine::fixed::add_retire_listener(Arc::downgrade(&listener));
            }
            workers.push(Worker {
                jobs: Some(tx),
                thread: Some(thread),
            });
        }
        // Every worker has made its engine (its ring, its fds) before the
        // handle is handed out: what a new handle holds is then fixed when
        // `new` returns, not some moment later (a caller that counts its
        // descriptors, or forks, sees all of them), and a ring that cannot
        // be made is logged here. A worker that died first drops its sender.
        drop(ready_tx);
        for index in 0..workers.len() {
            if ready_rx.recv().is_err() {
                return Err(Error::Engine(format!(
                    "I/O worker {index} of {} ended while starting",
                    workers.len()
                )));
            }
        }
        // Made now, like the workers' rings, so that a handle holds the same
        // descriptors from `new` to drop (not one more after its first
        // blocking op of more than one block).
        let inline_engine = worker_engine(engine_kind, config.queue_depth, Submitter::AnyThread, &route);
        let one_request_engine = Routed::new(Box::new(PsyncEngine::new(1)), 1, &EngineRoute { follows_files: false, ..route.clone() });
        Ok(IoHandle {
            config,
            engine_kind,
            workers,
            pending: Mutex::new(VecDeque::new()),
            admission: Default::default(),
            inline_engine: Mutex::new(Some(inline_engine)),
            one_request_engine: Mutex::new(one_request_engine),
            route,
            manager: PinnedMemoryManager::shared(),
            device_route,
            counters,
            stream_tally,
            read_ahead: ReadAheadMemory::default(),
            creator_pid: std::process::id(),
            started_in: threads::StartedIn::here(),
        })
    }

    /// True in a child made by fork() after the handle was created.
    pub(super) fn forked(&self) -> bool {
        !self.started_in.is_here()
    }

    /// Refuses at once in a process other than the one that made the handle:
    /// its workers do not exist there, so a call would wait forever.
    pub(super) fn check_process(&self) -> Result<()> {
        if self.forked() {
            return Err(Error::Engine(format!(
                "this handle was created in process {} and cannot be used in process {} after fork(): \
                 its I/O threads do not exist in the child; create a new handle in the child",
                self.creator_pid,
                std::process::id()
            )));
        }
        Ok(())
    }
}

impl Drop for IoHandle {
    fn drop(&mut self) {
        if self.forked() {
            // A child of fork(): the workers are threads of the parent, so
            // joining them would wait forever, and the rings, the pending
            // ops and the GDS driver belong to the parent. Leak all of it
            // (memory only); the parent's handle is untouched.
            std::mem::forget(std::mem::take(&mut self.workers));
            std::mem::forget(std::mem::take(self.pending.get_mut()));
            std::mem::forget(self.inline_engine.get_mut().take());
            std::mem::forget(std::mem::replace(
                &mut self.device_route,
                DeviceRoute::Bounce,
            ));
            return;
        }
        // Finish what is in flight: the kernel may still be using the buffers.
        if self.pending_ops() > 0 {
            if let Err(e) = self.wait() {
                crate::rt::log::error(&format!(
                    "handle dropped with ops in flight; finishing them failed: {e}"
                ));
            }
        }
        for w in &mut self.workers {
            w.jobs.take();
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

