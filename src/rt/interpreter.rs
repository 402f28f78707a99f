//! The Python interpreter, as the core needs it without knowing the front
//! end (a leaf: it names no other module of the crate but `error`):
//! * holding its lock (the GIL) while the core touches memory that Python
//!   code could otherwise free or move ([`with_interpreter_lock`]);
//! * letting go of it while a call blocks ([`without_gil`]);
//! * running pending signal handlers ([`check_signals`]) and DeepSpeed's
//!   write warning as a Python warning ([`emit_write_warning`]).
//!
//! Without the `python` feature there is no interpreter: these run their
//! closure as it is, report no signal and log nothing.

use crate::error::{Error, Result};

#[cfg(feature = "python")]
pub(crate) use with_python::{check_signals, emit_write_warning, raise_kept_interruption, without_gil};

/// No interpreter: a blocking call just runs.
#[cfg(not(feature = "python"))]
pub(crate) fn without_gil<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// No interpreter: no signal handler to run.
#[cfg(not(feature = "python"))]
pub(crate) fn check_signals() -> Result<()> {
    Ok(())
}

/// No interpreter: no handler raised anything.
#[cfg(not(feature = "python"))]
pub(crate) fn raise_kept_interruption<T>(result: Result<T>) -> Result<T> {
    result
}

/// No interpreter: the caller prints the warning itself.
#[cfg(not(feature = "python"))]
pub(crate) fn emit_write_warning(_message: &str) -> bool {
    false
}

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

#[cfg(feature = "python")]
mod with_python {
    use pyo3::prelude::*;

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
                // SAFETY: as above, the symbol is that function.
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
    pub(crate) fn without_gil<T>(f: impl FnOnce() -> T) -> T {
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

    thread_local! {
        /// The exception a signal handler raised during this thread's
        /// blocking call, kept (not left set) until the call returns to the
        /// front end: Python calls the core still makes meanwhile (a tensor's
        /// extent, a copy) would fail with an exception pending.
        static INTERRUPTION: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
    }

    /// Runs `f` holding the GIL through `PyGILState_Ensure`, without pyo3's
    /// per-thread count: a handler `f` runs may call a compiled handle whose
    /// bindings release the GIL (pybind11), which pyo3's count would not
    /// see, so a nested `Python::try_attach` would then skip taking it. None
    /// when the interpreter is not running.
    fn holding_gil_uncounted<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
        // SAFETY: Py_IsInitialized is callable from any thread; Ensure/Release
        // pair on this thread; the token is used only while the GIL is held.
        unsafe {
            if pyo3::ffi::Py_IsInitialized() == 0 {
                return None;
            }
            let state = pyo3::ffi::PyGILState_Ensure();
            let out = f(Python::assume_attached());
            pyo3::ffi::PyGILState_Release(state);
            Some(out)
        }
    }

    /// `PyErr_CheckSignals` with the GIL, run holding no lock of a handle:
    /// the handlers may call any method of it. The exception a handler
    /// raised (KeyboardInterrupt) is kept for [`raise_kept_interruption`]
    /// (the first, if several) and reported as [`Error::Interrupted`].
    pub(crate) fn check_signals() -> crate::error::Result<()> {
        holding_gil_uncounted(|py| {
            // SAFETY: the GIL is held (above).
            match unsafe { pyo3::ffi::PyErr_CheckSignals() } {
                0 => Ok(()),
                _ => {
                    let err = PyErr::fetch(py);
                    let text = err.to_string();
                    INTERRUPTION.with(|kept| {
                        kept.borrow_mut().get_or_insert(err);
                    });
                    Err(crate::error::Error::Interrupted(text))
                }
            }
        })
        .unwrap_or(Ok(()))
    }

    /// At the front end's boundary, once a call returns: an exception a
    /// signal handler raised during it is set again, for pyo3 (`PyErr::take`)
    /// or pybind11 (`error_already_set`) to raise, and the call's result
    /// becomes [`Error::Interrupted`] (a write still wrote everything first;
    /// another error it had is logged).
    pub(crate) fn raise_kept_interruption<T>(result: crate::error::Result<T>) -> crate::error::Result<T> {
        let Some(err) = INTERRUPTION.with(|kept| kept.borrow_mut().take()) else { return result };
        if let Err(e) = &result {
            if !matches!(e, crate::error::Error::Interrupted(_)) {
                crate::rt::log::error(&format!("{e} (and the call was interrupted)"));
            }
        }
        let text = err.to_string();
        holding_gil_uncounted(|py| err.restore(py));
        Err(crate::error::Error::Interrupted(text))
    }

    /// Warns `message` as a `deepnvme.DeepNVMeWarning` through Python's
    /// `warnings` (attributed to the calling Python line), so that a user
    /// can filter it, unless another extension already gave DeepSpeed's
    /// warning (the marker on `deepspeed.utils`, when DeepSpeed is
    /// imported). A filter that turns it into an error does not fail the
    /// write: the exception is dropped. Returns false when there is no
    /// Python to take it (the caller then prints it itself).
    pub(crate) fn emit_write_warning(message: &str) -> bool {
        Python::try_attach(|py| {
            let attempt = || -> PyResult<()> {
                let modules = py.import("sys")?.getattr("modules")?;
                if let Ok(utils) = modules.get_item("deepspeed.utils") {
                    if utils.hasattr(WRITE_WARNING_MARKER)? {
                        return Ok(());
                    }
                    utils.setattr(WRITE_WARNING_MARKER, true)?;
                }
                let category = py.import("deepnvme")?.getattr("DeepNVMeWarning")?;
                let category = category.cast_into::<pyo3::types::PyType>()?;
                PyErr::warn(py, &category, &std::ffi::CString::new(message)?, 1)
            };
            if let Err(e) = attempt() {
                // An "error" filter raised it: the write goes on.
                if !e.is_instance_of::<pyo3::exceptions::PyWarning>(py) {
                    return false;
                }
            }
            true
        })
        .unwrap_or(false)
    }
}
