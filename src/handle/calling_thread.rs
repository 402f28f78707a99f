//! Ops on the calling thread: DeepSpeed's `read`/`write`, small
//! blocking ops, and one-shot transfers without a handle (on the calling
//! thread's own engine, made afresh in a child of `fork()`: see `rt/threads.rs`).
//! The first and the last are DeepSpeed-shaped, so crate-internal:
//! `crate::deepspeed` calls them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use super::construction::*;
use super::order::*;
use super::outcome::finish_panic;
use super::windowed::*;
use super::workers::*;
use crate::config::HandleConfig;
use crate::engine::{Engine, EngineKind, Submitter};
use crate::error::{panic_text, Direction, Error, Result};
use crate::bounce::read_ahead::ReadAheadMemory;
use crate::bounce::window::{ChunkRunner, Windowed, WindowedOp};
use crate::op::work::{OpCompletion, OpFootprint, OpWork};
use crate::op::checks::NO_EARLIER_WRITES;
use crate::op::{CpuOp, Mode, OpRequest, Prepared};
use crate::pinned::PinnedMemoryManager;
use crate::stats::{self, OpRecord};
use crate::rt::threads::StartedIn;

impl IoHandle {
    /// `read`/`write`: one synchronous, unsplit transfer on the calling
    /// thread (always through the CPU path, bouncing device memory). It is
    /// admitted like every op (`order.rs`), so it takes effect after the
    /// ops admitted before it that share its memory or file bytes, and
    /// before any admitted after it. Unlike a blocking `pread`, it does not
    /// finish other pending ops (DeepSpeed's `read`/`write` do not).
    pub(crate) fn transfer_inline(&self, request: OpRequest<'_>) -> Result<()> {
        self.check_process()?;
        self.waiting(|| {
            let b = &request.buffer;
            let memory = OpFootprint::of_memory(b.ptr() as usize, b.len(), request.direction == Direction::Read);
            let (entry, prepared) = {
                let turn = self.admission.enter()?;
                self.settle_matching(|fp| fp.memory_conflicts(&memory))?;
                let prepared = CpuOp::prepare(request, 1, self.config.aio_params(), self.manager, Mode::Blocking, &|file, end| {
                    self.settle_writes_growing(file, end)
                })?;
                let meta = match &prepared {
                    Prepared::Op(op) => op.meta(),
                    Prepared::Windowed(op) => windowed_meta(op),
                };
                (self.admit(&turn, Admit::Driven { meta, parked: None }, false)?, prepared)
            };
            // Earlier queued ops on the same file bytes run their slices first.
            entry.until_predecessors_done();
            let result = catch_unwind(AssertUnwindSafe(|| match prepared {
                Prepared::Op(mut op) => {
                    let plan = op.plan().clone();
                    let outcome = self.run_on_inline_engine(plan.as_ref(), entry.meta.bytes);
                    op.finish(outcome)
                }
                Prepared::Windowed(op) => self.with_inline_engine(|engine| run_windowed_inline(op, engine)),
            }))
            .unwrap_or_else(|payload| Err(finish_panic(&*payload)));
            entry.end_driven();
            self.retire(&entry);
            self.record(entry.meta, result.is_ok(), entry.started);
            result
        })
    }

    /// Runs every slice of `work` (an op of `bytes`) on the calling thread.
    /// An op of at most one block has one request per slice: a
    /// pread/pwrite is one syscall that sleeps until the data is there,
    /// where an io_uring round trip adds a completion wake-up and a reap.
    /// Larger ops use the handle's inline engine (made in `new`, replaced
    /// once it cannot be trusted).
    pub(super) fn run_on_inline_engine(&self, work: &dyn OpWork, bytes: u64) -> Result<()> {
        if bytes <= self.config.block_size as u64 {
            return run_guarded(work, &mut *self.one_request_engine.lock());
        }
        self.with_inline_engine(|engine| run_guarded(work, engine))
    }

    /// Runs `f` on the handle's inline engine (made in `new`), replacing
    /// the engine once it cannot be trusted.
    fn with_inline_engine<T>(&self, f: impl FnOnce(&mut dyn Engine) -> T) -> T {
        let mut slot = self.inline_engine.lock();
        let engine = slot.get_or_insert_with(|| {
            worker_engine(self.engine_kind, self.config.queue_depth, Submitter::AnyThread, &self.route)
        });
        let out = f(engine.as_mut());
        if engine.is_broken() {
            *slot = None;
        }
        out
    }

