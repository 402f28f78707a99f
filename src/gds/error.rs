//! What can go wrong with GPUDirect Storage, as data: which library was not
//! found under which names, which CUDA or cuFile call failed with which
//! code, which registration rule a buffer broke.
//!
//! Every [`GdsError`] reaches callers inside [`crate::Error::Gds`]; its
//! `Display` is the whole explanation (the names tried, the codes, the
//! hints), so a message that reaches a DeepSpeed user says what to fix.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::gds::shim::dl::LoadFailure;
use crate::gds::region::Region;
use crate::gds::shim::status::cufile_op_error_name;
use crate::knobs::{CUDA_LIB_ENV, CUFILE_LIB_ENV};

/// The two libraries GPUDirect Storage loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GdsLibrary {
    /// libcufile, the GPUDirect Storage library.
    CuFile,
    /// libcuda, the NVIDIA driver's CUDA library.
    Cuda,
}

impl GdsLibrary {
    /// "libcufile" / "libcuda".
    pub fn short_name(self) -> &'static str {
        match self {
            GdsLibrary::CuFile => "libcufile",
            GdsLibrary::Cuda => "libcuda",
        }
    }

    /// The variable that, when set, names the only library tried.
    pub fn override_var(self) -> &'static str {
        match self {
            GdsLibrary::CuFile => CUFILE_LIB_ENV,
            GdsLibrary::Cuda => CUDA_LIB_ENV,
        }
    }
}

impl fmt::Display for GdsLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GdsLibrary::CuFile => "libcufile (cuFile, the GPUDirect Storage library)",
            GdsLibrary::Cuda => "libcuda (the NVIDIA driver's CUDA library)",
        })
    }
}

/// "not found: a, b; failed to load: c (why)": every name tried, those
/// that simply were not found together, any other reason next to its name.
pub(crate) fn describe_attempts(attempts: &[LoadFailure]) -> String {
    let not_found: Vec<&str> = attempts.iter().filter(|a| a.is_not_found()).map(|a| a.name.as_str()).collect();
    let other: Vec<String> =
        attempts.iter().filter(|a| !a.is_not_found()).map(|a| format!("{} ({})", a.name, a.dlerror)).collect();
    let mut parts = Vec::new();
    if !not_found.is_empty() {
        parts.push(format!("not found: {}", not_found.join(", ")));
    }
    if !other.is_empty() {
        parts.push(format!("failed to load: {}", other.join(", ")));
    }
    if parts.is_empty() {
        parts.push("no names to try".to_string());
    }
    parts.join("; ")
}

/// A library that did load, named in the error about the other one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedLibrary {
    /// Which library.
    pub library: GdsLibrary,
    /// The file it was loaded from.
    pub path: String,
    /// Its version, when it says ("1.17.0" for libcufile).
    pub version: Option<String>,
}

impl fmt::Display for LoadedLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{} {v} is at {}", self.library.short_name(), self.path),
            None => write!(f, "{} is at {}", self.library.short_name(), self.path),
        }
    }
}

/// A CUDA driver API status (`CUresult`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaStatus {
    /// The `CUresult` value.
    pub code: i32,
    /// `cuGetErrorName`'s answer ("CUDA_ERROR_NO_DEVICE"), when the driver gave one.
    pub name: Option<String>,
    /// `cuGetErrorString`'s answer, when the driver gave one.
    pub text: Option<String>,
}

impl CudaStatus {
    /// A bare code, for when no libcuda is at hand to name it.
    pub fn code_only(code: i32) -> CudaStatus {
        CudaStatus { code, name: None, text: None }
    }
}

impl fmt::Display for CudaStatus {
    /// "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name.as_deref().unwrap_or("CUDA_ERROR"), self.code)?;
        if let Some(t) = &self.text {
            write!(f, ": {t}")?;
        }
        Ok(())
    }
}

