//! The libcufile entry points GDS needs, resolved by hand from the loaded
//! library (see [`crate::gds::shim::dl`]); a failed call is a [`GdsError::CuFile`]
//! with the status, the CUDA error inside it and the errno it left.
//!
//! Return codes are read as plain integers, never as Rust enums (see
//! [`crate::gds::shim::status`]). The two structures passed across are declared here
//! from `cufile.h`, with their size and field offsets checked at compile
//! time: the status pair `CUfileError_t` ([`CuFileStatus`]) and the file
//! descriptor `CUfileDescr_t` ([`CuFileDescr`]).

use std::ffi::{c_int, c_void};

use crate::gds::shim::config::{DriverSettings, MIN_IO_THRESHOLD_SIZE_KB};
use crate::gds::shim::cuda_api::CudaApi;
use crate::gds::shim::dl::{function, Library};
use crate::gds::error::{CudaStatus, GdsError, GdsLibrary};
use crate::gds::shim::status::{CU_FILE_CUDA_DRIVER_ERROR, CU_FILE_DRIVER_ALREADY_OPEN, CU_FILE_SUCCESS};
use crate::gds::shim::symbols::need;

/// `CUfileHandle_t`.
pub(crate) type CuFileHandle = *mut c_void;

/// `CUfileError_t`: a cuFile status (`CUfileOpError`) and, when that is
/// `CU_FILE_CUDA_DRIVER_ERROR`, the CUDA driver's `CUresult`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CuFileStatus {
    pub err: c_int,
    pub cu_err: c_int,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD` (`CUfileFileHandleType`): a Linux fd.
const CU_FILE_HANDLE_TYPE_OPAQUE_FD: c_int = 1;

/// `CUfileDescr_t`: what `cuFileHandleRegister` registers.
///
/// ```c
/// typedef struct CUfileDescr_t {
///     CUfileFileHandleType type;          /* a C enum: an int */
///     union { int fd; void *handle; } handle;
///     const CUfileFSOps_t *fs_ops;        /* NULL: the kernel's file system */
/// } CUfileDescr_t;
/// ```
#[repr(C)]
pub(crate) struct CuFileDescr {
    type_: c_int,
    handle: CuFileDescrHandle,
    fs_ops: *const c_void,
}

/// The `handle` union of `CUfileDescr_t`: a Linux fd or a Windows handle.
#[repr(C)]
union CuFileDescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

// cufile.h's layouts: CUfileError_t is two ints (8 bytes, returned in
// registers); CUfileDescr_t is an int, the pointer-sized union at the next
// pointer boundary, and the fs_ops pointer (24 bytes, 8-aligned, on LP64).
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<CuFileStatus>() == 2 * size_of::<c_int>() && align_of::<CuFileStatus>() == align_of::<c_int>());
    assert!(offset_of!(CuFileStatus, cu_err) == size_of::<c_int>());
    let word = size_of::<*const c_void>();
    assert!(size_of::<CuFileDescrHandle>() == word && align_of::<CuFileDescrHandle>() == word);
    assert!(offset_of!(CuFileDescr, type_) == 0);
    assert!(offset_of!(CuFileDescr, handle) == word);
    assert!(offset_of!(CuFileDescr, fs_ops) == 2 * word);
    assert!(size_of::<CuFileDescr>() == 3 * word && align_of::<CuFileDescr>() == word);
};


/// The calling thread's errno.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot, a
    // valid, aligned int for the life of the thread.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno to 0, so that a value found after a call
/// was set by that call.
pub(crate) fn clear_errno() {
    // SAFETY: the calling thread's errno slot, as in `errno`; only this
    // thread writes it.
    unsafe { *libc::__errno_location() = 0 };
}

// The entry points' C declarations (cufile.h), as Rust fn types.
// `CUfileError_t` is [`CuFileStatus`], returned by value; the parameter
// enums are C ints; `CUfileHandle_t` is a pointer.

