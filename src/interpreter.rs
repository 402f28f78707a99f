//! The Python interpreter, as the core needs it without knowing the front
//! end: holding its lock (the GIL) while the core touches memory that
//! Python code could otherwise free or move. Without the `python` feature
//! there is no interpreter and these run their closure as it is.

use crate::error::{Error, Result};

/// Runs `f` holding the GIL (taken on this thread if it does not hold it
/// already, from any thread). Fails when the interpreter is finalizing:
/// then nothing is run.
#[cfg_attr(not(any(feature = "python", feature = "ffi")), allow(dead_code))] // used by the front ends' Staging
pub(crate) fn with_interpreter_lock<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    #[cfg(feature = "python")]
    {
        pyo3::Python::try_attach(|_py| f())
            .unwrap_or_else(|| Err(Error::Copy("the Python interpreter is shutting down".into())))
    }
    #[cfg(not(feature = "python"))]
    {
        let _ = Error::Copy; // (the error is only made with an interpreter)
        f()
    }
}
