//! A device buffer registered with cuFile, and where a buffer lies inside
//! one: the plain data that the registry ([`super::registry`]) keeps and
//! that errors ([`super::error::GdsError::Overlap`]) name.

/// One registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub base: u64,
    pub len: usize,
    pub device: i32,
}

impl Region {
    pub(crate) fn end(&self) -> u64 {
        self.base + self.len as u64
    }
}

/// Where a buffer lies inside a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionHit {
    /// The region's base: the `devPtr_base` cuFile wants.
    pub base: u64,
    /// The buffer's offset from that base: `devPtr_offset`.
    pub offset: u64,
    pub device: i32,
}
