//! Finding libcufile and libcuda, and checking that a GPU is there, without
//! ever panicking, hanging or exiting.
//!
//! Lookup order for libcufile:
//! 1. `DEEPNVME_CUFILE_LIB`, when set: that name or path ONLY (an explicit
//!    choice is never silently replaced by another copy);
//! 2. `libcufile.so.0`: the soname of every NVIDIA build. Inside a process
//!    where torch is loaded this finds torch's own copy (libtorch_cuda links
//!    `libcufile.so.0`), so the process keeps ONE cuFile driver;
//! 3. `libcufile.so`, `libcufile.so.1`, then the further names of
//!    [`FURTHER_NAMES`] (`libcufile.so.12`, ..., and the `lib<name>64_<ver>.so`
//!    spellings of some CUDA installs).
//!
//! libcuda: `DEEPNVME_CUDA_LIB` alone when set, else `libcuda.so.1`,
//! `libcuda.so`, then the same further names.
//!
//! Bare names are searched by the dynamic linker (LD_LIBRARY_PATH, RPATH,
//! ld.so.cache, and objects already loaded by soname).

use std::sync::OnceLock;

use crate::gds::shim::catch::catch_gds;
use crate::gds::shim::cuda_api::CudaApi;
use crate::gds::shim::cufile_api::CuFileApi;
use crate::gds::shim::dl;
use crate::gds::error::{GdsError, GdsLibrary, LoadedLibrary};

pub(crate) use crate::knobs::{CUDA_LIB_ENV, CUFILE_LIB_ENV};

/// The names tried for each library, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LibSearch {
    pub cufile: Vec<String>,
    pub cuda: Vec<String>,
    /// Where each list came from, for messages (`CUFILE_LIB_ENV` / `CUDA_LIB_ENV`, or "default").
    pub cufile_origin: &'static str,
    pub cuda_origin: &'static str,
}

/// The further spellings tried for `lib<name>`, after the usual sonames:
/// `lib<name>` + each suffix, in order. They are the list that cudarc
/// 0.19's `get_lib_name_candidates` made for CUDA 12.8 (duplicates
/// dropped), which this search appended before deepnvme stopped depending
/// on cudarc; kept so that the names tried, and listed in the error when
/// none loads, stay the same.
const FURTHER_NAMES: &[&str] = &[
    ".so",
    "64.so",
    "64_12.so",
    "64_128.so",
    "64_128_0.so",
    "64_120_8.so",
    "64_10.so",
    "64_11.so",
    "64_120_0.so",
    "64_9.so",
    ".so.12",
    ".so.11",
    ".so.10",
    ".so.9",
    ".so.1",
];

/// `first`, then the [`FURTHER_NAMES`] of `lib` it does not hold yet.
fn with_further_names(mut first: Vec<String>, lib: &str) -> Vec<String> {
    for suffix in FURTHER_NAMES {
        let name = format!("lib{lib}{suffix}");
        if !first.contains(&name) {
            first.push(name);
        }
    }
    first
}

impl LibSearch {
    /// The search this process uses: the environment overrides, else the
    /// default lists (see the module documentation).
    pub fn from_env() -> LibSearch {
        let settings = crate::knobs::Settings::from_env();
        let (cufile, cufile_origin) = match settings.cufile_lib {
            Some(v) => (vec![v], CUFILE_LIB_ENV),
            None => (Self::default_cufile_names(), "default"),
        };
        let (cuda, cuda_origin) = match settings.cuda_lib {
            Some(v) => (vec![v], CUDA_LIB_ENV),
            None => (Self::default_cuda_names(), "default"),
        };
        LibSearch { cufile, cuda, cufile_origin, cuda_origin }
    }

    /// `libcufile.so.0`, `libcufile.so`, `libcufile.so.1`, then the further names.
    pub fn default_cufile_names() -> Vec<String> {
        with_further_names(vec!["libcufile.so.0".into(), "libcufile.so".into(), "libcufile.so.1".into()], "cufile")
    }

    /// `libcuda.so.1`, `libcuda.so`, then the further names.
    pub fn default_cuda_names() -> Vec<String> {
        with_further_names(vec!["libcuda.so.1".into(), "libcuda.so".into()], "cuda")
    }
}

