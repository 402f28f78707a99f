//! deepnvme: the core of DeepSpeed's DeepNVMe ops (`async_io`, `gds`,
//! `pin_memory`) in Rust.
//!
//! What each module owns:
//! * [`pinned`]: the process-wide page-locked memory manager
//!   (`deepspeed_pin_tensor_t::shared()`), with O(log n) range recognition.
//! * [`engine`]: the transfer engines (io_uring, and a pread/pwrite thread
//!   fallback) that move block-sized pieces with a bounded queue depth.
//! * [`file`]: opening files as DeepSpeed does (O_DIRECT, no truncation),
//!   and learning their O_DIRECT alignment.
//! * [`op`]: one transfer (`cpu_op_desc_t`): bounce decision, slicing, the
//!   O_DIRECT edge split, validation and finishing.
//! * [`handle`]: the handle (`deepspeed_io_handle_t`) and its workers.
//! * [`config`]: the handle's knobs.
//! * [`gds`]: GPUDirect Storage through cuFile, loaded at run time by cudarc.
//! * [`error`], [`log`]: errors that name file, offset and errno; stderr lines.
//! * [`json`]: the JSON string escaper for the cuFile config and the CLI.
//! * `ffi` (feature `ffi`): the one cxx bridge to the C++ shims in `cpp/`.
//! * `python` (feature `python`): the pyo3 front end `deepnvme._native`.
//!
//! Nothing here needs torch or Python; the torch glue lives in `cpp/`.

pub mod config;
pub mod engine;
pub mod error;
pub mod file;
pub mod gds;
pub mod handle;
pub mod json;
pub mod log;
pub mod op;
pub mod pinned;

#[cfg(feature = "ffi")]
pub mod ffi;
#[cfg(feature = "python")]
pub mod python;

pub use config::HandleConfig;
pub use engine::{EngineKind, Knobs};
pub use error::{Direction, Error, Result, TransferError};
pub use file::FileTarget;
pub use handle::IoHandle;
pub use op::{BufferDesc, OpRequest, Staging};
pub use pinned::PinnedMemoryManager;
