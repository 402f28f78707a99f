//! The pyo3 front end: the Python module `deepnvme._native`.
//!
//! The module lives in the torch-free shared object that holds the Rust core
//! (the torch glue, `libdeepnvme_torch.so`, links against it when the
//! compiled modules are built), so what it reports (engine, pinned regions,
//! statistics) is the state that the DeepSpeed extensions built against this
//! core share. It is also how the core reaches Python for DeepSpeed's
//! one-time write warning.
//!
//! It is also a complete front end of its own, with DeepSpeed's Python API
//! (`deepnvme.frontend` re-exports it for DeepSpeed's op builders), one file
//! per concept:
//! * `handle`: `aio_handle` and `gds_handle`;
//! * `functions`: `aio_read`, `aio_write`, `deepspeed_memcpy`;
//! * `pinned`: `pin_handle`, `new_cpu_locked_tensor` and the locked memory
//!   the returned tensor owns;
//! * `buffer`: torch tensors, numpy arrays and buffer-protocol objects as
//!   the core's `TensorDesc` and `Staging`.
//!
//! Every entry point calls [`crate::deepspeed`], where DeepSpeed's semantics
//! live, and runs what can block detached from the interpreter.

mod buffer;
mod functions;
mod handle;
mod pinned;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::engine;
use crate::pinned::{memlock_limit, PinnedMemoryManager};

/// Attribute on `deepspeed.utils` that marks the write warning as given,
/// shared with DeepSpeed's own extensions.
const WRITE_WARNING_MARKER: &str = "_deepspeed_nvme_write_warning_emitted";

extern "C" {
    // In every CPython 3; pyo3 leaves it out of its abi3 declarations.
    fn PyGILState_Check() -> std::os::raw::c_int;
}

/// Whether this thread holds the GIL: it has an attached thread state, of
/// whichever interpreter. `PyThreadState_GetUnchecked` (3.13+) or
/// `_PyThreadState_UncheckedGet` (3.5-3.12) answer that, and stay right once
/// a sub-interpreter exists, where `PyGILState_Check` only knows the main
/// interpreter's threads. They are not in the abi3 set, so they are looked
/// up at run time; `PyGILState_Check` is the fallback.
fn this_thread_holds_gil() -> bool {
    type GetUnchecked = unsafe extern "C" fn() -> *mut pyo3::ffi::PyThreadState;
    static GET_UNCHECKED: std::sync::OnceLock<Option<GetUnchecked>> = std::sync::OnceLock::new();
    let get = GET_UNCHECKED.get_or_init(|| {
        [c"PyThreadState_GetUnchecked", c"_PyThreadState_UncheckedGet"].iter().find_map(|name| {
            // SAFETY: dlsym with a NUL-terminated name; a symbol found under
            // either name is CPython's function of this signature.
            let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!sym.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, GetUnchecked>(sym) })
        })
    });
    // SAFETY: all three are callable from any thread once Python is initialised.
    unsafe {
        if pyo3::ffi::Py_IsInitialized() == 0 {
            return false;
        }
        match get {
            Some(current) => !current().is_null(),
            None => PyGILState_Check() == 1,
        }
    }
}

/// Runs `f` with the GIL released when this thread holds it, and takes it
/// back afterwards (also if `f` panics). DeepSpeed's bindings keep the GIL
/// for several blocking calls (every gds_handle method, async submits, the
/// handle's destructor); holding it while waiting for I/O would stall every
/// Python thread, and could deadlock with a thread that needs the GIL to
/// release a tensor while it holds the handle's lock.
///
/// Released through pyo3 (`Python::detach`), never with a bare
/// `PyEval_SaveThread`: pyo3 keeps a per-thread count of attachments, and
/// with a stale count, code inside `f` that drops a Python object (an op's
/// hold on its tensor) or calls `Python::try_attach` (a bounce copy, the
/// swap check, the signal check) would touch Python without the GIL -- a
/// refcount race that corrupted the heap under the pyo3 front end.
pub fn without_gil<T>(f: impl FnOnce() -> T) -> T {
    /// `f` and its result cross no thread: `detach` runs it on this one. It
    /// uses no Python object without attaching first (pyo3 then sees the
    /// thread as detached and attaches properly).
    struct OnThisThread<X>(X);
    // SAFETY: see above; the value never leaves the calling thread.
    unsafe impl<X> Send for OnThisThread<X> {}
    impl<F> OnThisThread<F> {
        fn call<T>(self) -> T
        where
            F: FnOnce() -> T,
        {
            (self.0)()
        }
    }

    if !this_thread_holds_gil() {
        return f();
    }
    let mut f = Some(f);
    // Attaching is re-entrant here (this thread holds the GIL, perhaps
    // through pybind11, which pyo3 does not count); detach then releases it
    // and brings it back, also if `f` panics.
    let released = Python::try_attach(|py| {
        let call = OnThisThread(f.take().expect("taken once"));
        py.detach(move || OnThisThread(call.call())).0
    });
    match released {
        Some(result) => result,
        // The interpreter is finalizing: run it as we are.
        None => (f.take().expect("not taken: try_attach did not run the closure"))(),
    }
}