/// `CUfileError_t cuFileDriverOpen(void)`, `cuFileDriverClose(void)` and
/// `cuFileDriverClose_v2(void)`.
type FnStatus = unsafe extern "C" fn() -> CuFileStatus;
/// `CUfileError_t cuFileDriverSetMaxDirectIOSize(size_t max_direct_io_size)`.
type FnSetSize = unsafe extern "C" fn(usize) -> CuFileStatus;
/// `CUfileError_t cuFileBufRegister(const void *bufPtr_base, size_t length, int flags)`.
type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileStatus;
/// `CUfileError_t cuFileBufDeregister(const void *bufPtr_base)`.
type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> CuFileStatus;
/// `CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr)`.
type FnHandleRegister = unsafe extern "C" fn(*mut CuFileHandle, *mut CuFileDescr) -> CuFileStatus;
/// `void cuFileHandleDeregister(CUfileHandle_t fh)`.
type FnHandleDeregister = unsafe extern "C" fn(CuFileHandle);
/// `ssize_t cuFileRead(CUfileHandle_t fh, void *bufPtr_base, size_t size,
/// off_t file_offset, off_t bufPtr_offset)`.
type FnRead = unsafe extern "C" fn(CuFileHandle, *mut c_void, usize, libc::off_t, libc::off_t) -> isize;
/// `ssize_t cuFileWrite(CUfileHandle_t fh, const void *bufPtr_base, size_t size,
/// off_t file_offset, off_t bufPtr_offset)`.
type FnWrite = unsafe extern "C" fn(CuFileHandle, *const c_void, usize, libc::off_t, libc::off_t) -> isize;
/// `CUfileError_t cuFileGetVersion(int *version)`.
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> CuFileStatus;
/// `CUfileError_t cuFileSetParameterSizeT(CUFileSizeTConfigParameter_t param, size_t value)`.
type FnSetParamSize = unsafe extern "C" fn(c_int, usize) -> CuFileStatus;
/// `CUfileError_t cuFileSetParameterBool(CUFileBoolConfigParameter_t param, bool value)`.
type FnSetParamBool = unsafe extern "C" fn(c_int, bool) -> CuFileStatus;
/// `CUfileError_t cuFileSetParameterString(CUFileStringConfigParameter_t param, const char *desc_str)`.
type FnSetParamString = unsafe extern "C" fn(c_int, *const std::os::raw::c_char) -> CuFileStatus;

// cufile.h's CUFileSizeTConfigParameter_t, CUFileBoolConfigParameter_t and
// CUFileStringConfigParameter_t values (cuFile 1.14 and later).
const CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH: c_int = 1;
const CUFILE_PARAM_EXECUTION_MAX_IO_THREADS: c_int = 2;
const CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB: c_int = 3;
const CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM: c_int = 4;
const CUFILE_PARAM_EXECUTION_PARALLEL_IO: c_int = 4;
const CUFILE_PARAM_LOG_DIR: c_int = 2;

/// cuFile's parameter API (`cuFileSetParameter*`, cuFile 1.14+): what the
/// driver would read from a config file, set in-process before
/// `cuFileDriverOpen`, so no environment variable has to be set.
#[derive(Clone, Copy)]
struct ParameterApi {
    size: FnSetParamSize,
    boolean: FnSetParamBool,
    string: FnSetParamString,
}

/// libcufile, as far as GDS uses it.
pub(crate) struct CuFileApi {
    _lib: Library,
    pub path: String,
    driver_open: FnStatus,
    driver_close: FnStatus,
    set_max_direct_io_size: FnSetSize,
    buf_register: FnBufRegister,
    buf_deregister: FnBufDeregister,
    handle_register: FnHandleRegister,
    handle_deregister: FnHandleDeregister,
    read: FnRead,
    write: FnWrite,
    get_version: Option<FnGetVersion>,
    parameters: Option<ParameterApi>,
}

/// The error for a failed cuFile call: its status, the CUDA error inside
/// it (named through `cuda` when at hand), and the errno it left.
pub(crate) fn status_error(call: &str, status: CuFileStatus, errno: i32, cuda: Option<&CudaApi>) -> GdsError {
    let cu = (status.err == CU_FILE_CUDA_DRIVER_ERROR || status.cu_err != 0).then(|| match cuda {
        Some(c) => c.status(status.cu_err),
        None => CudaStatus::code_only(status.cu_err),
    });
    GdsError::cufile(call, status.err, cu, errno)
}

