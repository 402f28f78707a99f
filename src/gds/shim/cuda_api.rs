//! The CUDA driver API entry points GDS needs (libcuda), resolved by hand
//! from the loaded library (see [`crate::gds::shim::dl`]); a failed call is a
//! [`GdsError::Cuda`] naming the call and the driver's status. Status codes
//! are read as plain integers (`CUresult`), never as Rust enums.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::gds::shim::dl::{function, Library};
use crate::gds::error::{CudaStatus, GdsError, GdsLibrary};
use crate::gds::shim::symbols::need;

/// `CUcontext`.
pub(crate) type CuContext = *mut c_void;

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: c_int = 0;

// The entry points' C declarations (cuda.h), as Rust fn types. `CUresult`,
// `CUdevice` and the enums are C ints; `CUdeviceptr` is 64 bits on 64-bit
// Linux; `CUcontext` is a pointer.

/// `CUresult cuInit(unsigned int Flags)`.
type FnInit = unsafe extern "C" fn(c_uint) -> c_int;
/// `CUresult cuDriverGetVersion(int *driverVersion)`,
/// `CUresult cuDeviceGetCount(int *count)`.
type FnIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
type FnDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
/// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
type FnCtxRetain = unsafe extern "C" fn(*mut CuContext, c_int) -> c_int;
/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)` (and its `_v2`).
type FnCtxRelease = unsafe extern "C" fn(c_int) -> c_int;
/// `CUresult cuCtxSetCurrent(CUcontext ctx)`.
type FnCtxSet = unsafe extern "C" fn(CuContext) -> c_int;
/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`.
type FnCtxGet = unsafe extern "C" fn(*mut CuContext) -> c_int;
/// `CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)`.
type FnPtrAttr = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;
/// `CUresult cuGetErrorName(CUresult error, const char **pStr)`, and the
/// same for `cuGetErrorString`.
type FnErrText = unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int;
/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
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

impl CudaApi {
    pub fn load(lib: Library) -> Result<CudaApi, GdsError> {
        let path = lib.path_of("cuInit").unwrap_or_else(|| lib.name.clone());
        let (p, cuda) = (path.as_str(), GdsLibrary::Cuda);
        // Each field's fn type is the C declaration of the symbols it is
        // resolved from: see the type aliases above.
        Ok(CudaApi {
            // SAFETY: FnInit is cuInit's declaration.
            init: unsafe { need(&lib, cuda, p, &["cuInit"]) }?,
            // SAFETY: FnIntOut is cuDriverGetVersion's declaration.
            driver_get_version: unsafe { function(&lib, "cuDriverGetVersion") },
            // SAFETY: FnIntOut is cuDeviceGetCount's declaration.
            device_get_count: unsafe { need(&lib, cuda, p, &["cuDeviceGetCount"]) }?,
            // SAFETY: FnDeviceGet is cuDeviceGet's declaration.
            device_get: unsafe { need(&lib, cuda, p, &["cuDeviceGet"]) }?,
            // SAFETY: FnDeviceName is cuDeviceGetName's declaration.
            device_get_name: unsafe { function(&lib, "cuDeviceGetName") },
            // SAFETY: FnCtxRetain is cuDevicePrimaryCtxRetain's declaration.
            primary_ctx_retain: unsafe { need(&lib, cuda, p, &["cuDevicePrimaryCtxRetain"]) }?,
            // SAFETY: FnCtxRelease is the declaration of both names (cuda.h maps one to the other).
            primary_ctx_release: unsafe {
                need(&lib, cuda, p, &["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"])
            }?,
            // SAFETY: FnCtxSet is cuCtxSetCurrent's declaration.
            ctx_set_current: unsafe { need(&lib, cuda, p, &["cuCtxSetCurrent"]) }?,
            // SAFETY: FnCtxGet is cuCtxGetCurrent's declaration.
            ctx_get_current: unsafe { need(&lib, cuda, p, &["cuCtxGetCurrent"]) }?,
            // SAFETY: FnPtrAttr is cuPointerGetAttribute's declaration.
            pointer_get_attribute: unsafe { need(&lib, cuda, p, &["cuPointerGetAttribute"]) }?,
            // SAFETY: FnErrText is cuGetErrorName's declaration.
            get_error_name: unsafe { function(&lib, "cuGetErrorName") },
            // SAFETY: FnErrText is cuGetErrorString's declaration.
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
