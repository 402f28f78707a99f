//! Every item of the core crate `deepnvme` that the CLI uses, in one place.
//! The other modules import these from here and never name `deepnvme`
//! themselves, so a change to the core's public API is a change to this file.

pub use deepnvme::gds::{GdsError, GdsLibrary, CUFILE_ENV_PATH_JSON, CUFILE_LIB_ENV};
pub use deepnvme::knobs::ENGINE_ENV;
pub use deepnvme::stripe;
pub use deepnvme::{dio_alignment, errno_text};
pub use deepnvme::pinned::{memlock_limit, page_size, LockMode, LockedBuffer, PageAlignedBuffer};
pub use deepnvme::{
    Direction, EngineKind, Error, FileTarget, HandleConfig, IoHandle,
};

/// Whether io_uring works in this process, and why not when it does not.
pub fn io_uring_status() -> Result<(), String> {
    deepnvme::io_uring_status()
}

/// The engine a handle gets when none is asked for (`DEEPNVME_ENGINE`, else
/// io_uring when it works, else psync).
pub fn default_engine() -> Result<EngineKind, Error> {
    deepnvme::default_engine()
}

/// The engine a default handle moves bytes of the file open on `fd` with,
/// and the file system that decided it when that is not the handle's engine.
pub fn engine_for_file(fd: i32) -> Result<(EngineKind, Option<&'static str>), Error> {
    deepnvme::engine_for_file(None, fd).map(|(k, fs)| (k, fs.map(|f| f.name())))
}

/// The engine-per-file rule, in one line.
pub const FILE_ENGINE_RULE: &str = deepnvme::FILE_ENGINE_RULE;

/// True when `e` says the memory could not be locked (RLIMIT_MEMLOCK).
pub fn is_lock_error(e: &Error) -> bool {
    matches!(e, Error::Lock { .. })
}

/// What GPUDirect Storage would use here (libraries, versions, devices), or
/// what is missing; does not open the cuFile driver.
pub fn gds_environment() -> Result<String, GdsError> {
    deepnvme::gds::environment_summary()
}

/// Whether GPUDirect Storage works here, the cuFile driver opened included.
pub fn gds_probe() -> Result<(), GdsError> {
    deepnvme::gds::probe()
}
