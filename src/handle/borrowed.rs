//! Blocking ops on borrowed memory, the simplest of the Rust API:
//! `read_into` and `write_from` (a `&mut [u8]` / `&[u8]` for the call).



use super::construction::IoHandle;

use crate::buffer::BufferDesc;
use crate::error::{Direction, Error, Result};
use crate::file::FileTarget;
use crate::op::OpRequest;

impl IoHandle {
    /// A blocking parallel read of `buffer.len()` bytes at `file_offset`;
    /// returns how many ops finished (this one and any earlier async ones).
    pub fn read_into(
        &self,
        buffer: &mut [u8],
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<usize> {
        // SAFETY: the borrow outlives this blocking call, which returns only
        // after every pending op (this one included) has finished.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_mut_ptr(), buffer.len()) };
        self.submit(
            OpRequest::new(Direction::Read, target, offset_arg(file_offset)?, desc),
            false,
        )
    }

    /// A blocking parallel write of `buffer` at `file_offset`; returns how
    /// many ops finished (this one and any earlier async ones).
    pub fn write_from(
        &self,
        buffer: &[u8],
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<usize> {
        // SAFETY: as in `read_into`; a write only reads the memory.
        let desc = unsafe { BufferDesc::from_raw_parts(buffer.as_ptr() as *mut u8, buffer.len()) };
        self.submit(
            OpRequest::new(Direction::Write, target, offset_arg(file_offset)?, desc),
            false,
        )
    }
}

/// File offsets are `i64` in DeepSpeed's API; the safe calls take `u64`.
pub(super) fn offset_arg(file_offset: u64) -> Result<i64> {
    i64::try_from(file_offset).map_err(|_| {
        Error::InvalidArgument(format!(
            "file_offset {file_offset} is beyond the largest file offset"
        ))
    })
}
