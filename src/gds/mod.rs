//! GPUDirect Storage through cuFile: the device side of DeepSpeed's
//! `deepspeed_gds_handle_t` / `gds_op_desc_t`, without torch.
//!
//! * [`probe`] says once per process whether GDS can work here and, if not,
//!   exactly what is missing (libcufile and the names searched, libcuda /
//!   the NVIDIA driver, a CUDA device, or the `cuFileDriverOpen` status and
//!   errno).
//! * [`GdsDriver::acquire`] takes a reference on the process-wide cuFile
//!   driver: the first one writes a private cuFile config, points
//!   `CUFILE_ENV_PATH_JSON` at it (unless the user set it), opens the driver
//!   and sets the max direct-I/O size; the last [`GdsDriverGuard`] dropped
//!   closes the driver, deregisters leftover buffers and removes the config.
//! * [`GdsDriverGuard::register_device_buffer`] /
//!   [`GdsDriverGuard::deregister_device_buffer`] keep the process-wide table
//!   of cuFile-registered device buffers (O(log n) lookup).
//! * [`GdsDriverGuard::run_transfer`] moves one [`GdsTransfer`].
//!
//! Nothing here panics or exits on a missing library, a missing GPU or a
//! cuFile failure: libcufile and libcuda are loaded by hand (cudarc's loader
//! panics, and lacks the `libcufile.so.0` soname), every entry point catches
//! panics, and `cuFileDriverOpen` is only called once libcuda has loaded,
//! `cuInit` has succeeded and a device is visible (without libcuda,
//! libcufile 1.17's `cuFileDriverOpen` spins forever).
//!
//! Differences from DeepSpeed, on purpose: the config goes to a private
//! temp directory, not `./local_cufile.json` (whose `$PWD` DeepSpeed never
//! expanded); cuFile's log goes there too instead of `./cufile.log`; every
//! failure is an error for the caller instead of `exit()`.

mod config;
mod cuda_api;
mod cufile_api;
mod dl;
mod driver;
mod error;
mod fd_handles;
mod piece_pool;
mod probe;
mod region;
mod registry;
mod status;
mod symbols;
mod transfer;

pub(crate) mod op;

use std::path::PathBuf;
use std::sync::OnceLock;

pub use config::{ConfigDir, DriverKnobs, CUFILE_ENV_PATH_JSON, MIN_IO_THRESHOLD_SIZE_KB};
pub use dl::LoadFailure;
pub use error::{CudaStatus, GdsError, GdsLibrary, LoadedLibrary};
pub use probe::{LibSearch, CUDA_LIB_ENV, CUFILE_LIB_ENV};
pub use region::{Region, RegionHit};
pub use transfer::{plan_pieces, GdsTransfer, Piece, PIECE_ALIGN};

use crate::error::{catch_unwind_text, Error, Result};
use driver::{global, CoreGuard, CuFileOps, ProcessEnv};

/// Runs `f`, turning a panic into [`GdsError::Internal`] (nothing may
/// unwind across the FFI boundary into C++ or Python).
pub(crate) fn catch_gds<T>(f: impl FnOnce() -> std::result::Result<T, GdsError>) -> std::result::Result<T, GdsError> {
    catch_unwind_text(f).unwrap_or_else(|text| Err(GdsError::Internal(text)))
}

/// [`catch_gds`] for the entry points that return the crate's [`Result`].
fn catch<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind_text(f).unwrap_or_else(|text| Err(GdsError::Internal(text).into()))
}

/// The error for a device request on a handle without GPUDirect Storage.
pub(crate) fn unavailable(reason: String) -> Error {
    Error::Gds(GdsError::Unavailable(reason))
}

/// Adds cuFile's own explanation to a refused file registration: cuFile
/// logs why (most often, no udev database in a container or VM) but returns
/// only `CU_FILE_HANDLE_NOT_REGISTERED`.
fn with_cufile_log(e: Error, log: Vec<String>) -> Error {
    let Error::Transfer(mut t) = e else { return e };
    let Some(detail) = t.detail.as_mut() else { return Error::Transfer(t) };
    if !detail.contains("cuFileHandleRegister") || log.is_empty() {
        return Error::Transfer(t);
    }
    detail.push_str(&format!("; cuFile log: {}", log.join(" | ")));
    if log.iter().any(|l| l.contains("udev")) {
        detail.push_str(
            "; cuFile reads file-system properties from the udev database (/run/udev): in a container, \
             mount it (--volume /run/udev:/run/udev:ro)",
        );
    }
    Error::Transfer(t)
}

/// Whether GPUDirect Storage can work in this process.
///
/// `Ok(())` when libcufile and libcuda load, `cuInit` succeeds, a CUDA
/// device is visible and the cuFile driver opens (when no handle holds it
/// open yet, it is opened with DeepSpeed's default knobs and closed again).
/// Otherwise the [`GdsError`] says precisely what is missing: the libcufile
/// names tried (see [`LibSearch`]; `DEEPNVME_CUFILE_LIB` overrides them),
/// libcuda / the NVIDIA driver, no device, or the `cuFileDriverOpen` status
/// and errno.
///
/// Checked once per process; later calls return the same answer. Never
/// panics. May block for a while on the first call (driver open): call it
/// without the GIL.
pub fn probe() -> std::result::Result<(), GdsError> {
    static PROBE: OnceLock<std::result::Result<(), GdsError>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            catch_gds(|| {
                probe::environment()?;
                global().check_open()
            })
        })
        .clone()
}

