//! Python objects as the core sees them: a [`TensorDesc`] and a [`Staging`]
//! that holds the object until the op is finished.
//!
//! What an object is (torch tensor, numpy array, buffer-protocol object) is
//! asked in Python, by `deepnvme._objects.describe`, through the objects'
//! Python interfaces only (no torch, numpy or buffer API is linked: the
//! module is abi3). This file turns its answer into the core's types. An
//! object without a copier is copied by `buffer.rs`'s `HostMemcpy`, under
//! the ownership rule (`op/caller.rs`: inside the hold, after the extent
//! check).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString};

use crate::buffer::{BufferDesc, HostMemcpy, Location, Staging};
use crate::deepspeed::TensorDesc;
use crate::error::{Error, Result};
use crate::op::caller::CallerMemory;

/// A core error as Python sees it (pybind11 turns the compiled modules'
/// errors into `RuntimeError` too).
pub(crate) fn py_err(e: Error) -> PyErr {
    if let Error::Interrupted(_) = &e {
        // The exception a signal handler raised (KeyboardInterrupt), left
        // set by `check_signals`.
        if let Some(pending) = Python::try_attach(PyErr::take).flatten() {
            return pending;
        }
    }
    PyRuntimeError::new_err(e.to_string())
}

/// The fields of `deepnvme._objects.Description`, in the order [`describe`]
/// unpacks them.
const DESCRIPTION_FIELDS: [&str; 12] = [
    "ptr", "nbytes", "element_size", "dim0", "device", "device_index", "contiguous", "pinned", "has_storage", "hold",
    "copier", "extent",
];

/// `deepnvme._objects`, imported once, after checking that its
/// `Description` has the fields this file unpacks (a package and a native
/// module from different builds fail here, with both lists).
pub(crate) fn objects(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || {
            let module = py.import("deepnvme._objects")?;
            let fields: Vec<String> = module.getattr("Description")?.getattr("_fields")?.extract()?;
            if fields != DESCRIPTION_FIELDS {
                return Err(PyRuntimeError::new_err(format!(
                    "deepnvme._objects.Description has fields {fields:?}, this build of deepnvme._native unpacks \
                     {DESCRIPTION_FIELDS:?}: the Python package and the native module come from different builds; \
                     reinstall deepnvme"
                )));
            }
            Ok(module.unbind())
        })
        .map(|m| m.bind(py))
}

/// An object described for the core, and the op's hold on it.
pub(crate) struct Described {
    pub tensor: TensorDesc,
    pub staging: PyStaging,
}

impl Described {
    /// The description an op uses. A torch tensor (whose storage a growing
    /// `resize_` can reallocate, freeing its bytes, while the op runs) is
    /// never given to the I/O directly, even when torch-pinned: this front
    /// end cannot make the storage unresizable (the compiled one does,
    /// `resize_hold.rs`), so it bounces, and its copies check where the
    /// tensor is (`op/caller.rs`). `is_pinned` still answers torch's word.
    pub(crate) fn for_op(mut self) -> Described {
        if self.staging.extent.is_some() {
            self.tensor.buffer = self.tensor.buffer.pinned(false);
        }
        self
    }
}

/// The op's hold on the caller's object (and on its buffer export), and the
/// way to copy it to and from a bounce buffer: the object's own copy
/// (`copy_`, `numpy.copyto`), called with the GIL, else for contiguous host
/// memory `buffer.rs`'s `HostMemcpy`, inside the hold.
pub(crate) struct PyStaging {
    _hold: Py<PyAny>,
    copier: Option<Py<PyAny>>,
    /// For a torch tensor, a callable answering `(ptr, nbytes)` of its bytes
    /// now (its storage may be swapped mid-flight); None for memory that
    /// cannot move while `_hold` lives (a held buffer export, a numpy array).
    extent: Option<Py<PyAny>>,
    desc: BufferDesc,
    /// `desc`'s memcpy, when it is contiguous host memory.
    memcpy: Option<HostMemcpy>,
}

impl PyStaging {
    fn call(&self, copier: &Py<PyAny>, method: &str, addr: *const u8, n: usize) -> Result<()> {
        Python::try_attach(|py| {
            copier
                .bind(py)
                .call_method1(method, (addr as usize, n))
                .map(|_| ())
                .map_err(|e| Error::Copy(format!("{method}: {e}")))
        })
        .unwrap_or_else(|| Err(Error::Copy("the Python interpreter is shutting down".into())))
    }

    /// The memcpy fallback (no copier: contiguous host memory), run as the
    /// ownership rule says (`op/caller.rs`): through `CallerMemory`, inside
    /// this object's hold (the GIL) after checking the bytes are still where
    /// they were given.
    fn memcpy_held(&mut self, copy: impl FnOnce(&mut HostMemcpy) -> usize) -> Result<()> {
        // Out of `self` while it copies: the hold borrows the rest of `self`.
        let mut memcpy = self.memcpy.take().ok_or_else(|| Error::Copy("no copier for device or strided memory".into()))?;
        let caller = CallerMemory { addr: self.desc.ptr() as usize, len: self.desc.len() };
        let what = || format!("a copy of {} bytes of a Python object without a copier", self.desc.len());
        let copied = caller.with_bytes(&*self, 0, self.desc.len(), &what, |_| copy(&mut memcpy)).map(drop);
        self.memcpy = Some(memcpy);
        copied
    }
}

