//! deepnvme: the core of DeepSpeed's DeepNVMe ops (`async_io`, `gds`,
//! `pin_memory`) in Rust, with no torch and no Python.
//!
//! ```
//! use deepnvme::{FileTarget, HandleConfig, IoHandle, LockedBuffer};
//!
//! let dir = std::env::temp_dir().join(format!("deepnvme-doc-lib-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("swap.bin");
//!
//! // DeepSpeed's aio_handle(block_size=1 MiB, queue_depth=32, ..., intra_op_parallelism=2).
//! let handle = IoHandle::new(HandleConfig {
//!     block_size: 1 << 20,
//!     queue_depth: 32,
//!     intra_op_parallelism: 2,
//!     ..HandleConfig::default()
//! })?;
//!
//! // Page-locked memory goes straight to the disk (O_DIRECT, io_uring).
//! let mut buf = LockedBuffer::new(4 << 20)?;
//! buf.fill(42);
//! let pending = handle.submit_write(buf, FileTarget::Path(&path), 0)?;
//! assert_eq!(handle.wait()?, 1);
//! let mut buf = pending.take().unwrap();
//!
//! // A blocking read into any borrowed memory (it bounces when not locked).
//! let mut back = vec![0u8; 4 << 20];
//! handle.read_into(&mut back, FileTarget::Path(&path), 0)?;
//! assert!(back.iter().all(|&b| b == 42));
//! buf.fill(0);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What each module owns:
//! * [`knobs`]: every default, limit and environment variable, in one place.
//! * `buffer`: the caller's memory ([`BufferDesc`], built only through an
//!   `unsafe` constructor that states its contract), the front ends'
//!   `Staging` (their copies and their hold on the caller's memory),
//!   `HostMemcpy` (the one memcpy of contiguous host memory, which their
//!   memcpy fallbacks share), and [`IoBuffer`] for memory an async op owns.
//! * `op/caller.rs`: **the ownership rule** for caller memory, in one place:
//!   I/O goes directly only into memory that cannot move; every copy to or
//!   from movable memory runs inside the front end's hold (the GIL), on the
//!   thread that submits or waits, never on an I/O thread; ops on shared
//!   memory or file bytes take effect in submission order.
//! * `bounce`: the bounce path in one folder: buffers sized to the op and
//!   drawn from a process-wide budget (`pool`), the copies' streaming
//!   stores and helper threads (`copy`), blocking bounced ops streamed
//!   through windows (`window`) and how far reads run ahead (`read_ahead`).
//! * `pinned`: the process-wide page-locked memory manager
//!   (`deepspeed_pin_tensor_t::shared()`), constant-time range recognition
//!   (a page index), and
//!   owned [`LockedBuffer`]s.
//! * `engine`: the transfer engines (io_uring, and pread/pwrite threads), and
//!   the io_uring fixed-buffer tables (`engine/fixed.rs`).
//! * `file`: opening files as DeepSpeed does (O_DIRECT, no truncation) and
//!   their O_DIRECT alignment.
//! * [`stripe`]: stripe sets, one folder whose files keep their bytes on
//!   several drives (a manifest in the folder, member files per drive).
//! * `copy`: [`copy_file`], a copy by logical bytes, so that copies of a
//!   stripe set's files (DeepSpeed's checkpoint copies of its swap files)
//!   hold their bytes.
//! * `op`: one transfer (`cpu_op_desc_t`): `op/mod.rs` the bounce decision
//!   and lifecycle, `op/plan.rs` slice geometry, `op/checks.rs` checks and
//!   validation, `op/work.rs` the shape the handle runs and what an op touches.
//! * `handle`: [`IoHandle`] (`deepspeed_io_handle_t` / `deepspeed_gds_handle_t`):
//!   workers, queue, the order of ops on shared memory and file bytes,
//!   `wait()`, and the GDS routing of CUDA buffers.
//! * `config`: [`HandleConfig`], a handle's knobs.
//! * [`gds`]: GPUDirect Storage through cuFile, loaded at run time.
//! * `stats`: ops, bytes, bounced bytes, failures and latency, per handle
//!   ([`IoHandle::stats`]) and per process ([`process_stats`]).
//! * `deepspeed` (features `ffi`, `python`): DeepSpeed's API semantics that
//!   every front end shares (return codes, the write warning, the
//!   elapsed-time line, one-shot transfers, `deepspeed_memcpy`). The front
//!   ends are in this crate, so none of it is public; `IoHandle`'s own
//!   methods are the Rust API.
//! * [`diag`]: the one door for what the CLI asks beyond the handle API
//!   (engines, GDS probe, page-aligned memory, the variables it names).
//! * `error`: errors that name file, offset and errno.
//! * `rt`: the runtime below every domain module: `rt/sync.rs` the crate's
//!   locks (std's, with parking_lot's API), `rt/fork.rs` the `fork()`
//!   handlers that make every process-wide lock safe for a child and leave
//!   no registered memory for the kernel to copy into it, `rt/threads.rs`
//!   how the core starts its threads (and the list of them),
//!   `rt/interpreter.rs` the Python interpreter's lock without naming the
//!   front end, `rt/log.rs` stderr lines that never panic, `rt/json.rs` the
//!   JSON escaper for the cuFile config.
//! * `resize_hold`: how many direct ops hold each torch-pinned tensor's
//!   storage unresizable (the compiled front end's guard against `resize_`
//!   freeing memory under the I/O).
//! * `ffi` (feature `ffi`): the one cxx bridge to the C++ shims in `cpp/`:
//!   conversion and error mapping only.
//! * `python` (feature `python`): the pyo3 module `deepnvme._native`.

mod bounce;
mod buffer;
mod config;
mod copy;
// The front ends' shared layer: a build without a front end (no `ffi`, no
// `python`) calls none of it, and that is no defect.
#[cfg_attr(not(any(feature = "ffi", feature = "python")), allow(dead_code))]
mod deepspeed;
mod engine;
mod error;
mod file;
mod handle;
mod op;
mod pinned;
mod resize_hold;
mod rt;
mod stats;

pub mod diag;
pub mod gds;
pub mod knobs;
pub mod stripe;

#[cfg(feature = "ffi")]
mod ffi;
#[cfg(feature = "python")]
mod python;

/// The fork handler's hooks, in its order (see `rt/fork.rs`): wired here, where
/// every module is named, so that `rt/fork.rs` names none of their owners.
pub(crate) static FORK_PARTICIPANTS: rt::fork::Participants = rt::fork::Participants {
    settle: &[knobs::settle_for_fork, engine::settle_for_fork],
    hold: &[
        engine::fixed::empty_tables_for_fork,
        engine::fixed::hold_lists_for_fork,
        pinned::hold_for_fork,
        bounce::hold_for_fork,
        rt::log::hold_for_fork,
    ],
};

pub use buffer::{BufferDesc, IoBuffer, Location};
pub use config::HandleConfig;
pub use copy::copy_file;
pub use engine::EngineKind;
pub use error::{Direction, Error, Result, TransferError};
pub use file::{dio_alignment, DioAlignment, FileTarget};
pub use gds::error::GdsError;
pub use handle::{IoHandle, OpScope, Pending};
pub use pinned::{LockedBuffer, PinnedMemoryManager};
pub use stats::{process as process_stats, Stats};

#[cfg(test)]
mod internal_tests;
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod test_support;