/// A GPUDirect Storage failure, or the reason it is not there.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum GdsError {
    /// A library could not be loaded under any of the names tried.
    LibraryNotFound {
        /// Which library.
        library: GdsLibrary,
        /// Every name tried, in order, with `dlerror`'s reason.
        attempts: Vec<LoadFailure>,
        /// The variable (`DEEPNVME_CUFILE_LIB` / `DEEPNVME_CUDA_LIB`) that
        /// chose the only name tried; `None` when the default names were tried.
        override_var: Option<&'static str>,
        /// The other library, when it did load.
        other: Option<LoadedLibrary>,
    },
    /// A library loaded but lacks an entry point (too old, or not the real one).
    MissingSymbol {
        /// Which library.
        library: GdsLibrary,
        /// The file it was loaded from.
        path: String,
        /// The symbol's names (any one would have done).
        symbols: Vec<String>,
        /// The other library, when it did load.
        other: Option<LoadedLibrary>,
    },
    /// A CUDA driver API call failed. A failed `cuInit` means the NVIDIA
    /// driver is not usable.
    Cuda {
        /// The call, with its arguments ("cuDeviceGet(1)").
        call: String,
        /// What it returned.
        status: CudaStatus,
        /// What was found (libraries, driver version), when known.
        environment: Option<String>,
    },
    /// The driver works but sees no CUDA device.
    NoDevice {
        /// What `cuDeviceGetCount` said.
        count: i32,
        /// What was found (libraries, driver version).
        environment: String,
    },
    /// A device ordinal beyond the devices visible.
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices are visible.
        visible: i32,
    },
    /// A cuFile call returned a status other than `CU_FILE_SUCCESS`.
    CuFile {
        /// The call, with its arguments ("cuFileBufRegister(0x7f.., 4096 bytes)").
        call: String,
        /// The `CUfileOpError` value.
        code: i32,
        /// Its name ("CU_FILE_NVFS_DRIVER_ERROR"; "CU_FILE_UNKNOWN_ERROR" for a code this build does not know).
        name: &'static str,
        /// The CUDA driver status inside it, when cuFile reports one.
        cuda: Option<CudaStatus>,
        /// The errno the call left, when it set one.
        errno: Option<i32>,
    },
    /// Opening the cuFile driver failed; `log` is what cuFile logged meanwhile.
    DriverOpen {
        /// Why it failed.
        source: Box<GdsError>,
        /// cuFile's log lines from the attempt.
        log: Vec<String>,
    },
    /// `cuFileDriverSetMaxDirectIOSize` refused the handle's block size.
    DirectIoSize {
        /// Why it was refused.
        source: Box<GdsError>,
        /// The block size asked for.
        block_size: usize,
    },
    /// Writing the private cuFile config failed.
    Config {
        /// What was being done ("creating", "writing", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        source: Arc<io::Error>,
    },
    /// A null pointer, a zero length, or a range that wraps the address space.
    InvalidBuffer {
        /// The buffer's address.
        ptr: u64,
        /// Its length.
        len: usize,
    },
    /// The buffer overlaps a registered one other than exactly.
    Overlap {
        /// The buffer's address.
        ptr: u64,
        /// Its length.
        len: usize,
        /// The registered buffer it overlaps.
        registered: Region,
    },
    /// Deregistering a pointer inside a registered buffer, not its base.
    NotBase {
        /// The pointer given.
        ptr: u64,
        /// The registered buffer's base.
        base: u64,
        /// How far into it `ptr` lies.
        offset: u64,
    },
    /// CUDA does not know the memory at `ptr`.
    UnknownMemory {
        /// The pointer given.
        ptr: u64,
        /// What CUDA said.
        source: Box<GdsError>,
    },
    /// GPUDirect Storage is not there for this request (a reason for a human).
    Unavailable(String),
    /// Several independent failures (both libraries missing; several steps of a close).
    Several(Vec<GdsError>),
    /// A caught panic inside deepnvme::gds (a bug).
    Internal(String),
}

impl GdsError {
    /// The error for a failed cuFile call: `status` and `cu_err` as it
    /// returned them, `errno` as it left it (0: none).
    pub(crate) fn cufile(call: impl Into<String>, code: i32, cuda: Option<CudaStatus>, errno: i32) -> GdsError {
        let (name, _) = cufile_op_error_name(code as i64);
        GdsError::CuFile { call: call.into(), code, name, cuda, errno: (errno != 0).then_some(errno) }
    }

    /// Adds what was found of the other library to a library error.
    pub(crate) fn with_other_library(mut self, loaded: LoadedLibrary) -> GdsError {
        if let GdsError::LibraryNotFound { other, .. } | GdsError::MissingSymbol { other, .. } = &mut self {
            *other = Some(loaded);
        }
        self
    }

    /// Adds what was found (libraries, driver) to a CUDA driver error.
    pub(crate) fn with_environment(mut self, found: &str) -> GdsError {
        if let GdsError::Cuda { environment, .. } = &mut self {
            *environment = Some(found.to_string());
        }
        self
    }
}

