//! The handle-level API of the process-wide cuFile driver: [`GdsDriver`]
//! takes references on it, and a [`GdsDriverGuard`] registers device
//! buffers and runs transfers while it holds one.

use std::path::PathBuf;

use crate::gds::shim::catch::catch;
use crate::gds::shim::config::DriverSettings;
use crate::gds::driver::cufile_ops::{global, CuFileOps, ProcessEnv};
use crate::gds::driver::lifecycle::CoreGuard;
use crate::gds::shim::probe::environment;
use crate::gds::region::Region;
use crate::gds::transfer::gds_transfer::{self as transfer, GdsTransfer};
use crate::error::{catch_unwind_text, Error, Result};

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
    /// share that driver (their settings do not reconfigure it).
    ///
    /// Errors: [`Error::InvalidArgument`] for a zero setting or a block size
    /// under 1 KiB; [`Error::Gds`] naming what is missing or what cuFile
    /// said. Nothing is left behind on failure (no directory, no variable).
    /// May block (driver open): call without the GIL.
    pub fn acquire(queue_depth: usize, intra_op_parallelism: usize, block_size: usize) -> Result<GdsDriverGuard> {
        catch(|| {
            let settings = DriverSettings { queue_depth, intra_op_parallelism, block_size };
            Ok(GdsDriverGuard { guard: global().acquire(settings)? })
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
#[must_use = "dropping the guard releases the driver at once (the last one closes it)"]
pub struct GdsDriverGuard {
    guard: CoreGuard<'static, CuFileOps, ProcessEnv>,
}

impl std::fmt::Debug for GdsDriverGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsDriverGuard").field("settings", &self.settings()).finish()
    }
}

impl GdsDriverGuard {
    /// The settings the driver was opened with (the first handle's).
    pub fn settings(&self) -> DriverSettings {
        self.guard.core().settings().unwrap_or(DriverSettings::DEFAULT)
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

    /// The registered region that wholly holds `[ptr, ptr + len)` (the
    /// buffer lies `ptr - base` bytes into it); `None` when there is none
    /// (transfers then go through cuFile's bounce buffers).
    pub fn registered_region(&self, ptr: u64, len: usize) -> Option<Region> {
        catch_unwind_text(|| self.guard.core().regions().holding(ptr, len)).ok().flatten()
    }

    /// Moves one transfer and returns when every byte has moved or it
    /// failed (`gds_op_desc_t::run` for all threads, then `finish`).
    ///
    /// The fd is registered with cuFile for this call only. The device
    /// buffer is addressed as (registered base, offset) when it lies in a
    /// registered region, else as the raw pointer (cuFile bounces it). The
    /// bytes are cut (`plan_pieces`) into up to `parallelism` pieces of
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
            let gpu = environment()?;
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
mod tests {
    use super::*;

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
    fn bad_settings_are_refused_before_any_library_is_touched() {
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