/// Everything GDS needs from the machine, once found.
pub(crate) struct Gpu {
    pub cufile: CuFileApi,
    pub cuda: CudaApi,
    pub devices: i32,
    pub summary: String,
}

/// The first of `names` that loads, or which library is missing and why
/// each name failed. `origin` is the variable that chose the names, or "default".
fn open_library(library: GdsLibrary, names: &[String], origin: &'static str) -> Result<dl::Library, GdsError> {
    dl::open_first(names).map_err(|attempts| GdsError::LibraryNotFound {
        library,
        attempts,
        override_var: (origin != "default").then_some(origin),
        other: None,
    })
}

fn load_cufile(search: &LibSearch) -> Result<CuFileApi, GdsError> {
    CuFileApi::load(open_library(GdsLibrary::CuFile, &search.cufile, search.cufile_origin)?)
}

fn load_cuda(search: &LibSearch) -> Result<CudaApi, GdsError> {
    CudaApi::load(open_library(GdsLibrary::Cuda, &search.cuda, search.cuda_origin)?)
}

/// Loads both libraries and checks for a device, without opening the cuFile
/// driver. Every problem found is named; when both libraries are missing the
/// message says so for each.
pub(crate) fn check_environment(search: &LibSearch) -> Result<Gpu, GdsError> {
    let cufile = load_cufile(search);
    let cuda = load_cuda(search);
    let (cufile, cuda) = match (cufile, cuda) {
        (Ok(f), Ok(c)) => (f, c),
        (Err(f), Err(c)) => return Err(GdsError::Several(vec![f, c])),
        (Err(f), Ok(c)) => {
            return Err(f.with_other_library(LoadedLibrary { library: GdsLibrary::Cuda, path: c.path, version: None }))
        }
        (Ok(f), Err(c)) => {
            let version = f.version();
            return Err(c.with_other_library(LoadedLibrary { library: GdsLibrary::CuFile, path: f.path, version }));
        }
    };
    let found = format!(
        "libcufile {}at {}, libcuda at {}{}",
        cufile.version().map(|v| v + " ").unwrap_or_default(),
        cufile.path,
        cuda.path,
        cuda.driver_version().map(|v| format!(" (driver CUDA {v})")).unwrap_or_default()
    );
    cuda.init().map_err(|e| e.with_environment(&found))?;
    let devices = cuda.device_count().map_err(|e| e.with_environment(&found))?;
    if devices < 1 {
        return Err(GdsError::NoDevice { count: devices, environment: found });
    }
    let names: Vec<String> =
        (0..devices).map(|d| cuda.device_name(d).unwrap_or_else(|| format!("device {d}"))).collect();
    let summary = format!("{found}; {devices} device(s): {}", names.join(", "));
    Ok(Gpu { cufile, cuda, devices, summary })
}