impl CuFileApi {
    pub fn load(lib: Library) -> Result<CuFileApi, GdsError> {
        let path = lib.path_of("cuFileDriverOpen").unwrap_or_else(|| lib.name.clone());
        let (p, cufile) = (path.as_str(), GdsLibrary::CuFile);
        // Each field's fn type is the C declaration of the symbols it is
        // resolved from: see the type aliases above.
        Ok(CuFileApi {
            // SAFETY: FnStatus is cuFileDriverOpen's declaration.
            driver_open: unsafe { need(&lib, cufile, p, &["cuFileDriverOpen"]) }?,
            // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 where it exists.
            // SAFETY: FnStatus is the declaration of both names.
            driver_close: unsafe { need(&lib, cufile, p, &["cuFileDriverClose_v2", "cuFileDriverClose"]) }?,
            // SAFETY: FnSetSize is cuFileDriverSetMaxDirectIOSize's declaration.
            set_max_direct_io_size: unsafe { need(&lib, cufile, p, &["cuFileDriverSetMaxDirectIOSize"]) }?,
            // SAFETY: FnBufRegister is cuFileBufRegister's declaration.
            buf_register: unsafe { need(&lib, cufile, p, &["cuFileBufRegister"]) }?,
            // SAFETY: FnBufDeregister is cuFileBufDeregister's declaration.
            buf_deregister: unsafe { need(&lib, cufile, p, &["cuFileBufDeregister"]) }?,
            // SAFETY: FnHandleRegister is cuFileHandleRegister's declaration.
            handle_register: unsafe { need(&lib, cufile, p, &["cuFileHandleRegister"]) }?,
            // SAFETY: FnHandleDeregister is cuFileHandleDeregister's declaration.
            handle_deregister: unsafe { need(&lib, cufile, p, &["cuFileHandleDeregister"]) }?,
            // SAFETY: FnRead is cuFileRead's declaration.
            read: unsafe { need(&lib, cufile, p, &["cuFileRead"]) }?,
            // SAFETY: FnWrite is cuFileWrite's declaration.
            write: unsafe { need(&lib, cufile, p, &["cuFileWrite"]) }?,
            // SAFETY: FnGetVersion is cuFileGetVersion's declaration.
            get_version: unsafe { function(&lib, "cuFileGetVersion") },
            // SAFETY: FnSetParamSize, FnSetParamBool and FnSetParamString are
            // the declarations of the three cuFileSetParameter* functions.
            parameters: unsafe {
                match (
                    function::<FnSetParamSize>(&lib, "cuFileSetParameterSizeT"),
                    function::<FnSetParamBool>(&lib, "cuFileSetParameterBool"),
                    function::<FnSetParamString>(&lib, "cuFileSetParameterString"),
                ) {
                    (Some(size), Some(boolean), Some(string)) => Some(ParameterApi { size, boolean, string }),
                    _ => None,
                }
            },
            path,
            _lib: lib,
        })
    }

    /// "1.17.0" for 1170, when the library says (cuFile 1.8 and later). Safe
    /// to call without a GPU: it touches no device and reads no config.
    pub fn version(&self) -> Option<String> {
        let f = self.get_version?;
        let mut v: c_int = 0;
        // SAFETY: cuFileGetVersion writes one int, into `v`, a live local.
        let st = unsafe { f(&mut v) };
        (st.err == CU_FILE_SUCCESS && v > 0).then(|| format!("{}.{}.{}", v / 1000, (v % 1000) / 10, v % 10))
    }

    fn call_status(
        &self,
        call: &str,
        f: impl FnOnce() -> CuFileStatus,
        cuda: Option<&CudaApi>,
    ) -> Result<(), GdsError> {
        clear_errno();
        let st = f();
        let e = errno();
        if st.err == CU_FILE_SUCCESS {
            Ok(())
        } else {
            Err(status_error(call, st, e, cuda))
        }
    }

