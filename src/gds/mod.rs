//! GPUDirect Storage through cuFile: the device side of DeepSpeed's
//! `deepspeed_gds_handle_t` / `gds_op_desc_t`, without torch.
//!
//! * [`crate::diag::gds_probe`] says once per process whether GDS can work here and, if not,
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
//! cuFile failure: libcufile and libcuda are loaded by hand (`shim/dl.rs`; no
//! CUDA or cuFile header or library is needed to build), every entry point
//! catches panics, and `cuFileDriverOpen` is only called once libcuda has
//! loaded, `cuInit` has succeeded and a device is visible (without libcuda,
//! libcufile 1.17's `cuFileDriverOpen` spins forever).
//!
//! Differences from DeepSpeed, on purpose: the config goes to a private
//! temp directory, not `./local_cufile.json` (whose `$PWD` DeepSpeed never
//! expanded); cuFile's log goes there too instead of `./cufile.log`; every
//! failure is an error for the caller instead of `exit()`.

// Three floors, bottom up (`tests/module_graph.rs` checks that none
// names a floor above it): `shim` the dlopen'ed libraries, `driver` the
// process-wide driver on them, `transfer` the transfers on both. `error`
// and `region` are the types every floor shares; `guard`, `available` and
// `op` are the handle-level API on top.
pub(crate) mod driver;
pub(crate) mod error;
pub(crate) mod shim;
pub(crate) mod transfer;

mod available;
mod guard;
mod region;

pub(crate) mod op;

// The public surface: the handle-level API (the driver and its guard, a
// transfer), the errors and the types their fields name. The probe and the
// environment variables reach the CLI through `crate::diag`; everything
// else is the crate's own.
pub use shim::config::DriverSettings;
pub use shim::dl::LoadFailure;
pub use error::{CudaStatus, GdsLibrary, LoadedLibrary};
pub(crate) use error::GdsError;
pub use guard::{GdsDriver, GdsDriverGuard};
pub use region::Region;
pub use transfer::gds_transfer::GdsTransfer;

pub(crate) use available::{environment_summary, probe};
pub(crate) use available::unavailable;

#[cfg(test)]
pub(crate) mod tests {
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

}