impl fmt::Display for GdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let other_note = |f: &mut fmt::Formatter<'_>, other: &Option<LoadedLibrary>| match other {
            Some(o) => write!(f, " ({o})"),
            None => Ok(()),
        };
        match self {
            GdsError::LibraryNotFound { library, attempts, override_var, other } => {
                write!(f, "{library} was not found ({}); ", describe_attempts(attempts))?;
                match (override_var, library) {
                    (Some(var), _) => write!(f, "{var} is set, so only that was tried")?,
                    (None, GdsLibrary::CuFile) => write!(
                        f,
                        "install cuFile (the CUDA toolkit's libcufile, or `pip install nvidia-cufile-cu12`) and make \
                         it findable through LD_LIBRARY_PATH, or set {}=/path/to/libcufile.so.0",
                        library.override_var()
                    )?,
                    (None, GdsLibrary::Cuda) => {
                        f.write_str("is the NVIDIA driver installed, and its libcuda.so.1 visible in this container?")?
                    }
                }
                other_note(f, other)
            }
            GdsError::MissingSymbol { library: _, path, symbols, other } => {
                write!(
                    f,
                    "{path} lacks the symbol {} (the library is too old or not the real one)",
                    symbols.join(" / ")
                )?;
                other_note(f, other)
            }
            GdsError::Cuda { call, status, environment } => {
                if call == "cuInit" {
                    f.write_str("the NVIDIA driver is not usable: ")?;
                }
                write!(f, "{call} failed: {status}")?;
                match environment {
                    Some(e) => write!(f, " ({e})"),
                    None => Ok(()),
                }
            }
            GdsError::NoDevice { count, environment } => write!(
                f,
                "no CUDA device is visible (cuDeviceGetCount = {count}; check CUDA_VISIBLE_DEVICES) ({environment})"
            ),
            GdsError::NoSuchDevice { ordinal, visible } => {
                write!(f, "CUDA device {ordinal} does not exist ({visible} visible)")
            }
            GdsError::CuFile { call, code, name, cuda, errno } => {
                let (_, meaning) = cufile_op_error_name(*code as i64);
                write!(f, "{call} failed: {name} ({code}): {meaning}")?;
                match cuda {
                    Some(s) if s.name.is_none() && s.text.is_none() => write!(f, "; CUresult {}", s.code)?,
                    Some(s) => write!(f, "; CUDA: {s}")?,
                    None => {}
                }
                if let Some(e) = errno {
                    write!(f, "; errno {e} ({})", crate::error::errno_text(*e))?;
                }
                Ok(())
            }
            GdsError::DriverOpen { source, log } => {
                write!(f, "{source}")?;
                if !log.is_empty() {
                    write!(f, "; cuFile log: {}", log.join(" | "))?;
                }
                Ok(())
            }
            GdsError::DirectIoSize { source, block_size } => write!(f, "{source} (block_size = {block_size} bytes)"),
            GdsError::Config { action, path, source } => write!(f, "{action} {} failed: {source}", path.display()),
            GdsError::InvalidBuffer { ptr, len } => {
                if *ptr == 0 {
                    f.write_str("a null device pointer cannot be registered")
                } else if *len == 0 {
                    write!(f, "registering {ptr:#x} with length 0")
                } else {
                    write!(f, "{ptr:#x} + {len} bytes wraps the address space")
                }
            }
            GdsError::Overlap { ptr, len, registered: r } => write!(
                f,
                "device buffer {ptr:#x}..{:#x} ({len} bytes) overlaps the registered buffer {:#x}..{:#x} \
                 ({} bytes, device {}); deregister that one first",
                ptr.wrapping_add(*len as u64),
                r.base,
                r.base.wrapping_add(r.len as u64),
                r.len,
                r.device
            ),
            GdsError::NotBase { ptr, base, offset } => write!(
                f,
                "{ptr:#x} lies inside the registered buffer based at {base:#x} (offset {offset}); deregister by its base"
            ),
            GdsError::UnknownMemory { ptr, source } => write!(f, "{source}; is {ptr:#x} CUDA device memory?"),
            GdsError::Unavailable(reason) => f.write_str(reason),
            GdsError::Several(errors) => {
                for (i, e) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
            GdsError::Internal(m) => write!(f, "internal error in deepnvme::gds (caught panic): {m}"),
        }
    }
}

