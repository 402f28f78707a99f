//! Transfer engines: they move a list of contiguous (fd, file offset, memory,
//! length) segments in `block_size` pieces with at most `queue_depth` in
//! flight, check every completion, resubmit the rest of a short transfer,
//! retry EINTR/EAGAIN (EAGAIN with backoff; both bounded, see
//! [`knobs::MAX_EAGAIN_RETRIES`] and [`knobs::MAX_EINTR_RETRIES`]), and turn any other failure into a [`TransferError`]
//! that carries the errno, offset and length.
//!
//! Two engines pass the same tests:
//! * [`uring`]: io_uring (the default where the kernel allows it);
//! * [`psync`]: pread/pwrite on threads, for kernels or sandboxes where
//!   io_uring is blocked (Docker's default seccomp answers EPERM, ENOSYS on
//!   old kernels, `kernel.io_uring_disabled`).
//!
//! The choice is made once per process ([`default_kind`]) and logged once;
//! `DEEPNVME_ENGINE=uring|psync` forces it. Files on tmpfs and ramfs run on
//! psync unless an engine was chosen explicitly ([`choice`]).

pub mod choice;
mod contract;
pub(crate) mod fixed;
mod filesystem;
#[cfg(test)]
pub(crate) mod fault;
mod piece;
pub mod psync;
pub mod uring;

use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::knobs::{self, EngineChoice};

pub use contract::{AioParams, Engine, EngineKind, Submitter};
pub(crate) use contract::{StreamRun, StreamSource};
pub use piece::Segment;
#[cfg(test)]
pub(crate) use piece::Piece;

/// Creates an engine able to keep `queue_depth` requests in flight.
#[cfg_attr(not(test), allow(dead_code))] // the handle uses `create_for`; the engine tests this
pub fn create(kind: EngineKind, queue_depth: usize) -> Result<Box<dyn Engine>> {
    create_for(kind, queue_depth, Submitter::AnyThread)
}

/// As [`create`], for engines only one thread submits to.
pub(crate) fn create_for(kind: EngineKind, queue_depth: usize, submitter: Submitter) -> Result<Box<dyn Engine>> {
    match kind {
        EngineKind::Uring => Ok(Box::new(uring::UringEngine::with_submitter(queue_depth, submitter)?)),
        EngineKind::Psync => Ok(Box::new(psync::PsyncEngine::new(queue_depth))),
    }
}

/// The fork handler's hook (`rt/fork.rs`): the probe and the choice are
/// `OnceLock`s, which a fork must not find half set.
pub(crate) fn settle_for_fork(_: std::time::Instant) -> crate::rt::fork::Held {
    let _ = io_uring_status();
    let _ = default_kind();
    None
}

/// Whether io_uring works here: `Err` carries the reason (with errno).
pub fn io_uring_status() -> std::result::Result<(), String> {
    static STATUS: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATUS.get_or_init(uring::probe).clone()
}

/// The engine this process uses unless a handle asks for another:
/// `DEEPNVME_ENGINE` when set, else io_uring when it works, else psync.
/// The choice is logged once, on stderr, when it is not io_uring.
pub fn default_kind() -> Result<EngineKind> {
    static CHOICE: OnceLock<std::result::Result<EngineKind, String>> = OnceLock::new();
    CHOICE
        .get_or_init(|| match &knobs::settings().engine {
            Ok(EngineChoice::Uring) => match io_uring_status() {
                Ok(()) => Ok(EngineKind::Uring),
                Err(why) => Err(format!("{}=uring but io_uring is unavailable: {why}", knobs::ENGINE_ENV)),
            },
            Ok(EngineChoice::Psync) => {
                crate::rt::log::info_once("engine", &format!("using the psync engine ({}=psync)", knobs::ENGINE_ENV));
                Ok(EngineKind::Psync)
            }
            Err(v) => Err(format!("{}={v:?} is not one of uring, psync", knobs::ENGINE_ENV)),
            Ok(EngineChoice::Auto) => match io_uring_status() {
                Ok(()) => Ok(EngineKind::Uring),
                Err(why) => {
                    crate::rt::log::info_once(
                        "engine",
                        &format!("io_uring is unavailable ({why}); using the psync (pread/pwrite threads) engine"),
                    );
                    Ok(EngineKind::Psync)
                }
            },
        })
        .clone()
        .map_err(Error::Engine)
}
