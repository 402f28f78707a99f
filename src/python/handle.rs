//! `aio_handle` and `gds_handle`: DeepSpeed's handle classes (py_ds_aio.cpp,
//! py_ds_gds.cpp) with the same method names, positional and keyword
//! argument names (including DeepSpeed's `example_tenosr`) and defaults,
//! implemented by [`crate::deepspeed::Handle`]. Every call that can block
//! (I/O, the handle's lock, locking memory, cuFile) runs detached from the
//! interpreter (`py.detach`), also where DeepSpeed's bindings keep the GIL.

use std::path::PathBuf;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::buffer::{describe, path_arg, py_err};
use super::pinned::new_locked_object;
use crate::config::DeepSpeedKnobs;
use crate::deepspeed::{self, Handle, Request, Target};
use crate::error::Direction;
use crate::knobs;

/// The handle and the knobs it was made with (what the getters return).
pub(crate) struct Inner {
    handle: Option<Handle>,
    knobs: DeepSpeedKnobs,
}

impl Drop for Inner {
    /// Ops still in flight are finished with the GIL released (pyo3 knows it
    /// is released, so the ops' copies can take it back on this thread).
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let mut handle = Some(handle);
            let _ = Python::try_attach(|py| {
                let h = handle.take();
                py.detach(move || drop(h))
            });
            drop(handle); // the interpreter is gone: the core releases nothing of Python
        }
    }
}

/// One of DeepSpeed's op calls, but for its buffer and file.
struct Call<'a> {
    /// The method's name, for errors.
    what: &'a str,
    read: bool,
    validate: bool,
    /// `Some(async)` for pread/pwrite and their sync_/async_ forms, `None`
    /// for read/write (one unsplit transfer).
    is_async: Option<bool>,
    file_offset: i64,
}

/// Where an op goes: a file name, or a caller's descriptor.
enum Dest {
    Path(PathBuf),
    Fd(i32),
}

impl Inner {
    pub(crate) fn new(py: Python<'_>, knobs: DeepSpeedKnobs) -> PyResult<Inner> {
        let handle = py.detach(|| Handle::new(&knobs)).map_err(py_err)?;
        Ok(Inner { handle: Some(handle), knobs })
    }

    fn handle(&self) -> &Handle {
        self.handle.as_ref().expect("the handle lives until the object is dropped")
    }

    fn op(&self, py: Python<'_>, call: Call<'_>, buffer: &Bound<'_, PyAny>, dest: Dest) -> PyResult<i32> {
        let Call { what, read, validate, is_async, file_offset } = call;
        let described = describe(py, buffer, read, what)?.for_op();
        let target = match &dest {
            Dest::Path(p) => Target::Path(p),
            Dest::Fd(fd) => Target::Fd(*fd),
        };
        let request = Request {
            direction: if read { Direction::Read } else { Direction::Write },
            target,
            file_offset,
            tensor: described.tensor,
            staging: Some(Box::new(described.staging)),
            validate,
        };
        let handle = self.handle();
        py.detach(move || match is_async {
            Some(is_async) => handle.submit(request, is_async),
            None => handle.transfer_inline(request),
        })
        .map_err(py_err)
    }

    fn path_op(&self, py: Python<'_>, call: Call<'_>, args: (&Bound<'_, PyAny>, &Bound<'_, PyAny>)) -> PyResult<i32> {
        let path = path_arg(args.1, call.what)?;
        self.op(py, call, args.0, Dest::Path(path))
    }

    fn async_pwrite(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        filename: Option<&Bound<'_, PyAny>>,
        file_offset: i64,
        fd: Option<i32>,
    ) -> PyResult<i32> {
        // DeepSpeed's two overloads: (buffer, filename, file_offset) and (buffer, fd, file_offset).
        let dest = match (filename, fd) {
            (Some(_), Some(_)) => return Err(PyTypeError::new_err("async_pwrite: pass filename or fd, not both")),
            (None, None) => return Err(PyTypeError::new_err("async_pwrite: missing filename (or fd)")),
            (None, Some(fd)) => Dest::Fd(fd),
            (Some(f), None) if f.is_instance_of::<pyo3::types::PyInt>() => Dest::Fd(f.extract()?),
            (Some(f), None) => Dest::Path(path_arg(f, "async_pwrite")?),
        };
        let call = Call { what: "async_pwrite", read: false, validate: false, is_async: Some(true), file_offset };
        self.op(py, call, buffer, dest)
    }

