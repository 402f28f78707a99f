//! The handful of CUDA driver and cuFile entry points GDS needs, resolved by
//! hand from the loaded libraries (see [`super::dl`]), with names for their
//! status codes; a failed call is a [`GdsError`].
//!
//! Return codes are read as plain integers, never as Rust enums: a library
//! newer than cudarc's bindings may return a code those enums lack, and an
//! unknown discriminant in a Rust enum is undefined behaviour. The structure
//! layouts come from cudarc (`CUfileDescr_t`); the status pair is the
//! two-`int` `CUfileError_t` of `cufile.h`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::dl::{function, Library};
use super::error::{CudaStatus, GdsError, GdsLibrary};

/// `CUcontext`.
pub(crate) type CuContext = *mut c_void;
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

/// `CU_FILE_SUCCESS`.
pub(crate) const CU_FILE_SUCCESS: c_int = 0;
/// `CU_FILE_CUDA_DRIVER_ERROR`.
const CU_FILE_CUDA_DRIVER_ERROR: c_int = 5011;
/// `CU_FILE_DRIVER_ALREADY_OPEN`.
const CU_FILE_DRIVER_ALREADY_OPEN: c_int = 5026;
/// cuFile op errors are numbered above this (`CUFILEOP_BASE_ERR`).
pub(crate) const CUFILEOP_BASE_ERR: i64 = 5000;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: c_int = 0;

/// Name and meaning of a `CUfileOpError` value (cufile.h of CUDA 13; codes
/// below 5035 are the same in every release).
pub(crate) fn cufile_op_error_name(code: i64) -> (&'static str, &'static str) {
    match code {
        0 => ("CU_FILE_SUCCESS", "success"),
        5001 => ("CU_FILE_DRIVER_NOT_INITIALIZED", "the cuFile driver is not initialized"),
        5002 => ("CU_FILE_DRIVER_INVALID_PROPS", "invalid driver property"),
        5003 => ("CU_FILE_DRIVER_UNSUPPORTED_LIMIT", "driver property out of range"),
        5004 => ("CU_FILE_DRIVER_VERSION_MISMATCH", "nvidia-fs driver version mismatch"),
        5005 => ("CU_FILE_DRIVER_VERSION_READ_ERROR", "nvidia-fs driver version read error"),
        5006 => ("CU_FILE_DRIVER_CLOSING", "the cuFile driver is shutting down"),
        5007 => ("CU_FILE_PLATFORM_NOT_SUPPORTED", "GPUDirect Storage is not supported on this platform"),
        5008 => ("CU_FILE_IO_NOT_SUPPORTED", "GPUDirect Storage is not supported on this file"),
        5009 => ("CU_FILE_DEVICE_NOT_SUPPORTED", "GPUDirect Storage is not supported on this GPU"),
        5010 => ("CU_FILE_NVFS_DRIVER_ERROR", "nvidia-fs driver ioctl error"),
        5011 => ("CU_FILE_CUDA_DRIVER_ERROR", "CUDA driver API error"),
        5012 => ("CU_FILE_CUDA_POINTER_INVALID", "invalid device pointer"),
        5013 => ("CU_FILE_CUDA_MEMORY_TYPE_INVALID", "invalid pointer memory type"),
        5014 => ("CU_FILE_CUDA_POINTER_RANGE_ERROR", "pointer range exceeds the allocated address range"),
        5015 => ("CU_FILE_CUDA_CONTEXT_MISMATCH", "CUDA context mismatch"),
        5016 => ("CU_FILE_INVALID_MAPPING_SIZE", "access beyond the maximum pinned size"),
        5017 => ("CU_FILE_INVALID_MAPPING_RANGE", "access beyond the mapped size"),
        5018 => ("CU_FILE_INVALID_FILE_TYPE", "unsupported file type"),
        5019 => ("CU_FILE_INVALID_FILE_OPEN_FLAG", "unsupported file open flags"),
        5020 => ("CU_FILE_DIO_NOT_SET", "the file is not opened with O_DIRECT"),
        5022 => ("CU_FILE_INVALID_VALUE", "invalid argument"),
        5023 => ("CU_FILE_MEMORY_ALREADY_REGISTERED", "device memory already registered"),
        5024 => ("CU_FILE_MEMORY_NOT_REGISTERED", "device memory not registered"),
        5025 => ("CU_FILE_PERMISSION_DENIED", "driver or file access denied"),
        5026 => ("CU_FILE_DRIVER_ALREADY_OPEN", "the cuFile driver is already open"),
        5027 => ("CU_FILE_HANDLE_NOT_REGISTERED", "file handle not registered"),
        5028 => ("CU_FILE_HANDLE_ALREADY_REGISTERED", "file handle already registered"),
        5029 => ("CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"),
        5030 => ("CU_FILE_INTERNAL_ERROR", "cuFile internal error"),
        5031 => ("CU_FILE_GETNEWFD_FAILED", "failed to obtain a new file descriptor"),
        5033 => ("CU_FILE_NVFS_SETUP_ERROR", "nvidia-fs driver setup error"),
        5034 => ("CU_FILE_IO_DISABLED", "GPUDirect Storage disabled by configuration for this file"),
        5035 => ("CU_FILE_BATCH_SUBMIT_FAILED", "batch submission failed"),
        5036 => ("CU_FILE_GPU_MEMORY_PINNING_FAILED", "pinning GPU memory failed"),
        5037 => ("CU_FILE_BATCH_FULL", "batch queue full"),
        5038 => ("CU_FILE_ASYNC_NOT_SUPPORTED", "asynchronous I/O not supported"),
        5039 => ("CU_FILE_INTERNAL_BATCH_SETUP_ERROR", "internal batch setup error"),
        5040 => ("CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", "internal batch submit error"),
        5041 => ("CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR", "internal batch status error"),
        5042 => ("CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", "internal batch cancel error"),
        5043 => ("CU_FILE_NOMEM_ERROR", "out of memory"),
        5044 => ("CU_FILE_IO_ERROR", "I/O error"),
        5045 => ("CU_FILE_INTERNAL_BUF_REGISTER_ERROR", "internal buffer registration error"),
        5046 => ("CU_FILE_HASH_OPR_ERROR", "internal hash table error"),
        5047 => ("CU_FILE_INVALID_CONTEXT_ERROR", "invalid CUDA context"),
        5048 => ("CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", "nvidia-fs internal driver error"),
        5049 => ("CU_FILE_BATCH_NOCOMPAT_ERROR", "batch I/O unavailable in compatibility mode"),
        _ => ("CU_FILE_UNKNOWN_ERROR", "unknown cuFile error"),
    }
}