/// What was found: library paths and versions, driver CUDA version and the
/// devices, e.g. "libcufile 1.17.0 at /…/libcufile.so.0, libcuda at
/// /usr/lib/…/libcuda.so.1 (driver CUDA 13.0); 1 device(s): NVIDIA H200".
/// `Err` as for [`probe`] (without the driver-open step). Never panics.
pub fn environment_summary() -> std::result::Result<String, GdsError> {
    catch_gds(|| probe::environment().map(|g| g.summary.clone()))
}

/// The process-wide cuFile driver.
pub struct GdsDriver;

impl GdsDriver {
    /// Takes a reference on the cuFile driver, opening it if this is the
    /// first (`deepspeed_gds_handle_t`'s constructor). The first reference
    /// writes the cuFile config (`execution.max_io_queue_depth` =
    /// `queue_depth`, `max_request_parallelism` = `max_io_threads` =
    /// `intra_op_parallelism`, `parallel_io`, `min_io_threshold_size_kb` =
    /// 8192) into a private 0700 temp directory, sets `CUFILE_ENV_PATH_JSON`
    /// to it unless already set, calls `cuFileDriverOpen` and
    /// `cuFileDriverSetMaxDirectIOSize(block_size / 1024)`. Later references
    /// share that driver (their knobs do not reconfigure it).
    ///
    /// Errors: [`Error::InvalidArgument`] for a zero knob or a block size
    /// under 1 KiB; [`Error::Gds`] naming what is missing or what cuFile
    /// said. Nothing is left behind on failure (no directory, no variable).
    /// May block (driver open): call without the GIL.
    pub fn acquire(queue_depth: usize, intra_op_parallelism: usize, block_size: usize) -> Result<GdsDriverGuard> {
        catch(|| {
            let knobs = DriverKnobs { queue_depth, intra_op_parallelism, block_size };
            Ok(GdsDriverGuard { guard: global().acquire(knobs)? })
        })
    }

    /// How many guards hold the driver open now (0: closed).
    pub fn open_count() -> usize {
        global().refs()
    }

    /// The cuFile config file in use while the driver is open; `None` when
    /// closed or when the user's own `CUFILE_ENV_PATH_JSON` is used.
    pub fn config_file() -> Option<PathBuf> {
        global().config_file()
    }
}

/// One reference on the open cuFile driver. Dropping it releases the
/// reference; the last drop closes the driver. `Send + Sync`: one guard may
/// be shared by a handle's threads, and it may be dropped on any thread.
pub struct GdsDriverGuard {
    guard: CoreGuard<'static, CuFileOps, ProcessEnv>,
}

impl std::fmt::Debug for GdsDriverGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsDriverGuard").field("knobs", &self.knobs()).finish()
    }
}

impl GdsDriverGuard {
    /// The knobs the driver was opened with (the first handle's).
    pub fn knobs(&self) -> DriverKnobs {
        self.guard.core().knobs().unwrap_or(DriverKnobs::DEFAULT)
    }

    /// Registers device memory `[ptr, ptr + len)` with cuFile
    /// (`cuFileBufRegister`, with the owning device's primary context
    /// current), so that transfers into any part of it avoid cuFile's bounce
    /// buffers (`pin_device_tensor`). Registering exactly the same region
    /// again is a no-op; a region overlapping a registered one otherwise, a
    /// null pointer, a zero length, or memory CUDA does not know is an error.
    /// Waits for transfers in flight (they hold the table).
    pub fn register_device_buffer(&self, ptr: u64, len: usize) -> Result<()> {
        catch(|| Ok(self.guard.core().register(ptr, len).map(drop)?))
    }

    /// Deregisters the region based at `ptr` (`unpin_device_tensor`).
    /// `Ok(true)`: it was registered and is no more. `Ok(false)`: nothing was
    /// registered at `ptr` (a no-op). Error: `ptr` lies inside a registered
    /// region but is not its base, or cuFile refused (the region is dropped
    /// from the table all the same). Waits for transfers in flight.
    pub fn deregister_device_buffer(&self, ptr: u64) -> Result<bool> {
        catch(|| Ok(self.guard.core().deregister(ptr)?))
    }

    /// The registered region that wholly holds `[ptr, ptr + len)`, with the
    /// buffer's offset in it; `None` when there is none (transfers then go
    /// through cuFile's bounce buffers).
    pub fn registered_region(&self, ptr: u64, len: usize) -> Option<RegionHit> {
        catch_unwind_text(|| self.guard.core().regions().lookup(ptr, len)).ok().flatten()
    }