    fn wait(&self, py: Python<'_>) -> PyResult<i32> {
        let handle = self.handle();
        py.detach(|| handle.wait()).map_err(py_err)
    }

    fn is_pinned(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = describe(py, buffer, false, "is_pinned")?;
        Ok(self.handle().is_pinned(&d.tensor))
    }

    fn free_locked(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = describe(py, tensor, false, "free_cpu_locked_tensor")?;
        Ok(deepspeed::pinned_free_tensor(&d.tensor))
    }

    fn register(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>, pin: bool) -> PyResult<bool> {
        let what = if pin { "pin_device_tensor" } else { "unpin_device_tensor" };
        let d = describe(py, tensor, false, what)?;
        let handle = self.handle();
        let t = d.tensor;
        py.detach(move || if pin { handle.register_device(&t) } else { handle.deregister_device(&t) }).map_err(py_err)
    }
}

/// One handle class with DeepSpeed's methods; `$extra` adds the class's own.
macro_rules! handle_class {
    ($rust:ident, $py:literal, $use_gds:expr, { $($extra:tt)* }) => {
        #[pyclass(name = $py, module = "deepnvme._native", frozen)]
        pub(crate) struct $rust {
            inner: Inner,
        }

        #[pymethods]
        impl $rust {
            #[new]
            #[pyo3(signature = (
                block_size = knobs::DEFAULT_BLOCK_SIZE as i64,
                queue_depth = knobs::DEFAULT_QUEUE_DEPTH as i64,
                single_submit = knobs::DEFAULT_SINGLE_SUBMIT,
                overlap_events = knobs::DEFAULT_OVERLAP_EVENTS,
                intra_op_parallelism = knobs::DEFAULT_INTRA_OP_PARALLELISM as i64,
            ))]
            fn new(
                py: Python<'_>,
                block_size: i64,
                queue_depth: i64,
                single_submit: bool,
                overlap_events: bool,
                intra_op_parallelism: i64,
            ) -> PyResult<Self> {
                let knobs = DeepSpeedKnobs { block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, use_gds: $use_gds };
                let inner = Inner::new(py, knobs)?;
                Ok($rust { inner })
            }

            fn get_block_size(&self) -> i64 { self.inner.knobs.block_size }
            fn get_queue_depth(&self) -> i64 { self.inner.knobs.queue_depth }
            fn get_single_submit(&self) -> bool { self.inner.knobs.single_submit }
            fn get_overlap_events(&self) -> bool { self.inner.knobs.overlap_events }
            fn get_intra_op_parallelism(&self) -> i64 { self.inner.knobs.intra_op_parallelism }
            fn get_alignment(&self) -> i32 { self.inner.handle().alignment() }

            /// Synchronous and non-parallel file read. Returns count of completed read ops
            #[pyo3(signature = (buffer, filename, validate, file_offset = 0))]
            fn read(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, validate: bool, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "read", read: true, validate, is_async: None, file_offset }, (buffer, filename))
            }

            /// Synchronous and non-parallel file write. Returns count of completed write ops
            #[pyo3(signature = (buffer, filename, validate, file_offset = 0))]
            fn write(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, validate: bool, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "write", read: false, validate, is_async: None, file_offset }, (buffer, filename))
            }

            /// Parallel file read with option of asynchronous completion. If synchronous, returns count of completed read ops
            #[pyo3(signature = (buffer, filename, validate, r#async, file_offset = 0))]
            fn pread(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, validate: bool, r#async: bool, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "pread", read: true, validate, is_async: Some(r#async), file_offset }, (buffer, filename))
            }

            /// Parallel file write with option of asynchronous completion. If synchronous, returns count of completed write ops
            #[pyo3(signature = (buffer, filename, validate, r#async, file_offset = 0))]
            fn pwrite(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, validate: bool, r#async: bool, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "pwrite", read: false, validate, is_async: Some(r#async), file_offset }, (buffer, filename))
            }

            /// Synchronous parallel file read. Returns count of completed read ops
            #[pyo3(signature = (buffer, filename, file_offset = 0))]
            fn sync_pread(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "sync_pread", read: true, validate: false, is_async: Some(false), file_offset }, (buffer, filename))
            }

            /// Synchronous parallel file write. Returns count of completed write ops
            #[pyo3(signature = (buffer, filename, file_offset = 0))]
            fn sync_pwrite(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "sync_pwrite", read: false, validate: false, is_async: Some(false), file_offset }, (buffer, filename))
            }

            /// Asynchronous parallel file read. Returns 0 on success, and subsequent wait() returns count of completed ops.
            #[pyo3(signature = (buffer, filename, file_offset = 0))]
            fn async_pread(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: &Bound<'_, PyAny>, file_offset: i64) -> PyResult<i32> {
                self.inner.path_op(py, Call { what: "async_pread", read: true, validate: false, is_async: Some(true), file_offset }, (buffer, filename))
            }

            /// Asynchronous parallel file write to a file name, or (second
            /// argument an int, or fd=) to an open descriptor. Returns 0 on
            /// success, and subsequent wait() returns count of completed ops.
            #[pyo3(signature = (buffer, filename = None, file_offset = 0, fd = None))]
            fn async_pwrite(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, filename: Option<&Bound<'_, PyAny>>, file_offset: i64, fd: Option<i32>) -> PyResult<i32> {
                self.inner.async_pwrite(py, buffer, filename, file_offset, fd)
            }

            /// Allocate pinned CPU tensor.
            #[pyo3(signature = (num_elem, example_tenosr))]
            fn new_cpu_locked_tensor(&self, py: Python<'_>, num_elem: i64, example_tenosr: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
                new_locked_object(py, num_elem, example_tenosr)
            }

            /// Free pinned CPU tensor.
            #[pyo3(signature = (tensor))]
            fn free_cpu_locked_tensor(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
                self.inner.free_locked(py, tensor)
            }

            /// Whether the buffer is directly usable for DeepNVMe I/O (torch-pinned or page-locked by the DeepNVMe pinned-tensor manager).
            #[pyo3(signature = (buffer))]
            fn is_pinned(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
                self.inner.is_pinned(py, buffer)
            }

            /// Wait for (ongoing) asynchronous operations to complete
            fn wait(&self, py: Python<'_>) -> PyResult<i32> {
                self.inner.wait(py)
            }

            $($extra)*
        }
    };
}