    /// One unsplit synchronous transfer on the calling thread with `config`'s
    /// knobs, without a handle (DeepSpeed's `aio_read`/`aio_write`): no
    /// worker threads are started; the engine is kept per calling thread and
    /// reused by its next call.
    pub(crate) fn transfer_once(config: &HandleConfig, request: OpRequest<'_>) -> Result<()> {
        config.validate()?;
        let kind = resolve_engine(config)?;
        let follows_files = crate::engine::choice::follows_files(config.engine, kind);
        let started = Instant::now();
        let manager = PinnedMemoryManager::shared();
        let (meta, result) =
            match CpuOp::prepare(request, 1, config.aio_params(), manager, Mode::Blocking, NO_EARLIER_WRITES)? {
                Prepared::Op(mut op) => {
                    let meta = op.meta();
                    let plan = op.plan().clone();
                    let outcome = with_thread_engine(kind, follows_files, config.queue_depth, |engine| {
                        run_guarded(plan.as_ref(), engine)
                    });
                    (meta, op.finish(outcome))
                }
                Prepared::Windowed(op) => {
                    let meta = windowed_meta(&op);
                    let outcome = with_thread_engine(kind, follows_files, config.queue_depth, |engine| {
                        run_windowed_inline(op, engine)
                    });
                    (meta, outcome)
                }
            };
        stats::process_counters().record_wait(started.elapsed());
        stats::process_counters().record(&OpRecord {
            direction: meta.direction,
            bytes: meta.bytes,
            bounced_bytes: meta.bounced_bytes,
            ok: result.is_ok(),
            latency: started.elapsed(),
        });
        result
    }
}

/// A windowed op's chunks on the calling thread's engine, one at a time.
pub(super) struct InlineChunks<'a> {
    pub(super) engine: &'a mut dyn Engine,
    pub(super) last: Option<Result<()>>,
}

impl ChunkRunner for InlineChunks<'_> {
    fn depth(&self) -> usize {
        1
    }
    fn start(&mut self, plan: Arc<crate::op::plan::OpPlan>) -> Result<()> {
        self.last = Some(run_guarded(plan.as_ref(), self.engine));
        Ok(())
    }
    fn finish_oldest(&mut self) -> Result<()> {
        self.last.take().unwrap_or(Ok(()))
    }
}

/// Runs a windowed op on the calling thread's engine (never interrupted).
pub(super) fn run_windowed_inline(op: WindowedOp, engine: &mut dyn Engine) -> Result<()> {
    // One chunk in flight at a time here: there is no read-ahead to keep.
    match op.start(InlineChunks { engine, last: None }, ReadAheadMemory::default(), &mut || Ok(())) {
        Windowed::Done(outcome) => outcome,
        Windowed::Suspended(suspended) => suspended.resume(),
    }
}

/// Runs an op's slices in order on the calling thread, stopping at the
/// first error. A panic fails the op, after the engine has stopped moving
/// its bytes (a ring is then marked broken, and replaced by its owner).
pub(super) fn run_guarded(work: &dyn OpWork, engine: &mut dyn Engine) -> Result<()> {
    for slice in 0..work.slice_count() {
        match catch_unwind(AssertUnwindSafe(|| work.run_slice(slice, engine))) {
            Ok(outcome) => outcome?,
            Err(payload) => {
                let _ = catch_unwind(AssertUnwindSafe(|| engine.quiesce()));
                return Err(Error::Engine(format!(
                    "internal error (panic) in a transfer: {}",
                    panic_text(&*payload)
                )));
            }
        }
    }
    Ok(())
}

/// The calling thread's engine for one-shot transfers: (process, kind and
/// whether it follows files, queue depth, engine). A different kind or depth replaces it; so does a fork
/// (the child's thread would share the parent's ring: it is leaked, never
/// used, never torn down in the child).
pub(super) type ThreadEngine = Option<(StartedIn, (EngineKind, bool), usize, Box<dyn Engine>)>;

thread_local! {
    static THREAD_ENGINE: std::cell::RefCell<ThreadEngine> = const { std::cell::RefCell::new(None) };
}

pub(super) fn with_thread_engine<T>(
    kind: EngineKind,
    follows_files: bool,
    queue_depth: usize,
    f: impl FnOnce(&mut dyn Engine) -> T,
) -> T {
    THREAD_ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let kind_key = (kind, follows_files);
        let reusable = matches!(&*slot, Some((p, k, q, e)) if p.is_here() && *k == kind_key && *q == queue_depth && !e.is_broken());
        if !reusable {
            if let Some((p, _, _, engine)) = slot.take() {
                if !p.is_here() {
                    std::mem::forget(engine);
                }
            }
            let route = crate::engine::choice::EngineRoute { follows_files, counters: None };
            let engine = worker_engine(kind, queue_depth, Submitter::AnyThread, &route);
            *slot = Some((StartedIn::here(), kind_key, queue_depth, engine));
        }
        let (_, _, _, engine) = slot.as_mut().expect("thread engine");
        f(engine.as_mut())
    })
}
