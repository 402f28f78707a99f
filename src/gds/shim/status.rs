//! cuFile's status codes (`CUfileOpError`, cufile.h) as plain integers:
//! the few the calls test for, the name and meaning of each, and the errno
//! that best stands for it in a [`crate::TransferError`].
//!
//! Codes are read as integers, never as Rust enums: a library newer than
//! this table may return a code it lacks, and an unknown discriminant in a
//! Rust enum is undefined behaviour.

use std::ffi::c_int;

/// `CU_FILE_SUCCESS`.
pub(crate) const CU_FILE_SUCCESS: c_int = 0;
/// `CU_FILE_CUDA_DRIVER_ERROR`.
pub(crate) const CU_FILE_CUDA_DRIVER_ERROR: c_int = 5011;
/// `CU_FILE_DRIVER_ALREADY_OPEN`.
pub(crate) const CU_FILE_DRIVER_ALREADY_OPEN: c_int = 5026;
/// cuFile op errors are numbered above this (`CUFILEOP_BASE_ERR`).
pub(crate) const CUFILEOP_BASE_ERR: i64 = 5000;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_names_and_errnos() {
        let (name, _) = cufile_op_error_name(5999);
        assert_eq!(name, "CU_FILE_UNKNOWN_ERROR");
        assert_eq!(cufile_op_error_name(5010).0, "CU_FILE_NVFS_DRIVER_ERROR");
        assert_eq!(cufile_op_errno(5020), libc::EINVAL);
        assert_eq!(cufile_op_errno(5030), libc::EIO);
    }
}
