//! CUDA contexts around cuFile calls: [`Ctx`], a device's primary context
//! that any thread may make current, and [`CurrentContext`], which makes
//! one current and puts the caller's back.

use crate::gds::shim::cuda_api::{CuContext, CudaApi};
use crate::gds::error::GdsError;

/// A CUDA context pointer that may cross threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ctx(pub CuContext);
// SAFETY: a CUcontext is an opaque driver handle, not memory Rust reads;
// the CUDA driver lets any thread make it current.
unsafe impl Send for Ctx {}
// SAFETY: `Ctx` is Copy and has no interior state: sharing it is copying
// the handle, as for Send.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// The raw `CUcontext` (a method, so closures capture the whole `Ctx`).
    pub fn raw(self) -> CuContext {
        self.0
    }
}

/// Makes a context current on the calling thread and puts the previous one
/// back on drop.
pub(crate) struct CurrentContext<'a> {
    cuda: &'a CudaApi,
    previous: Option<CuContext>,
}

impl<'a> CurrentContext<'a> {
    pub fn enter(cuda: &'a CudaApi, ctx: Ctx) -> Result<CurrentContext<'a>, GdsError> {
        let prev = cuda.current_context()?;
        if prev == ctx.0 {
            return Ok(CurrentContext { cuda, previous: None });
        }
        cuda.set_current(ctx.0)?;
        Ok(CurrentContext { cuda, previous: Some(prev) })
    }
}

impl Drop for CurrentContext<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            if let Err(e) = self.cuda.set_current(prev) {
                crate::rt::log::error(&format!("restoring the caller's CUDA context: {e}"));
            }
        }
    }
}
