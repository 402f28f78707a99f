//! py_ds_aio.cpp's module functions: `aio_read`, `aio_write` and
//! `deepspeed_memcpy` (positional arguments, as pybind11 declares them
//! without names), implemented by [`crate::deepspeed`].

use pyo3::prelude::*;

use super::buffer::{describe, path_arg, py_err};
use crate::deepspeed::{self, Request, Target};
use crate::error::Direction;

#[allow(clippy::too_many_arguments)]
fn one_shot(
    py: Python<'_>,
    read: bool,
    buffer: &Bound<'_, PyAny>,
    filename: &Bound<'_, PyAny>,
    block_size: i64,
    queue_depth: i64,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> PyResult<i32> {
    let what = if read { "aio_read" } else { "aio_write" };
    let path = path_arg(filename, what)?;
    let d = describe(py, buffer, read, what)?.for_op();
    let request = Request {
        direction: if read { Direction::Read } else { Direction::Write },
        target: Target::Path(&path),
        file_offset: 0,
        tensor: d.tensor,
        staging: Some(Box::new(d.staging)),
        validate,
    };
    py.detach(move || deepspeed::one_shot(request, block_size, queue_depth, single_submit, overlap_events))
        .map_err(py_err)
}

/// DeepSpeed Asynchronous I/O Read
#[pyfunction]
#[pyo3(signature = (buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, /))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn aio_read(
    py: Python<'_>,
    buffer: &Bound<'_, PyAny>,
    filename: &Bound<'_, PyAny>,
    block_size: i64,
    queue_depth: i64,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> PyResult<i32> {
    one_shot(py, true, buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate)
}

/// DeepSpeed Asynchronous I/O Write
#[pyfunction]
#[pyo3(signature = (buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, /))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn aio_write(
    py: Python<'_>,
    buffer: &Bound<'_, PyAny>,
    filename: &Bound<'_, PyAny>,
    block_size: i64,
    queue_depth: i64,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> PyResult<i32> {
    one_shot(py, false, buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate)
}

/// DeepSpeed Memory Copy
#[pyfunction]
#[pyo3(signature = (dest, src, /))]
pub(crate) fn deepspeed_memcpy(py: Python<'_>, dest: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<i32> {
    let d = describe(py, dest, true, "deepspeed_memcpy")?;
    let s = describe(py, src, false, "deepspeed_memcpy")?;
    let (dt, st) = (d.tensor, s.tensor);
    // `d` and `s` hold both objects across the copy.
    let rc = py.detach(move || deepspeed::memcpy_f32(&dt, &st)).map_err(py_err);
    drop((d, s));
    rc
}