impl Staging for PyStaging {
    /// Under the GIL: Python code can then neither free nor move the
    /// object's memory (a tensor's `resize_`/`set_`, a bytearray's resize is
    /// refused anyway while `_hold` holds its export).
    fn hold_still(&self, access: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        crate::rt::interpreter::with_interpreter_lock(access)
    }

    fn current_extent(&self) -> Option<(usize, usize)> {
        let extent = self.extent.as_ref()?;
        // Asked with the GIL (inside `hold_still`), through the tensor's
        // C methods only: Python code here would run pending signal handlers
        // (a KeyboardInterrupt raised inside the check would read as a moved
        // tensor, and be lost). If the question cannot be answered, say the
        // buffer moved: the op then fails instead of copying into memory it
        // cannot vouch for.
        let now = Python::try_attach(|py| held_extent(extent.bind(py)));
        Some(now.flatten().unwrap_or((0, 0)))
    }

    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        let n = bounce.len().min(self.desc.len());
        match &self.copier {
            Some(c) => self.call(c, "to_bounce", bounce.as_ptr(), n),
            None => self.memcpy_held(|memcpy| memcpy.bytes_to_bounce(bounce)),
        }
    }

    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        let n = bounce.len().min(self.desc.len());
        match &self.copier {
            Some(c) => self.call(c, "from_bounce", bounce.as_ptr(), n),
            None => self.memcpy_held(|memcpy| memcpy.bytes_from_bounce(bounce)),
        }
    }
}

/// Where the bytes of the tensor held by a `_TensorExtent` are now: its
/// storage's address plus its offset, and its bytes; of the numpy array
/// held by an `_ArrayExtent`: its array interface's data pointer and its
/// items' bytes; (0, 0) when its memory is gone or cannot be asked.
fn held_extent(extent: &Bound<'_, PyAny>) -> Option<(usize, usize)> {
    let answer = (|| -> PyResult<(usize, usize)> {
        if let Ok(a) = extent.getattr("array") {
            // ndarray's interface is a C getter: no Python code runs.
            let ai = a.getattr("__array_interface__")?;
            let ptr: usize = ai.get_item("data")?.get_item(0)?.extract()?;
            let itemsize: usize = extent.getattr("itemsize")?.extract()?;
            let mut count = 1usize;
            for n in ai.get_item("shape")?.try_iter()? {
                count = count.saturating_mul(n?.extract::<usize>()?);
            }
            return Ok((ptr, count.saturating_mul(itemsize)));
        }
        let t = extent.getattr("tensor")?;
        let base: usize = t.call_method0("untyped_storage")?.call_method0("data_ptr")?.extract()?;
        let offset: usize = t.call_method0("storage_offset")?.extract()?;
        let element: usize = t.call_method0("element_size")?.extract()?;
        let numel: usize = t.call_method0("numel")?.extract()?;
        Ok((if base == 0 { 0 } else { base + offset * element }, numel * element))
    })();
    // An error is a storage that went away (RuntimeError, NotImplementedError)
    // or one that cannot be vouched for: either way, nothing is copied.
    Some(answer.unwrap_or((0, 0)))
}

/// Describes `obj` for a call named `what`. `into`: the op writes into the
/// object (a read), so a read-only buffer is refused with a TypeError.
pub(crate) fn describe(py: Python<'_>, obj: &Bound<'_, PyAny>, into: bool, what: &str) -> PyResult<Described> {
    let answer = objects(py)?.call_method1("describe", (obj, into, what))?;
    // A `Description`, by position: see DESCRIPTION_FIELDS.
    #[allow(clippy::type_complexity)]
    let (ptr, nbytes, element_size, dim0, device, index, contiguous, pinned, has_storage, hold, copier, extent): (
        usize,
        usize,
        usize,
        i64,
        String,
        i32,
        bool,
        bool,
        bool,
        Py<PyAny>,
        Option<Py<PyAny>>,
        Option<Py<PyAny>>,
    ) = answer.extract()?;
    let location = match device.as_str() {
        "cpu" => Location::Host,
        "cuda" => Location::Cuda(index),
        _ => Location::OtherDevice,
    };
    // SAFETY: `hold` keeps the object (and its buffer export) alive until the
    // op using this description is finished: the core keeps the returned
    // PyStaging as the op's Staging. Calls without an op (is_pinned, memcpy,
    // free) use the memory only while the caller's object is alive.
    let desc = unsafe { BufferDesc::from_raw_parts(ptr as *mut u8, nbytes) }
        .located(location)
        .contiguous(contiguous)
        .pinned(location == Location::Host && pinned);
    let tensor = TensorDesc { buffer: desc, has_storage, element_size, dim0 };
    Ok(Described { tensor, staging: PyStaging { _hold: hold, copier, extent, desc, memcpy: HostMemcpy::new(desc) } })
}

/// A file name as DeepSpeed's bindings take it (`const char*`: str or bytes).
pub(crate) fn path_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(PathBuf::from(s.to_cow()?.into_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(PathBuf::from(OsStr::from_bytes(b.as_bytes())));
    }
    Err(PyTypeError::new_err(format!(
        "{what}: filename must be str or bytes, not {}",
        obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
    )))
}
