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
pub(crate) mod fixed;
#[cfg(test)]
pub(crate) mod fault;
pub mod psync;
pub mod uring;

use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};

use crate::error::{Direction, Error, Result, TransferError};
use crate::knobs::{self, EngineChoice};

/// One contiguous range to move. The memory must stay valid, and must not be
/// touched by anyone else, until the engine's `run` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub fd: RawFd,
    pub file_offset: u64,
    pub addr: *mut u8,
    pub len: usize,
}

// SAFETY: a Segment is a description; the op that owns the memory keeps it
// alive and unaliased while engines on other threads move its bytes.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

/// How to move the bytes (the handle's knobs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    pub block_size: usize,
    pub queue_depth: usize,
    pub single_submit: bool,
    pub overlap_events: bool,
}

/// A piece of a segment still to be moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub fd: RawFd,
    pub file_offset: u64,
    pub addr: *mut u8,
    pub len: usize,
    /// Bytes of this piece already moved (by short transfers).
    pub done: usize,
    /// EAGAIN answers in a row (since the last progress).
    pub eagain: u32,
    /// EINTR answers in a row (since the last progress).
    pub eintr: u32,
}

/// The pause before resubmitting after the `n`-th EAGAIN in a row: doubling
/// from 4 µs, capped at 4 ms (64 retries wait about 0.2 s in all).
fn eagain_backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_micros(4u64 << n.saturating_sub(1).min(10))
}

// SAFETY: as for Segment: the owning op keeps the memory alive and unaliased.
unsafe impl Send for Piece {}
unsafe impl Sync for Piece {}

impl Piece {
    /// The piece of `segment` that starts `offset` bytes into it: at most
    /// `block` bytes (`offset` < the segment's length).
    fn of(segment: &Segment, offset: usize, block: usize) -> Piece {
        debug_assert!(offset < segment.len);
        Piece {
            fd: segment.fd,
            file_offset: segment.file_offset + offset as u64,
            // SAFETY: offset < segment.len, inside the segment.
            addr: unsafe { segment.addr.add(offset) },
            len: block.min(segment.len - offset),
            done: 0,
            eagain: 0,
            eintr: 0,
        }
    }

    pub fn remaining(&self) -> usize {
        self.len - self.done
    }
    pub fn cur_offset(&self) -> u64 {
        self.file_offset + self.done as u64
    }
    pub fn cur_addr(&self) -> *mut u8 {
        // SAFETY: done <= len, so this stays inside the segment.
        unsafe { self.addr.add(self.done) }
    }
    pub fn error(&self, direction: Direction, errno: i32, detail: Option<String>) -> TransferError {
        TransferError {
            direction,
            path: None,
            fd: self.fd,
            file_offset: self.cur_offset(),
            len: self.remaining(),
            errno,
            detail,
        }
    }

    /// Applies one completion result (`res` as the kernel returns it: bytes
    /// moved, or a negative errno). Returns `Ok(true)` when the piece is done,
    /// `Ok(false)` when the remainder must be submitted again.
    pub fn complete(&mut self, direction: Direction, res: i64) -> std::result::Result<bool, TransferError> {
        if res < 0 {
            let errno = (-res) as i32;
            if errno == libc::EAGAIN {
                // The device or file system asks to try again later: back
                // off, and give up (naming EAGAIN) if it never gets better.
                if self.eagain >= knobs::MAX_EAGAIN_RETRIES {
                    let detail = format!("still EAGAIN after {} retries with backoff", self.eagain);
                    return Err(self.error(direction, errno, Some(detail)));
                }
                self.eagain += 1;
                std::thread::sleep(eagain_backoff(self.eagain));
                return Ok(false);
            }
            if errno == libc::EINTR {
                // A signal interrupted the transfer: resubmit at once. Only a
                // signal storm with no byte moved in between could repeat
                // this, so the bound is high and stops a livelock only.
                if self.eintr >= knobs::MAX_EINTR_RETRIES {
                    let detail = format!("interrupted {} times in a row without progress", self.eintr);
                    return Err(self.error(direction, errno, Some(detail)));
                }
                self.eintr += 1;
                return Ok(false);
            }
            return Err(self.error(direction, errno, None));
        }
        if res == 0 {
            let (errno, what) = match direction {
                Direction::Read => (libc::ENODATA, "unexpected end of file"),
                Direction::Write => (libc::EIO, "the device accepted no bytes"),
            };
            let detail = format!("{what} after {} of {} bytes of this block", self.done, self.len);
            return Err(self.error(direction, errno, Some(detail)));
        }
        let res = res as usize;
        if res > self.remaining() {
            return Err(self.error(direction, libc::EIO, Some(format!("kernel reported {res} bytes, more than asked"))));
        }
        self.done += res;
        self.eagain = 0;
        self.eintr = 0;
        Ok(self.done == self.len)
    }
}

