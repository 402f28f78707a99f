//! Every item of the core crate `deepnvme` that the CLI uses, in one place.
//! The other modules import these from here and never name `deepnvme`
//! themselves, so a change to the core's public API is a change to this file.
//! Beyond the handle API, the CLI goes through one door of the core,
//! `deepnvme::diag`.

pub use deepnvme::diag::{
    default_engine, engine_for_file, errno_text, gds_environment, gds_probe, io_uring_status, memlock_limit,
    page_size, LockMode, PageAlignedBuffer, CUFILE_ENV_PATH_JSON, CUFILE_LIB_ENV, ENGINE_ENV, FILE_ENGINE_RULE,
};
pub use deepnvme::gds::GdsLibrary;
pub use deepnvme::stripe;
pub use deepnvme::{
    copy_file, dio_alignment, Direction, EngineKind, Error, FileTarget, GdsError, HandleConfig, IoHandle, LockedBuffer,
};

/// True when `e` says the memory could not be locked (RLIMIT_MEMLOCK).
pub fn is_lock_error(e: &Error) -> bool {
    matches!(e, Error::Lock { .. })
}