    /// Moves one transfer and returns when every byte has moved or it
    /// failed (`gds_op_desc_t::run` for all threads, then `finish`).
    ///
    /// The fd is registered with cuFile for this call only. The device
    /// buffer is addressed as (registered base, offset) when it lies in a
    /// registered region, else as the raw pointer (cuFile bounces it). The
    /// bytes are cut by [`plan_pieces`] into up to `parallelism` pieces of
    /// at least `block_size` bytes, each moved on its own thread with the
    /// device's primary context current; the calling thread's current
    /// context is restored before returning. Short counts are resubmitted.
    ///
    /// Errors: [`Error::InvalidArgument`] for bad arguments;
    /// [`Error::Transfer`] naming the fd, file offset, length, errno and the
    /// cuFile/POSIX reason; [`Error::Gds`] when the device context cannot be
    /// set up. Blocks: call without the GIL. The device memory and the fd
    /// must stay valid until it returns.
    pub fn run_transfer(&self, t: &GdsTransfer, parallelism: usize, block_size: usize) -> Result<()> {
        catch(|| {
            transfer::validate(t, parallelism, block_size)?;
            if t.len == 0 {
                return Ok(());
            }
            let gpu = probe::environment()?;
            let core = self.guard.core();
            let ctx = core.ops.context(t.device_ordinal)?;
            // The table stays read-locked for the whole transfer (deregistration waits),
            // and is let go before the driver state is read (lock order: state, then table).
            let result = transfer::run(gpu, ctx, &core.regions(), t, parallelism, block_size);
            result.map_err(|e| with_cufile_log(e, core.log_tail(6)))
        })
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<GdsDriverGuard>();
};

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The libcufile that `pip install nvidia-cufile` put on this machine,
    /// if any (for the no-GPU tests).
    pub(crate) fn pip_libcufile() -> Option<String> {
        let venv = std::env::var("DEEPNVME_VENV")
            .ok()
            .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.cache/deepnvme-venv")))
            .map(|v| format!("{v}/lib"))
            .unwrap_or_default();
        let roots = [venv.as_str(), "/opt/torch/.venv/lib", "/usr/local/lib", "/usr/lib"];
        for root in roots {
            let Ok(pythons) = std::fs::read_dir(root) else { continue };
            for py in pythons.filter_map(|e| e.ok()) {
                for sub in [
                    "site-packages/nvidia/cu13/lib",
                    "site-packages/nvidia/cufile/lib",
                    "dist-packages/nvidia/cufile/lib",
                ] {
                    let p = py.path().join(sub).join("libcufile.so.0");
                    if p.is_file() {
                        return Some(p.display().to_string());
                    }
                }
            }
        }
        None
    }

    #[test]
    fn panics_become_errors() {
        let r: std::result::Result<(), GdsError> = catch_gds(|| panic!("boom {}", 7));
        match r {
            Err(GdsError::Internal(m)) => assert_eq!(m, "boom 7"),
            other => panic!("{other:?}"),
        }
        let r: Result<()> = catch(|| panic!("static str"));
        match r {
            Err(e @ Error::Gds(GdsError::Internal(_))) => {
                assert_eq!(e.to_string(), "GPUDirect Storage: internal error in deepnvme::gds (caught panic): static str");
                let source = std::error::Error::source(&e).expect("the GdsError is the source");
                assert!(source.to_string().starts_with("internal error in deepnvme::gds"), "{source}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unavailable_is_a_gds_error_with_its_reason() {
        let e = unavailable("this gds_handle has no GPUDirect Storage: no GPU".into());
        assert!(matches!(&e, Error::Gds(GdsError::Unavailable(r)) if r.ends_with("no GPU")), "{e:?}");
        assert_eq!(e.to_string(), "GPUDirect Storage: this gds_handle has no GPUDirect Storage: no GPU");
    }

    #[test]
    fn a_refused_file_registration_carries_cufiles_reason() {
        let t = crate::TransferError {
            direction: crate::Direction::Write,
            path: None,
            fd: 7,
            file_offset: 0,
            len: 4096,
            errno: libc::EIO,
            detail: Some("cuFileHandleRegister(fd 7) failed: CU_FILE_HANDLE_NOT_REGISTERED (5027)".into()),
        };
        let log = vec!["ERROR cufio-udev:67 udev property not found: ID_FS_USAGE vda".to_string()];
        let msg = with_cufile_log(Error::Transfer(t.clone()), log.clone()).to_string();
        assert!(msg.contains("ID_FS_USAGE") && msg.contains("/run/udev"), "{msg}");
        let other = crate::TransferError { detail: Some("cuFileRead returned -5".into()), ..t };
        assert!(!with_cufile_log(Error::Transfer(other), log).to_string().contains("cuFile log"));
    }

    #[test]
    fn bad_knobs_are_refused_before_any_library_is_touched() {
        match GdsDriver::acquire(0, 1, 1 << 20) {
            Err(Error::InvalidArgument(m)) => assert!(m.starts_with("GDS handle: queue_depth"), "{m}"),
            other => panic!("{other:?}"),
        }
        match GdsDriver::acquire(128, 1, 100) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("block_size"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