    /// Sets what the driver reads from the `execution` section of a config
    /// file, and its log directory, through the parameter API, before
    /// `cuFileDriverOpen`. `Ok(false)`: this libcufile has no parameter API
    /// (before 1.14), and the caller falls back to a config file.
    pub fn set_parameters(
        &self,
        settings: &DriverSettings,
        log_dir: &std::path::Path,
        cuda: &CudaApi,
    ) -> Result<bool, GdsError> {
        let Some(api) = self.parameters else { return Ok(false) };
        let sizes = [
            (CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH, "max_io_queue_depth", settings.queue_depth),
            (CUFILE_PARAM_EXECUTION_MAX_IO_THREADS, "max_io_threads", settings.intra_op_parallelism),
            (CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM, "max_request_parallelism", settings.intra_op_parallelism),
            (
                CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB,
                "min_io_threshold_size_kb",
                MIN_IO_THRESHOLD_SIZE_KB,
            ),
        ];
        for (param, name, value) in sizes {
            let call = format!("cuFileSetParameterSizeT({name}, {value})");
            // SAFETY: plain values (a parameter enum and a size); nothing is borrowed.
            let set = || unsafe { (api.size)(param, value) };
            self.call_status(&call, set, Some(cuda))?;
        }
        let parallel_io = CUFILE_PARAM_EXECUTION_PARALLEL_IO;
        // SAFETY: plain values (a parameter enum and a bool); nothing is borrowed.
        let set_parallel_io = || unsafe { (api.boolean)(parallel_io, true) };
        self.call_status("cuFileSetParameterBool(parallel_io, true)", set_parallel_io, Some(cuda))?;
        let dir = std::ffi::CString::new(log_dir.as_os_str().as_encoded_bytes()).map_err(|_| GdsError::Config {
            action: "passing the cuFile log directory (it contains a NUL byte)",
            path: log_dir.to_path_buf(),
            source: std::sync::Arc::new(std::io::Error::from_raw_os_error(libc::EINVAL)),
        })?;
        // SAFETY: a parameter enum and a NUL-terminated string, `dir`, that
        // outlives the call (cuFile copies it).
        let set_log_dir = || unsafe { (api.string)(CUFILE_PARAM_LOG_DIR, dir.as_ptr()) };
        let call = format!("cuFileSetParameterString(log_dir, {})", log_dir.display());
        self.call_status(&call, set_log_dir, Some(cuda))?;
        Ok(true)
    }

    /// `cuFileDriverOpen`. `Ok(true)`: opened; `Ok(false)`: someone else in
    /// the process (torch, say) had it open already (`CU_FILE_DRIVER_ALREADY_OPEN`).
    /// Never call it without a working libcuda and a device: libcufile 1.17
    /// spins forever in it when libcuda is missing.
    pub fn driver_open(&self, cuda: &CudaApi) -> Result<bool, GdsError> {
        clear_errno();
        // SAFETY: no arguments. (That libcuda works and a device is there is
        // for liveness, not soundness: see above.)
        let st = unsafe { (self.driver_open)() };
        let e = errno();
        match st.err {
            CU_FILE_SUCCESS => Ok(true),
            CU_FILE_DRIVER_ALREADY_OPEN => Ok(false),
            _ => Err(status_error("cuFileDriverOpen", st, e, Some(cuda))),
        }
    }

    pub fn driver_close(&self, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: no arguments; closing a driver that is not open is an error status.
        let close = || unsafe { (self.driver_close)() };
        self.call_status("cuFileDriverClose", close, Some(cuda))
    }

    pub fn set_max_direct_io_size_kb(&self, kb: usize, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: a plain size argument.
        let set = || unsafe { (self.set_max_direct_io_size)(kb) };
        self.call_status(&format!("cuFileDriverSetMaxDirectIOSize({kb} KiB)"), set, Some(cuda))
    }

    pub fn buf_register(&self, ptr: u64, len: usize, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: the pointer is only an address to cuFile, which looks it up
        // in the CUDA driver (an error status for memory CUDA does not know);
        // nothing is read or written through it here.
        let register = || unsafe { (self.buf_register)(ptr as *const c_void, len, 0) };
        self.call_status(&format!("cuFileBufRegister({ptr:#x}, {len} bytes)"), register, Some(cuda))
    }

