//! GDS buffer registration on a handle (`pin_device_tensor` /
//! `unpin_device_tensor`): CUDA buffers registered with cuFile through the
//! handle's GDS half (`device.rs` routes ops; this registers memory).

use super::construction::IoHandle;
use super::device::{DeviceRoute, GdsHalf};
use crate::buffer::{BufferDesc, Location};
use crate::error::{Error, Result};

impl IoHandle {
    /// GDS handles: registers a CUDA buffer with cuFile
    /// (`pin_device_tensor`), so transfers into any part of it avoid
    /// cuFile's bounce buffers. May block.
    pub fn register_device_buffer(&self, buffer: &BufferDesc) -> Result<()> {
        self.check_process()?;
        let gds = self.gds_half()?;
        if !matches!(buffer.location(), Location::Cuda(_)) || buffer.ptr().is_null() {
            return Err(Error::InvalidArgument(
                "pin_device_tensor takes a CUDA tensor".into(),
            ));
        }
        gds.driver
            .register_device_buffer(buffer.ptr() as u64, buffer.len())
    }

    /// GDS handles: deregisters the region based at `base`
    /// (`unpin_device_tensor`); `Ok(false)` when none was registered there.
    pub fn deregister_device_buffer(&self, base: *const u8) -> Result<bool> {
        self.check_process()?;
        let gds = self.gds_half()?;
        if base.is_null() {
            return Ok(false);
        }
        gds.driver.deregister_device_buffer(base as u64)
    }

    pub(super) fn gds_half(&self) -> Result<&GdsHalf> {
        match &self.device_route {
            DeviceRoute::Gds(g) => Ok(g),
            DeviceRoute::GdsUnavailable(why) => Err(crate::gds::unavailable(format!(
                "this gds_handle has no GPUDirect Storage: {why}"
            ))),
            DeviceRoute::Bounce => Err(crate::gds::unavailable(
                "device tensors can only be registered through a gds_handle".into(),
            )),
        }
    }
}
