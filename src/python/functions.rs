//! py_ds_aio.cpp's module functions: `aio_read`, `aio_write` and
//! `deepspeed_memcpy` (positional arguments, as pybind11 declares them
//! without names), implemented by [`crate::deepspeed`].

use pyo3::prelude::*;

use super::buffer::{describe, path_arg, py_err};
use crate::config::DeepSpeedKnobs;
use crate::deepspeed::{self, Request, Target};
use crate::error::Direction;

/// The arguments `aio_read` and `aio_write` share, past the buffer.
struct OneShot<'a, 'py> {
    filename: &'a Bound<'py, PyAny>,
    knobs: DeepSpeedKnobs,
    validate: bool,
}

fn one_shot(read: bool, buffer: &Bound<'_, PyAny>, args: OneShot<'_, '_>) -> PyResult<i32> {
    let py = buffer.py();
    let OneShot { filename, knobs, validate } = args;
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
    py.detach(move || deepspeed::one_shot(request, &knobs)).map_err(py_err)
}

/// The one-shot transfers' knobs (their parallelism is 1).
fn one_shot_knobs(block_size: i64, queue_depth: i64, single_submit: bool, overlap_events: bool) -> DeepSpeedKnobs {
    DeepSpeedKnobs { block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism: 1, use_gds: false }
}

/// DeepSpeed Asynchronous I/O Read
#[pyfunction]
#[pyo3(signature = (buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, /))]
pub(crate) fn aio_read(
    buffer: &Bound<'_, PyAny>,
    filename: &Bound<'_, PyAny>,
    block_size: i64,
    queue_depth: i64,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> PyResult<i32> {
    let knobs = one_shot_knobs(block_size, queue_depth, single_submit, overlap_events);
    one_shot(true, buffer, OneShot { filename, knobs, validate })
}

/// DeepSpeed Asynchronous I/O Write
#[pyfunction]
#[pyo3(signature = (buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, /))]
pub(crate) fn aio_write(
    buffer: &Bound<'_, PyAny>,
    filename: &Bound<'_, PyAny>,
    block_size: i64,
    queue_depth: i64,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> PyResult<i32> {
    let knobs = one_shot_knobs(block_size, queue_depth, single_submit, overlap_events);
    one_shot(false, buffer, OneShot { filename, knobs, validate })
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