/// The process's libraries and devices, checked once.
pub(crate) fn environment() -> Result<&'static Gpu, GdsError> {
    static ENV: OnceLock<Result<Gpu, GdsError>> = OnceLock::new();
    match ENV.get_or_init(|| catch_gds(|| check_environment(&LibSearch::from_env()))) {
        Ok(g) => Ok(g),
        Err(e) => Err(e.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pip_cufile() -> Option<String> {
        crate::gds::tests::pip_libcufile()
    }

    #[test]
    fn default_names_start_with_the_sonames_then_the_further_names() {
        let names = LibSearch::default_cufile_names();
        assert_eq!(names[0], "libcufile.so.0");
        assert!(names.contains(&"libcufile.so".to_string()));
        // The list cudarc 0.19 (CUDA 12.8) gave, checked against it before it was dropped.
        assert_eq!(
            names,
            [
                "libcufile.so.0", "libcufile.so", "libcufile.so.1", "libcufile64.so", "libcufile64_12.so",
                "libcufile64_128.so", "libcufile64_128_0.so", "libcufile64_120_8.so", "libcufile64_10.so",
                "libcufile64_11.so", "libcufile64_120_0.so", "libcufile64_9.so", "libcufile.so.12", "libcufile.so.11",
                "libcufile.so.10", "libcufile.so.9",
            ]
        );
        assert_eq!(
            LibSearch::default_cuda_names(),
            [
                "libcuda.so.1", "libcuda.so", "libcuda64.so", "libcuda64_12.so", "libcuda64_128.so",
                "libcuda64_128_0.so", "libcuda64_120_8.so", "libcuda64_10.so", "libcuda64_11.so", "libcuda64_120_0.so",
                "libcuda64_9.so", "libcuda.so.12", "libcuda.so.11", "libcuda.so.10", "libcuda.so.9",
            ]
        );
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "no name is tried twice");
        assert_eq!(LibSearch::default_cuda_names()[0], "libcuda.so.1");
    }

    #[test]
    fn missing_libraries_are_each_named_with_the_names_tried() {
        let search = LibSearch {
            cufile: vec!["libcufile-deepnvme-bogus.so.0".into(), "/nonexistent/libcufile.so".into()],
            cuda: vec!["libcuda-deepnvme-bogus.so.1".into()],
            cufile_origin: "default",
            cuda_origin: "default",
        };
        let err = check_environment(&search).err().expect("bogus names cannot load");
        match &err {
            GdsError::Several(both) => {
                assert!(
                    matches!(&both[0], GdsError::LibraryNotFound { library: GdsLibrary::CuFile, attempts, override_var: None, .. } if attempts.len() == 2),
                    "{err:?}"
                );
                assert!(matches!(&both[1], GdsError::LibraryNotFound { library: GdsLibrary::Cuda, .. }), "{err:?}");
            }
            other => panic!("{other:?}"),
        }
        let err = err.to_string();
        assert!(err.contains("libcufile (cuFile"), "{err}");
        assert!(err.contains("libcufile-deepnvme-bogus.so.0") && err.contains("/nonexistent/libcufile.so"), "{err}");
        assert!(err.contains("libcuda (the NVIDIA driver"), "{err}");
        assert!(err.contains("libcuda-deepnvme-bogus.so.1"), "{err}");
        assert!(err.contains(CUFILE_LIB_ENV), "the hint names the override: {err}");
    }

    #[test]
    fn an_explicit_override_says_it_was_the_only_name_tried() {
        let search = LibSearch {
            cufile: vec!["/nonexistent/override/libcufile.so.0".into()],
            cuda: vec!["libc.so.6".into()],
            cufile_origin: CUFILE_LIB_ENV,
            cuda_origin: CUDA_LIB_ENV,
        };
        let err = check_environment(&search).err().expect("must fail");
        match &err {
            GdsError::Several(both) => {
                assert!(matches!(&both[0], GdsError::LibraryNotFound { override_var: Some(CUFILE_LIB_ENV), .. }));
                assert!(
                    matches!(&both[1], GdsError::MissingSymbol { library: GdsLibrary::Cuda, symbols, .. } if symbols == &["cuInit"])
                );
            }
            other => panic!("{other:?}"),
        }
        let err = err.to_string();
        assert!(err.contains("/nonexistent/override/libcufile.so.0"), "{err}");
        assert!(err.contains("only that was tried"), "{err}");
        // libc loads but is not libcuda: the missing symbol is named.
        assert!(err.contains("cuInit"), "{err}");
    }

    #[test]
    fn libcufile_present_without_the_driver_is_a_clear_error() {
        let Some(path) = pip_cufile() else {
            eprintln!("skipped: no pip-installed libcufile.so.0 on this machine");
            return;
        };
        let search = LibSearch {
            cufile: vec![path.clone()],
            cuda: vec!["libcuda-deepnvme-bogus.so.1".into()],
            cufile_origin: CUFILE_LIB_ENV,
            cuda_origin: "default",
        };
        let err = check_environment(&search).err().expect("no libcuda: must fail");
        assert!(
            matches!(
                &err,
                GdsError::LibraryNotFound {
                    library: GdsLibrary::Cuda,
                    other: Some(LoadedLibrary { library: GdsLibrary::CuFile, .. }),
                    ..
                }
            ),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(err.contains("libcuda (the NVIDIA driver"), "{err}");
        assert!(err.contains("libcuda-deepnvme-bogus.so.1"), "{err}");
        assert!(err.contains("libcufile") && err.contains("is at"), "names the libcufile found: {err}");
        assert!(!err.contains("libcufile (cuFile, the GPUDirect Storage library) was not found"), "{err}");
    }
}
