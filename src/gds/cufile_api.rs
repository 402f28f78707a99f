//! The libcufile entry points GDS needs, resolved by hand from the loaded
//! library (see [`super::dl`]); a failed call is a [`GdsError::CuFile`]
//! with the status, the CUDA error inside it and the errno it left.
//!
//! Return codes are read as plain integers, never as Rust enums (see
//! [`super::status`]). The two structures passed across are declared here
//! from `cufile.h`, with their size and field offsets checked at compile
//! time: the status pair `CUfileError_t` ([`CuFileStatus`]) and the file
//! descriptor `CUfileDescr_t` ([`CuFileDescr`]).

use std::ffi::{c_int, c_void};

use super::config::{DriverSettings, MIN_IO_THRESHOLD_SIZE_KB};
use super::cuda_api::CudaApi;
use super::dl::{function, Library};
use super::error::{CudaStatus, GdsError, GdsLibrary};
use super::status::{CU_FILE_CUDA_DRIVER_ERROR, CU_FILE_DRIVER_ALREADY_OPEN, CU_FILE_SUCCESS};
use super::symbols::need;

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
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno to 0, so that a value found after a call
/// was set by that call.
pub(crate) fn clear_errno() {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = 0 };
}

type FnStatus = unsafe extern "C" fn() -> CuFileStatus;
type FnSetSize = unsafe extern "C" fn(usize) -> CuFileStatus;
type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileStatus;
type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> CuFileStatus;
type FnHandleRegister = unsafe extern "C" fn(*mut CuFileHandle, *mut CuFileDescr) -> CuFileStatus;
type FnHandleDeregister = unsafe extern "C" fn(CuFileHandle);
type FnRead = unsafe extern "C" fn(CuFileHandle, *mut c_void, usize, libc::off_t, libc::off_t) -> isize;
type FnWrite = unsafe extern "C" fn(CuFileHandle, *const c_void, usize, libc::off_t, libc::off_t) -> isize;
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> CuFileStatus;
type FnSetParamSize = unsafe extern "C" fn(c_int, usize) -> CuFileStatus;
type FnSetParamBool = unsafe extern "C" fn(c_int, bool) -> CuFileStatus;
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
        Ok(CuFileApi {
            driver_open: need(&lib, cufile, p, &["cuFileDriverOpen"])?,
            // cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 where it exists.
            driver_close: need(&lib, cufile, p, &["cuFileDriverClose_v2", "cuFileDriverClose"])?,
            set_max_direct_io_size: need(&lib, cufile, p, &["cuFileDriverSetMaxDirectIOSize"])?,
            buf_register: need(&lib, cufile, p, &["cuFileBufRegister"])?,
            buf_deregister: need(&lib, cufile, p, &["cuFileBufDeregister"])?,
            handle_register: need(&lib, cufile, p, &["cuFileHandleRegister"])?,
            handle_deregister: need(&lib, cufile, p, &["cuFileHandleDeregister"])?,
            read: need(&lib, cufile, p, &["cuFileRead"])?,
            write: need(&lib, cufile, p, &["cuFileWrite"])?,
            // SAFETY: `CUfileError_t cuFileGetVersion(int *version)`.
            get_version: unsafe { function(&lib, "cuFileGetVersion") },
            // SAFETY: cufile.h's `cuFileSetParameterSizeT(param, size_t)`,
            // `cuFileSetParameterBool(param, bool)` and
            // `cuFileSetParameterString(param, const char*)`; enums are ints.
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
        // SAFETY: writes one int.
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
            // SAFETY: an enum value and a size.
            self.call_status(&call, || unsafe { (api.size)(param, value) }, Some(cuda))?;
        }
        let parallel_io = CUFILE_PARAM_EXECUTION_PARALLEL_IO;
        // SAFETY: an enum value and a bool.
        let set_parallel_io = || unsafe { (api.boolean)(parallel_io, true) };
        self.call_status("cuFileSetParameterBool(parallel_io, true)", set_parallel_io, Some(cuda))?;
        let dir = std::ffi::CString::new(log_dir.as_os_str().as_encoded_bytes()).map_err(|_| GdsError::Config {
            action: "passing the cuFile log directory (it contains a NUL byte)",
            path: log_dir.to_path_buf(),
            source: std::sync::Arc::new(std::io::Error::from_raw_os_error(libc::EINVAL)),
        })?;
        // SAFETY: an enum value and a NUL-terminated string that outlives the call.
        self.call_status(
            &format!("cuFileSetParameterString(log_dir, {})", log_dir.display()),
            || unsafe { (api.string)(CUFILE_PARAM_LOG_DIR, dir.as_ptr()) },
            Some(cuda),
        )?;
        Ok(true)
    }

    /// `cuFileDriverOpen`. `Ok(true)`: opened; `Ok(false)`: someone else in
    /// the process (torch, say) had it open already (`CU_FILE_DRIVER_ALREADY_OPEN`).
    /// Never call it without a working libcuda and a device: libcufile 1.17
    /// spins forever in it when libcuda is missing.
    pub fn driver_open(&self, cuda: &CudaApi) -> Result<bool, GdsError> {
        clear_errno();
        // SAFETY: no arguments; the caller checked libcuda and the devices.
        let st = unsafe { (self.driver_open)() };
        let e = errno();
        match st.err {
            CU_FILE_SUCCESS => Ok(true),
            CU_FILE_DRIVER_ALREADY_OPEN => Ok(false),
            _ => Err(status_error("cuFileDriverOpen", st, e, Some(cuda))),
        }
    }

    pub fn driver_close(&self, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: no arguments.
        self.call_status("cuFileDriverClose", || unsafe { (self.driver_close)() }, Some(cuda))
    }

    pub fn set_max_direct_io_size_kb(&self, kb: usize, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: a plain size argument.
        self.call_status(
            &format!("cuFileDriverSetMaxDirectIOSize({kb} KiB)"),
            || unsafe { (self.set_max_direct_io_size)(kb) },
            Some(cuda),
        )
    }

    pub fn buf_register(&self, ptr: u64, len: usize, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: cuFile checks the pointer against the CUDA driver itself.
        self.call_status(
            &format!("cuFileBufRegister({ptr:#x}, {len} bytes)"),
            || unsafe { (self.buf_register)(ptr as *const c_void, len, 0) },
            Some(cuda),
        )
    }

    pub fn buf_deregister(&self, ptr: u64, cuda: &CudaApi) -> Result<(), GdsError> {
        // SAFETY: as above.
        self.call_status(
            &format!("cuFileBufDeregister({ptr:#x})"),
            || unsafe { (self.buf_deregister)(ptr as *const c_void) },
            Some(cuda),
        )
    }

    /// `cuFileHandleRegister` for a Linux fd.
    pub fn handle_register(&self, fd: c_int, cuda: &CudaApi) -> Result<CuFileHandle, GdsError> {
        let mut descr = CuFileDescr {
            type_: CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: CuFileDescrHandle { fd },
            fs_ops: std::ptr::null(),
        };
        let mut handle: CuFileHandle = std::ptr::null_mut();
        // SAFETY: both pointers are to live locals; cuFile copies the descriptor.
        self.call_status(
            &format!("cuFileHandleRegister(fd {fd})"),
            || unsafe { (self.handle_register)(&mut handle, &mut descr) },
            Some(cuda),
        )?;
        Ok(handle)
    }

    pub fn handle_deregister(&self, handle: CuFileHandle) {
        // SAFETY: a handle returned by handle_register, deregistered once.
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
