//! A device buffer registered with cuFile: the plain data that the
//! registry ([`crate::gds::driver::registry`]) keeps, that errors
//! ([`crate::gds::error::GdsError::Overlap`]) name, and that
//! [`crate::gds::guard::GdsDriverGuard::registered_region`] answers with.

/// One registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The device address it starts at.
    pub base: u64,
    /// Its length in bytes.
    pub len: usize,
    /// The CUDA device ordinal it lives on.
    pub device: i32,
}

impl Region {
    pub(crate) fn end(&self) -> u64 {
        self.base + self.len as u64
    }
}
