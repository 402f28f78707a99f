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

/// The engine this process uses ("io_uring" or "psync").
/// The sequence number the handle gave the op this thread had admitted
/// last: the order the Python model test applies ops in (not API).
#[pyfunction]
fn _last_admitted_seq() -> u64 {
    crate::handle::LAST_ADMITTED.with(|last| last.get())
}

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
/// wait_time_s, p50_us and p99_us (None before the first op), io_uring_runs and
/// psync_runs (which engine moved the bytes).
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
    d.set_item("io_uring_runs", s.io_uring_runs)?;
    d.set_item("psync_runs", s.psync_runs)?;
    Ok(d)
}

/// `deepnvme.copy2`'s core: copies `src` to `dst` by logical bytes when
/// `src` is a stripe set's placeholder, or `dst` is one, or `into_a_set`
/// and `dst` lies in a set (`deepnvme::copy_file`), and returns the bytes
/// copied; None when none of these holds (any copy will do). The GIL is
/// released while the bytes move.
#[pyfunction]
#[pyo3(signature = (src, dst, into_a_set=false))]
fn copy_striped(
    py: Python<'_>,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
    into_a_set: bool,
) -> PyResult<Option<u64>> {
    let copied = py.detach(|| {
        if crate::copy::copy_needs_logical_bytes(&src, &dst, into_a_set)? {
            crate::copy::copy_file(&src, &dst).map(Some)
        } else {
            Ok(None)
        }
    });
    copied.map_err(|e| {
        // An OSError, as shutil's copies raise (copytree gathers them into
        // shutil.Error), with the errno where there is one.
        let errno = match &e {
            crate::error::Error::Interrupted(_) => return buffer::py_err(e),
            crate::error::Error::File { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            crate::error::Error::Transfer(t) => t.errno,
            crate::error::Error::InvalidArgument(_) => libc::EINVAL,
            _ => libc::EIO,
        };
        pyo3::exceptions::PyOSError::new_err((errno, e.to_string()))
    })
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
    m.add_function(wrap_pyfunction!(_last_admitted_seq, m)?)?;
    m.add_function(wrap_pyfunction!(crate::rt::log_queue::flush_log, m)?)?;
    m.add_function(wrap_pyfunction!(copy_striped, m)?)?;
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