    pub fn buf_deregister(&self, ptr: u64, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: as in buf_register: an address cuFile looks up in its own
        // table (an error status when it is not registered).
        let deregister = || unsafe { (self.buf_deregister)(ptr as *const c_void) };
        self.call_status(&format!("cuFileBufDeregister({ptr:#x})"), deregister, Some(cuda))
    }

    /// `cuFileHandleRegister` for a Linux fd.
    pub fn handle_register(&self, fd: c_int, cuda: &CudaApi) -> Result<CuFileHandle, GdsError> {
        let mut descr = CuFileDescr {
            type_: CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: CuFileDescrHandle { fd },
            fs_ops: std::ptr::null(),
        };
        let mut handle: CuFileHandle = std::ptr::null_mut();
        // SAFETY: both pointers are to live locals of the laid-out types
        // cufile.h declares; cuFile copies the descriptor.
        let register = || unsafe { (self.handle_register)(&mut handle, &mut descr) };
        self.call_status(&format!("cuFileHandleRegister(fd {fd})"), register, Some(cuda))?;
        Ok(handle)
    }

    /// `cuFileHandleDeregister`.
    ///
    /// # Safety
    /// `handle` must come from [`CuFileApi::handle_register`] and not have
    /// been deregistered yet, and no I/O may be using it.
    pub unsafe fn handle_deregister(&self, handle: CuFileHandle) {
        // SAFETY: the caller vouches for the handle (see the contract).
        unsafe { (self.handle_deregister)(handle) }
    }

    /// `cuFileRead`/`cuFileWrite`: returns what the call returned and the
    /// errno it left (the errno matters only for a return of -1).
    ///
    /// # Safety
    /// `base + buf_offset .. + len` must be device memory that stays valid
    /// for the call, and `handle` a registered file handle.
    pub unsafe fn io(
        &self,
        write: bool,
        handle: CuFileHandle,
        base: u64,
        len: usize,
        file_offset: i64,
        buf_offset: i64,
    ) -> (isize, i32) {
        clear_errno();
        let ret = if write {
            // SAFETY: see the function's contract.
            unsafe { (self.write)(handle, base as *const c_void, len, file_offset, buf_offset) }
        } else {
            // SAFETY: see the function's contract.
            unsafe { (self.read)(handle, base as *mut c_void, len, file_offset, buf_offset) }
        };
        (ret, errno())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cufile_status_text_names_code_cuda_error_and_errno() {
        let s = status_error("cuFileDriverOpen", CuFileStatus { err: 5010, cu_err: 0 }, libc::ENOENT, None).to_string();
        assert!(s.contains("CU_FILE_NVFS_DRIVER_ERROR (5010)"), "{s}");
        assert!(s.contains("errno 2"), "{s}");
        let e = status_error("cuFileBufRegister", CuFileStatus { err: 5011, cu_err: 201 }, 0, None);
        let s = e.to_string();
        assert!(s.contains("CU_FILE_CUDA_DRIVER_ERROR") && s.contains("CUresult 201"), "{s}");
        assert!(!s.contains("errno"), "{s}");
        assert!(matches!(e, GdsError::CuFile { code: 5011, cuda: Some(CudaStatus { code: 201, .. }), .. }));
        // A CUDA status is named only when cuFile reports one.
        let e = status_error("cuFileRead", CuFileStatus { err: 5030, cu_err: 0 }, 0, None);
        assert!(matches!(e, GdsError::CuFile { cuda: None, errno: None, .. }), "{e:?}");
    }

    #[test]
    fn layouts_match_cufile_h() {
        // The facts of cufile.h on x86_64/aarch64 Linux (also asserted at compile time).
        assert_eq!((std::mem::size_of::<CuFileStatus>(), std::mem::align_of::<CuFileStatus>()), (8, 4));
        assert_eq!((std::mem::size_of::<CuFileDescr>(), std::mem::align_of::<CuFileDescr>()), (24, 8));
        assert_eq!(std::mem::offset_of!(CuFileDescr, handle), 8);
        assert_eq!(std::mem::offset_of!(CuFileDescr, fs_ops), 16);
    }
}