/// Cuts segments into block-sized pieces, in order.
pub(crate) fn pieces(segments: &[Segment], block_size: usize) -> impl Iterator<Item = Piece> + '_ {
    let block = block_size.max(1);
    segments.iter().flat_map(move |s| {
        let n = s.len.div_ceil(block);
        (0..n).map(move |i| Piece::of(s, i * block, block))
    })
}

/// Which engine a handle uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    Uring,
    Psync,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Uring => "io_uring",
            EngineKind::Psync => "psync",
        }
    }
    /// `uring`/`io_uring` or `psync`, as [`knobs::ENGINE_ENV`] takes them.
    pub fn parse(s: &str) -> Option<EngineKind> {
        match knobs::parse_engine(s)? {
            EngineChoice::Uring => Some(EngineKind::Uring),
            EngineChoice::Psync => Some(EngineKind::Psync),
            EngineChoice::Auto => None,
        }
    }
}

/// Moves bytes. One engine belongs to one thread at a time.
pub trait Engine: Send {
    #[cfg_attr(not(test), allow(dead_code))] // the engine tests check which one they got
    fn kind(&self) -> EngineKind;
    /// Moves every segment; returns only when nothing is in flight.
    #[cfg_attr(not(test), allow(dead_code))] // the core runs `run_with`; the engine tests `run`
    fn run(&mut self, direction: Direction, segments: &[Segment], knobs: &Knobs) -> std::result::Result<(), TransferError> {
        self.run_with(direction, segments, knobs, None)
    }
    /// As `run`; `memory`: the registrable memory every segment lies in,
    /// if any (see `fixed.rs`). Engines touch only the segments' memory:
    /// copies to and from the caller's memory are the op's (`op/mod.rs`).
    fn run_with(
        &mut self,
        direction: Direction,
        segments: &[Segment],
        knobs: &Knobs,
        memory: Option<&Arc<fixed::RegistrableMemory>>,
    ) -> std::result::Result<(), TransferError>;
    /// Runs what `source` gives, one run after another: each run's outcome
    /// goes to `source.run_done` as soon as it is known. An engine that can
    /// keep several runs in flight at once (io_uring) starts the next run's
    /// requests in the slots the last one frees instead of draining first.
    fn run_stream(&mut self, source: &mut dyn StreamSource) {
        let mut n = 0;
        while let Some(run) = source.next_run() {
            let outcome = self.run_with(run.direction, &run.segments, &run.knobs, run.memory.as_ref());
            source.run_done(n, outcome);
            n += 1;
        }
    }
    /// Whether `run_stream` overlaps runs (else the worker need not use it).
    fn streams_runs(&self) -> bool {
        false
    }
    /// Between runs: lets go of registered memory that was freed.
    fn release_retired(&mut self) {}
    /// After a panic unwound out of `run_with`: returns only once nothing
    /// the engine handed to the kernel or to its threads is still moving
    /// bytes, so that the op's buffers may be freed. The engine is not used
    /// again afterwards.
    fn quiesce(&mut self) {}
    /// True once the engine cannot be trusted with another run (its ring
    /// failed); the owner replaces it.
    fn is_broken(&self) -> bool {
        false
    }
    /// The engine for files on a file system io_uring punts for, when not
    /// this one (see the `choice` module).
    fn for_punting_files(&mut self) -> Option<&mut dyn Engine> {
        None
    }
}