impl std::error::Error for GdsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GdsError::DriverOpen { source, .. }
            | GdsError::DirectIoSize { source, .. }
            | GdsError::UnknownMemory { source, .. } => Some(source.as_ref()),
            GdsError::Config { source, .. } => Some(source.as_ref()),
            GdsError::Several(errors) => errors.first().map(|e| e as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn cufile_status_text_names_code_cuda_error_and_errno() {
        let s = GdsError::cufile("cuFileDriverOpen", 5010, None, libc::ENOENT).to_string();
        assert!(s.contains("cuFileDriverOpen failed: CU_FILE_NVFS_DRIVER_ERROR (5010)"), "{s}");
        assert!(s.contains("errno 2 (No such file or directory)"), "{s}");
        let e = GdsError::cufile("cuFileBufRegister", 5011, Some(CudaStatus::code_only(201)), 0);
        let s = e.to_string();
        assert!(s.contains("CU_FILE_CUDA_DRIVER_ERROR") && s.contains("CUresult 201"), "{s}");
        assert!(!s.contains("errno"), "{s}");
        assert!(matches!(e, GdsError::CuFile { code: 5011, errno: None, .. }));
        let cuda = CudaStatus { code: 201, name: Some("CUDA_ERROR_INVALID_CONTEXT".into()), text: Some("bad".into()) };
        let s = GdsError::cufile("cuFileBufRegister", 5011, Some(cuda), 0).to_string();
        assert!(s.contains("; CUDA: CUDA_ERROR_INVALID_CONTEXT (201): bad"), "{s}");
        assert!(matches!(GdsError::cufile("x", 5999, None, 0), GdsError::CuFile { name: "CU_FILE_UNKNOWN_ERROR", .. }));
    }

    #[test]
    fn library_errors_list_every_name_and_the_hint() {
        let attempts = vec![
            LoadFailure {
                name: "libcufile.so.0".into(),
                dlerror: "cannot open shared object file: No such file or directory".into(),
            },
            LoadFailure { name: "/x/libcufile.so".into(), dlerror: "invalid ELF header".into() },
        ];
        assert_eq!(
            describe_attempts(&attempts),
            "not found: libcufile.so.0; failed to load: /x/libcufile.so (invalid ELF header)"
        );
        assert_eq!(describe_attempts(&[]), "no names to try");
        let e = GdsError::LibraryNotFound { library: GdsLibrary::CuFile, attempts, override_var: None, other: None };
        let s = e.to_string();
        assert!(s.starts_with("libcufile (cuFile, the GPUDirect Storage library) was not found (not found:"), "{s}");
        assert!(s.contains("DEEPNVME_CUFILE_LIB=/path/to/libcufile.so.0"), "{s}");
        let loaded = LoadedLibrary { library: GdsLibrary::Cuda, path: "/lib/libcuda.so.1".into(), version: None };
        assert!(e.with_other_library(loaded).to_string().ends_with(" (libcuda is at /lib/libcuda.so.1)"));
        let e = GdsError::LibraryNotFound {
            library: GdsLibrary::Cuda,
            attempts: vec![],
            override_var: Some(CUDA_LIB_ENV),
            other: None,
        };
        assert!(e.to_string().contains("DEEPNVME_CUDA_LIB is set, so only that was tried"), "{e}");
    }

    #[test]
    fn causes_are_chained() {
        let io = io::Error::from_raw_os_error(libc::ENOENT);
        let e = GdsError::Config { action: "creating", path: "/x/cufile.json".into(), source: Arc::new(io) };
        assert!(e.source().is_some());
        assert!(e.to_string().starts_with("creating /x/cufile.json failed: "), "{e}");
        let wrapped = GdsError::DirectIoSize {
            source: Box::new(GdsError::cufile("cuFileDriverSetMaxDirectIOSize(1 KiB)", 5022, None, 0)),
            block_size: 1024,
        };
        assert!(wrapped.source().is_some_and(|s| s.to_string().contains("CU_FILE_INVALID_VALUE")));
        assert!(wrapped.to_string().ends_with("(block_size = 1024 bytes)"), "{wrapped}");
        assert!(GdsError::Unavailable("x".into()).source().is_none());
        let e = GdsError::Cuda { call: "cuInit".into(), status: CudaStatus::code_only(100), environment: None }
            .with_environment("libcuda at /l");
        assert_eq!(e.to_string(), "the NVIDIA driver is not usable: cuInit failed: CUDA_ERROR (100) (libcuda at /l)");
    }
}