/// The errno that best describes a cuFile op error, for [`crate::TransferError`].
pub(crate) fn cufile_op_errno(code: i64) -> i32 {
    match code {
        5012 | 5013 | 5014 | 5016 | 5017 | 5018 | 5019 | 5020 | 5022 => libc::EINVAL,
        5025 => libc::EACCES,
        5007 | 5008 | 5009 | 5034 | 5038 | 5049 => libc::EOPNOTSUPP,
        5036 | 5043 => libc::ENOMEM,
        5029 => libc::ENODEV,
        _ => libc::EIO,
    }
}

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

type FnInit = unsafe extern "C" fn(c_uint) -> c_int;
type FnIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type FnDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type FnCtxRetain = unsafe extern "C" fn(*mut CuContext, c_int) -> c_int;
type FnCtxRelease = unsafe extern "C" fn(c_int) -> c_int;
type FnCtxSet = unsafe extern "C" fn(CuContext) -> c_int;
type FnCtxGet = unsafe extern "C" fn(*mut CuContext) -> c_int;
type FnPtrAttr = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;
type FnErrText = unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int;
type FnDeviceName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;

/// The CUDA driver API (libcuda), as far as GDS uses it.
pub(crate) struct CudaApi {
    /// Kept so the table's owner is explicit (libraries are never unloaded).
    _lib: Library,
    pub path: String,
    init: FnInit,
    driver_get_version: Option<FnIntOut>,
    device_get_count: FnIntOut,
    device_get: FnDeviceGet,
    device_get_name: Option<FnDeviceName>,
    primary_ctx_retain: FnCtxRetain,
    primary_ctx_release: FnCtxRelease,
    ctx_set_current: FnCtxSet,
    ctx_get_current: FnCtxGet,
    pointer_get_attribute: FnPtrAttr,
    get_error_name: Option<FnErrText>,
    get_error_string: Option<FnErrText>,
}

