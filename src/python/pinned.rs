//! Page-locked memory for Python: `pin_handle` (py_ds_pin_memory.cpp's API)
//! and the `new_cpu_locked_tensor` every handle has.
//!
//! The compiled modules wrap locked memory in a tensor that does not own it
//! (freed only by `free_cpu_locked_tensor`). Here the returned object owns
//! it: a [`LockedMemory`] (a [`crate::LockedBuffer`]) that the tensor or
//! array keeps alive through its buffer, so the memory is freed when the
//! last reference goes. `free_cpu_locked_tensor` frees it as DeepSpeed's
//! does (it stops being managed, through any front end), while the memory
//! stays mapped for the objects still pointing at it.

use pyo3::prelude::*;

use super::buffer::{describe, objects, py_err};
use crate::deepspeed;
use crate::pinned::LockedBuffer;

/// Locked memory owned by Python: freed when the last reference goes.
#[pyclass(module = "deepnvme._native", frozen)]
pub(crate) struct LockedMemory {
    buffer: LockedBuffer,
}

#[pymethods]
impl LockedMemory {
    /// The base address.
    #[getter]
    fn address(&self) -> usize {
        self.buffer.as_ptr() as usize
    }

    /// The bytes asked for.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the process-wide manager still manages it.
    fn is_managed(&self) -> bool {
        self.buffer.is_managed()
    }
}

/// The element size of an example object: a tensor's `element_size()`, an
/// array's `itemsize`, else 1 byte.
fn element_size(example: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(f) = example.getattr("element_size") {
        if f.is_callable() {
            return f.call0()?.extract();
        }
    }
    if let Ok(n) = example.getattr("itemsize") {
        return n.extract();
    }
    Ok(1)
}

/// `new_cpu_locked_tensor(num_elem, example)`: a torch tensor of the
/// example's dtype (a numpy array for a numpy example, or without torch)
/// over new locked memory that it owns.
pub(crate) fn new_locked_object(py: Python<'_>, num_elem: i64, example: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let size = element_size(example)?;
    let buffer = py.detach(|| deepspeed::pinned_alloc_owned(num_elem, size)).map_err(py_err)?;
    let memory = Bound::new(py, LockedMemory { buffer })?;
    Ok(objects(py)?.call_method1("locked_object", (memory, num_elem, example))?.unbind())
}

/// DeepSpeed's `pin_handle` (PinMemoryBuilder().load().pin_handle()).
#[pyclass(name = "pin_handle", module = "deepnvme._native", frozen)]
pub(crate) struct PinHandle;

#[pymethods]
impl PinHandle {
    /// Pin-memory handle constructor
    #[new]
    fn new() -> Self {
        PinHandle
    }

    /// Allocate a page-locked CPU tensor
    #[pyo3(signature = (num_elem, example_tensor))]
    fn new_cpu_locked_tensor(&self, py: Python<'_>, num_elem: i64, example_tensor: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        new_locked_object(py, num_elem, example_tensor)
    }

    /// Free a page-locked CPU tensor
    #[pyo3(signature = (locked_tensor))]
    fn free_cpu_locked_tensor(&self, py: Python<'_>, locked_tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = describe(py, locked_tensor, false, "free_cpu_locked_tensor")?;
        Ok(deepspeed::pinned_free_tensor(&d.tensor))
    }

    /// Free a page-locked CPU tensor by its allocation base address
    #[pyo3(signature = (address))]
    fn free_cpu_locked_tensor_by_ptr(&self, address: usize) -> bool {
        deepspeed::pinned_free(address)
    }

    /// Return whether buffer is torch-pinned or managed by DeepSpeed pin_memory
    #[pyo3(signature = (buffer))]
    fn is_pinned(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = describe(py, buffer, false, "is_pinned")?;
        Ok(deepspeed::pinned_or_managed(&d.tensor))
    }
}