handle_class!(AioHandle, "aio_handle", false, {});

handle_class!(GdsHandle, "gds_handle", true, {
    /// Allocate pinned device tensor.
    #[pyo3(signature = (num_elem, example_tenosr))]
    fn new_pinned_device_tensor(&self, py: Python<'_>, num_elem: i64, example_tenosr: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let torch = py.import("torch")?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("dtype", example_tenosr.getattr("dtype")?)?;
        let device = example_tenosr.getattr("device")?;
        let is_cuda = device.getattr("type")?.extract::<String>()? == "cuda";
        kwargs.set_item("device", if is_cuda { device } else { pyo3::types::PyString::new(py, "cuda").into_any() })?;
        let tensor = torch.call_method("empty", (num_elem,), Some(&kwargs))?;
        self.inner.register(py, &tensor, true)?;
        Ok(tensor.unbind())
    }

    /// Free pinned device tensor.
    #[pyo3(signature = (tensor))]
    fn free_pinned_device_tensor(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.inner.register(py, tensor, false)
    }

    /// Pin device tensor.
    #[pyo3(signature = (tensor))]
    fn pin_device_tensor(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.inner.register(py, tensor, true)
    }

    /// Unpin device tensor.
    #[pyo3(signature = (tensor))]
    fn unpin_device_tensor(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.inner.register(py, tensor, false)
    }
});