/// The first of `names` that `lib` (`library`, loaded from `path`) has.
fn need<F: Copy>(lib: &Library, library: GdsLibrary, path: &str, names: &[&str]) -> Result<F, GdsError> {
    for n in names {
        // SAFETY: each caller pairs the symbol names with their C signature F.
        if let Some(f) = unsafe { function::<F>(lib, n) } {
            return Ok(f);
        }
    }
    Err(GdsError::MissingSymbol {
        library,
        path: path.to_string(),
        symbols: names.iter().map(|n| n.to_string()).collect(),
        other: None,
    })
}

impl CudaApi {
    pub fn load(lib: Library) -> Result<CudaApi, GdsError> {
        let path = lib.path_of("cuInit").unwrap_or_else(|| lib.name.clone());
        let (p, cuda) = (path.as_str(), GdsLibrary::Cuda);
        // SAFETY (every `function` call): the type aliases above are the C
        // signatures of these driver API entry points (cuda.h).
        Ok(CudaApi {
            init: need(&lib, cuda, p, &["cuInit"])?,
            driver_get_version: unsafe { function(&lib, "cuDriverGetVersion") },
            device_get_count: need(&lib, cuda, p, &["cuDeviceGetCount"])?,
            device_get: need(&lib, cuda, p, &["cuDeviceGet"])?,
            device_get_name: unsafe { function(&lib, "cuDeviceGetName") },
            primary_ctx_retain: need(&lib, cuda, p, &["cuDevicePrimaryCtxRetain"])?,
            primary_ctx_release: need(&lib, cuda, p, &["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"])?,
            ctx_set_current: need(&lib, cuda, p, &["cuCtxSetCurrent"])?,
            ctx_get_current: need(&lib, cuda, p, &["cuCtxGetCurrent"])?,
            pointer_get_attribute: need(&lib, cuda, p, &["cuPointerGetAttribute"])?,
            get_error_name: unsafe { function(&lib, "cuGetErrorName") },
            get_error_string: unsafe { function(&lib, "cuGetErrorString") },
            path,
            _lib: lib,
        })
    }