/// `PyErr_CheckSignals` with the GIL: the exception a signal handler raised
/// (KeyboardInterrupt) is left set, for pyo3 (`PyErr::take`) or pybind11
/// (`error_already_set`) to raise, and reported as [`Error::Interrupted`].
pub fn check_signals() -> crate::error::Result<()> {
    Python::try_attach(|py| match py.check_signals() {
        Ok(()) => Ok(()),
        Err(err) => {
            let text = err.to_string();
            err.restore(py);
            Err(crate::error::Error::Interrupted(text))
        }
    })
    .unwrap_or(Ok(()))
}

/// Logs `message` through `deepspeed.utils.logger.warning` unless another
/// extension already did. Returns false when Python or DeepSpeed is not
/// there to take it (the caller then prints it itself).
pub fn emit_write_warning(message: &str) -> bool {
    Python::try_attach(|py| {
        let attempt = || -> PyResult<()> {
            let utils = py.import("deepspeed.utils")?;
            if utils.hasattr(WRITE_WARNING_MARKER)? {
                return Ok(());
            }
            utils.setattr(WRITE_WARNING_MARKER, true)?;
            utils.getattr("logger")?.call_method1("warning", (message,))?;
            Ok(())
        };
        attempt().is_ok()
    })
    .unwrap_or(false)
}

/// The engine this process uses ("io_uring" or "psync").
#[pyfunction]
fn engine_name() -> PyResult<&'static str> {
    engine::default_kind().map(|k| k.name()).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// None when io_uring works here, else why not.
#[pyfunction]
fn io_uring_unavailable_reason() -> Option<String> {
    engine::io_uring_status().err()
}

/// (regions, bytes requested, bytes locked) of the process-wide manager.
#[pyfunction]
fn pinned_stats() -> (usize, usize, usize) {
    PinnedMemoryManager::shared().stats()
}

/// RLIMIT_MEMLOCK (soft, hard) in bytes.
#[pyfunction]
fn memlock_rlimit() -> (u64, u64) {
    memlock_limit()
}

/// None when GPUDirect Storage can be used here, else what is missing
/// (libcufile, libcuda / the NVIDIA driver, a CUDA device, or why the cuFile
/// driver would not open). The first call may open the driver: the GIL is
/// released meanwhile.
#[pyfunction]
fn gds_unavailable_reason(py: Python<'_>) -> Option<String> {
    py.detach(crate::gds::probe).err().map(|e| e.to_string())
}

/// Libraries, versions and devices GPUDirect Storage would use, or why not.
#[pyfunction]
fn gds_environment(py: Python<'_>) -> PyResult<String> {
    py.detach(crate::gds::environment_summary).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The process's I/O statistics (every handle, every front end): a dict of
/// ops, failed_ops, bytes_read, bytes_written, bounced_bytes, io_time_s,
/// wait_time_s, p50_us and p99_us (None before the first op).
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let s = crate::stats::process();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("ops", s.ops)?;
    d.set_item("failed_ops", s.failed_ops)?;
    d.set_item("bytes_read", s.bytes_read)?;
    d.set_item("bytes_written", s.bytes_written)?;
    d.set_item("bounced_bytes", s.bounced_bytes)?;
    d.set_item("io_time_s", s.io_time.as_secs_f64())?;
    d.set_item("wait_time_s", s.wait_time.as_secs_f64())?;
    d.set_item("p50_us", s.p50.map(|v| v.as_micros() as u64))?;
    d.set_item("p99_us", s.p99.map(|v| v.as_micros() as u64))?;
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(engine_name, m)?)?;
    m.add_function(wrap_pyfunction!(io_uring_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memlock_rlimit, m)?)?;
    m.add_function(wrap_pyfunction!(gds_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(gds_environment, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    // The front end (DeepSpeed's Python API).
    m.add_class::<handle::AioHandle>()?;
    m.add_class::<handle::GdsHandle>()?;
    m.add_class::<pinned::PinHandle>()?;
    m.add_class::<pinned::LockedMemory>()?;
    m.add_function(wrap_pyfunction!(functions::aio_read, m)?)?;
    m.add_function(wrap_pyfunction!(functions::aio_write, m)?)?;
    m.add_function(wrap_pyfunction!(functions::deepspeed_memcpy, m)?)?;
    Ok(())
}
