//! Whether GPUDirect Storage can work in this process ([`probe`], once per
//! process), what was found ([`environment_summary`]), and the error a
//! device request gets on a handle without it ([`unavailable`]).

use std::sync::OnceLock;

use crate::gds::shim::catch::catch_gds;
use crate::gds::driver::cufile_ops::global;
use crate::gds::error::GdsError;
use crate::gds::shim::probe::environment;
use crate::error::Error;


/// The error for a device request on a handle without GPUDirect Storage.
pub(crate) fn unavailable(reason: String) -> Error {
    Error::Gds(GdsError::Unavailable(reason))
}

/// Whether GPUDirect Storage can work in this process.
///
/// `Ok(())` when libcufile and libcuda load, `cuInit` succeeds, a CUDA
/// device is visible and the cuFile driver opens (when no handle holds it
/// open yet, it is opened with DeepSpeed's default settings and closed again).
/// Otherwise the [`GdsError`] says precisely what is missing: the libcufile
/// names tried (`DEEPNVME_CUFILE_LIB` overrides them; see the README),
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
                environment()?;
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
    catch_gds(|| environment().map(|g| g.summary.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_is_a_gds_error_with_its_reason() {
        let e = unavailable("this gds_handle has no GPUDirect Storage: no GPU".into());
        assert!(matches!(&e, Error::Gds(GdsError::Unavailable(r)) if r.ends_with("no GPU")), "{e:?}");
        assert_eq!(e.to_string(), "GPUDirect Storage: this gds_handle has no GPUDirect Storage: no GPU");
    }

}