    /// `code` with its name and text ("CUDA_ERROR_NO_DEVICE (100): no
    /// CUDA-capable device is detected"), as far as the driver says.
    pub fn status(&self, code: c_int) -> CudaStatus {
        let text = |f: Option<FnErrText>| -> Option<String> {
            let f = f?;
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: cuGetErrorName/String write a static string pointer or fail.
            if unsafe { f(code, &mut p) } != CUDA_SUCCESS || p.is_null() {
                return None;
            }
            // SAFETY: the driver returns a static NUL-terminated string.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        CudaStatus { code, name: text(self.get_error_name), text: text(self.get_error_string) }
    }

    fn check(&self, call: impl FnOnce() -> String, code: c_int) -> Result<(), GdsError> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(GdsError::Cuda { call: call(), status: self.status(code), environment: None })
        }
    }

    pub fn init(&self) -> Result<(), GdsError> {
        // SAFETY: cuInit(0) has no preconditions.
        self.check(|| "cuInit".into(), unsafe { (self.init)(0) })
    }

    /// The driver's CUDA version as "13.0", when it says.
    pub fn driver_version(&self) -> Option<String> {
        let f = self.driver_get_version?;
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        (unsafe { f(&mut v) } == CUDA_SUCCESS).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    pub fn device_count(&self) -> Result<i32, GdsError> {
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        self.check(|| "cuDeviceGetCount".into(), unsafe { (self.device_get_count)(&mut n) })?;
        Ok(n)
    }

    pub fn device_name(&self, ordinal: i32) -> Option<String> {
        let f = self.device_get_name?;
        let dev = self.device(ordinal).ok()?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and the driver NUL-terminates.
        if unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, dev) } != CUDA_SUCCESS {
            return None;
        }
        // SAFETY: NUL-terminated by the driver (and the array is zeroed).
        Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    fn device(&self, ordinal: i32) -> Result<c_int, GdsError> {
        let mut dev: c_int = 0;
        // SAFETY: writes one CUdevice.
        self.check(|| format!("cuDeviceGet({ordinal})"), unsafe { (self.device_get)(&mut dev, ordinal) })?;
        Ok(dev)
    }

    /// Retains the primary context of device `ordinal` (the context torch
    /// and the CUDA runtime use). Pair with [`CudaApi::release_primary`].
    pub fn retain_primary(&self, ordinal: i32) -> Result<CuContext, GdsError> {
        let dev = self.device(ordinal)?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: writes one CUcontext for a valid device.
        self.check(|| format!("cuDevicePrimaryCtxRetain(device {ordinal})"), unsafe {
            (self.primary_ctx_retain)(&mut ctx, dev)
        })?;
        Ok(ctx)
    }

    pub fn release_primary(&self, ordinal: i32) -> Result<(), GdsError> {
        let dev = self.device(ordinal)?;
        // SAFETY: releases one retain taken by retain_primary.
        self.check(|| format!("cuDevicePrimaryCtxRelease(device {ordinal})"), unsafe {
            (self.primary_ctx_release)(dev)
        })
    }

    pub fn current_context(&self) -> Result<CuContext, GdsError> {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: writes one CUcontext (NULL when none is current).
        self.check(|| "cuCtxGetCurrent".into(), unsafe { (self.ctx_get_current)(&mut ctx) })?;
        Ok(ctx)
    }

    pub fn set_current(&self, ctx: CuContext) -> Result<(), GdsError> {
        // SAFETY: ctx is NULL or a context this process retained.
        self.check(|| "cuCtxSetCurrent".into(), unsafe { (self.ctx_set_current)(ctx) })
    }

    /// The ordinal of the device that owns the memory at `ptr`.
    pub fn pointer_device(&self, ptr: u64) -> Result<i32, GdsError> {
        let mut ordinal: c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one int.
        let rc = unsafe {
            (self.pointer_get_attribute)(
                &mut ordinal as *mut c_int as *mut c_void,
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        self.check(|| format!("cuPointerGetAttribute(DEVICE_ORDINAL, {ptr:#x})"), rc)
            .map_err(|e| GdsError::UnknownMemory { ptr, source: Box::new(e) })?;
        Ok(ordinal)
    }
}

type FnStatus = unsafe extern "C" fn() -> CuFileStatus;
type FnSetSize = unsafe extern "C" fn(usize) -> CuFileStatus;
type FnBufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> CuFileStatus;
type FnBufDeregister = unsafe extern "C" fn(*const c_void) -> CuFileStatus;
type FnHandleRegister =
    unsafe extern "C" fn(*mut CuFileHandle, *mut cudarc::cufile::sys::CUfileDescr_t) -> CuFileStatus;
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
        knobs: &crate::gds::config::DriverKnobs,
        log_dir: &std::path::Path,
        cuda: &CudaApi,
    ) -> Result<bool, GdsError> {
        let Some(api) = self.parameters else { return Ok(false) };
        let sizes = [
            (CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH, "max_io_queue_depth", knobs.queue_depth),
            (CUFILE_PARAM_EXECUTION_MAX_IO_THREADS, "max_io_threads", knobs.intra_op_parallelism),
            (CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM, "max_request_parallelism", knobs.intra_op_parallelism),
            (
                CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB,
                "min_io_threshold_size_kb",
                crate::gds::config::MIN_IO_THRESHOLD_SIZE_KB,
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
        use cudarc::cufile::sys::{CUfileDescr_t, CUfileDescr_t__bindgen_ty_1, CUfileFileHandleType};
        let mut descr = CUfileDescr_t {
            type_: CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileDescr_t__bindgen_ty_1 { fd },
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
        let (name, _) = cufile_op_error_name(5999);
        assert_eq!(name, "CU_FILE_UNKNOWN_ERROR");
        assert_eq!(cufile_op_errno(5020), libc::EINVAL);
        assert_eq!(cufile_op_errno(5030), libc::EIO);
    }

    #[test]
    fn status_layout_matches_cufile_h() {
        // CUfileError_t is two C enums (ints): 8 bytes, returned in registers.
        assert_eq!(std::mem::size_of::<CuFileStatus>(), std::mem::size_of::<cudarc::cufile::sys::CUfileError_t>());
        assert_eq!(std::mem::align_of::<CuFileStatus>(), std::mem::align_of::<cudarc::cufile::sys::CUfileError_t>());
    }
}
