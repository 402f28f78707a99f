//! What the CLI (`crates/deepnvme-cli`: `doctor`, `info`, `bench`) asks of
//! the core beyond the handle API: the environment variables it names in
//! its advice, page-locked and page-aligned memory for its benchmarks, how
//! the process would move bytes (io_uring or psync, per file), whether GDS
//! works here, and errno's text. One door, so that the core's internals stay
//! `pub(crate)` and a change the CLI sees is a change to this file.

use crate::engine::EngineKind;
use crate::error::Result;
use crate::gds::GdsError;

pub use crate::error::errno_text;
pub use crate::pinned::{memlock_limit, page_size, LockMode, PageAlignedBuffer};

/// The variable that forces a transfer engine (`uring` or `psync`).
pub const ENGINE_ENV: &str = crate::knobs::ENGINE_ENV;
/// The variable that names the libcufile to load.
pub const CUFILE_LIB_ENV: &str = crate::knobs::CUFILE_LIB_ENV;
/// cuFile's own variable for its config file (set by the driver's first user).
pub const CUFILE_ENV_PATH_JSON: &str = crate::knobs::CUFILE_ENV_PATH_JSON;
/// The engine-per-file rule, in one line.
pub const FILE_ENGINE_RULE: &str = crate::engine::choice::FILE_ENGINE_RULE;

/// Whether `DEEPNVME_LOG` silences informational lines (as the core reads it).
pub fn log_quiet() -> bool {
    crate::knobs::settings().quiet
}

/// Whether io_uring works in this process, and why not when it does not.
pub fn io_uring_status() -> std::result::Result<(), String> {
    crate::engine::io_uring_status()
}

/// The engine a handle gets when none is asked for ([`ENGINE_ENV`], else
/// io_uring when it works, else psync).
pub fn default_engine() -> Result<EngineKind> {
    crate::engine::default_kind()
}

/// The engine a default handle moves the bytes of the file open on `fd`
/// with, and the name of the file system that decided it when that is not
/// the process's engine (see [`FILE_ENGINE_RULE`]).
pub fn engine_for_file(fd: i32) -> Result<(EngineKind, Option<&'static str>)> {
    crate::engine::choice::engine_for_file(None, fd).map(|(kind, fs)| (kind, fs.map(|f| f.name())))
}

/// What GPUDirect Storage would use here (libraries, versions, devices), or
/// what is missing; does not open the cuFile driver.
pub fn gds_environment() -> std::result::Result<String, GdsError> {
    crate::gds::environment_summary()
}

/// Whether GPUDirect Storage works here, the cuFile driver opened included
/// (once per process; later calls return the first answer).
pub fn gds_probe() -> std::result::Result<(), GdsError> {
    crate::gds::probe()
}