/// One op's slice as a worker ring streams it (see [`Engine::run_stream`]):
/// direct segments only, no copy between blocks, DeepSpeed's overlap mode
/// (`overlap_events` on, `single_submit` off).
pub(crate) struct StreamRun {
    pub direction: Direction,
    pub segments: Vec<Segment>,
    pub knobs: Knobs,
    pub memory: Option<Arc<fixed::RegistrableMemory>>,
}

/// What feeds [`Engine::run_stream`]: a worker's queue of slices.
pub(crate) trait StreamSource {
    /// The next run to start, asked whenever the ring has a free slot and
    /// no started run has requests left to send. `None`: nothing now (asked
    /// again after the next completions; the stream ends when it says
    /// `None` with nothing of it left in flight).
    fn next_run(&mut self) -> Option<StreamRun>;
    /// Run number `n` (counting from 0 in the order `next_run` gave them)
    /// has completed: every request done, or its first error once nothing
    /// of it is in flight.
    fn run_done(&mut self, n: usize, outcome: std::result::Result<(), TransferError>);
}

/// The pieces of a run, cut as they are sent.
pub(crate) struct PieceCursor {
    segments: Vec<Segment>,
    block: usize,
    segment: usize,
    offset: usize,
}

impl PieceCursor {
    pub fn new(segments: Vec<Segment>, block_size: usize) -> Self {
        PieceCursor { segments, block: block_size.max(1), segment: 0, offset: 0 }
    }
    pub fn has_more(&self) -> bool {
        let sent = |i: usize| if i == self.segment { self.offset } else { 0 };
        self.segments.iter().enumerate().skip(self.segment).any(|(i, s)| s.len > sent(i))
    }
    /// Every segment of the run (for naming it in an error).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
}

impl Iterator for PieceCursor {
    type Item = Piece;
    fn next(&mut self) -> Option<Piece> {
        while let Some(s) = self.segments.get(self.segment) {
            if self.offset >= s.len {
                self.segment += 1;
                self.offset = 0;
                continue;
            }
            let piece = Piece::of(s, self.offset, self.block);
            self.offset += piece.len;
            return Some(piece);
        }
        None
    }
}

/// Which threads submit to an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitter {
    /// Only the thread that creates the engine (a handle's worker): its
    /// io_uring ring is set up `COOP_TASKRUN` (and `SINGLE_ISSUER` without
    /// fixed buffers) where the kernel has them, which saves the kernel
    /// interrupts (and locking), and registers fixed buffers.
    OneThread,
    /// Any thread, one at a time (the engine of a handle's blocking
    /// `read`/`write`, which run on the caller's thread).
    AnyThread,
}

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
                crate::log::info_once("engine", &format!("using the psync engine ({}=psync)", knobs::ENGINE_ENV));
                Ok(EngineKind::Psync)
            }
            Err(v) => Err(format!("{}={v:?} is not one of uring, psync", knobs::ENGINE_ENV)),
            Ok(EngineChoice::Auto) => match io_uring_status() {
                Ok(()) => Ok(EngineKind::Uring),
                Err(why) => {
                    crate::log::info_once(
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

/// Moves `len` bytes at `file_offset` synchronously with plain
/// pread/pwrite, retrying EINTR/EAGAIN and short transfers. Used for the
/// small unaligned edges and by the psync engine.
pub(crate) fn move_piece_blocking(direction: Direction, piece: &mut Piece) -> std::result::Result<(), TransferError> {
    while piece.remaining() > 0 {
        // SAFETY: the piece describes memory its owner keeps valid.
        let res = unsafe {
            match direction {
                Direction::Read => libc::pread(
                    piece.fd,
                    piece.cur_addr() as *mut libc::c_void,
                    piece.remaining(),
                    piece.cur_offset() as libc::off_t,
                ),
                Direction::Write => libc::pwrite(
                    piece.fd,
                    piece.cur_addr() as *const libc::c_void,
                    piece.remaining(),
                    piece.cur_offset() as libc::off_t,
                ),
            }
        };
        let res = if res < 0 { -(crate::error::last_errno() as i64) } else { res as i64 };
        piece.complete(direction, res)?;
    }
    Ok(())
}
