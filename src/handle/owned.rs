//! The Rust API's owned buffers: an async op owns its buffer until it is
//! finished, then [`Pending`] gives it back. Its bounce copies are
//! `buffer.rs`'s `HostMemcpy` (an owned buffer is host memory that cannot
//! move while the op owns it).

use std::sync::Arc;

use crate::rt::sync::Mutex;

use crate::buffer::{BufferDesc, HostMemcpy, IoBuffer, Staging};
use super::borrowed::offset_arg;
use super::construction::IoHandle;
use crate::error::{Direction, Result};
use crate::file::FileTarget;
use crate::op::OpRequest;

/// An async op's buffer, handed back once the op is finished.
///
/// ```
/// use deepnvme::{FileTarget, IoHandle, HandleConfig, LockedBuffer};
///
/// # let dir = std::env::temp_dir().join(format!("deepnvme-doc-pending-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let path = dir.join("pending.bin");
/// let handle = IoHandle::new(HandleConfig::default())?;
/// let mut buf = LockedBuffer::new(1 << 20)?;   // page-locked: no bounce copy
/// buf.fill(7);
/// let pending = handle.submit_write(buf, FileTarget::Path(&path), 0)?;
/// assert!(pending.take().is_none());            // in flight: the op owns it
/// assert_eq!(handle.wait()?, 1);
/// let buf = pending.take().expect("finished ops give their buffer back");
/// assert_eq!(buf[0], 7);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a Pending loses the way back to the buffer: take() it after wait()"]
pub struct Pending<B> {
    pub(super) slot: Arc<Mutex<Option<B>>>,
}

impl<B> Pending<B> {
    /// The buffer, once `wait()` (or dropping the handle) finished its op;
    /// `None` before that, or when it was already taken.
    pub fn take(&self) -> Option<B> {
        self.slot.lock().take()
    }
}

/// The op's hold on an owned buffer: copies for a bounce, and on drop (when
/// the op is finished) hands the buffer to its [`Pending`].
pub(super) struct OwnedStaging<B: IoBuffer> {
    pub(super) buffer: Option<B>,
    pub(super) desc: BufferDesc,
    pub(super) slot: Arc<Mutex<Option<B>>>,
}

impl<B: IoBuffer> Staging for OwnedStaging<B> {
    // The op owns the buffer, whose memory `desc` describes: it cannot move,
    // and nothing else can reach it (`HostMemcpy`'s argument).
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> Result<()> {
        HostMemcpy::of(self.desc)?.bytes_to_bounce(bounce);
        Ok(())
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> Result<()> {
        HostMemcpy::of(self.desc)?.bytes_from_bounce(bounce);
        Ok(())
    }
}

impl<B: IoBuffer> Drop for OwnedStaging<B> {
    fn drop(&mut self) {
        *self.slot.lock() = self.buffer.take();
    }
}

impl IoHandle {
    /// An async parallel read into `buffer`, which the op owns until `wait()`
    /// finishes it; [`Pending::take`] then gives it back. On an error the
    /// buffer is dropped.
    pub fn submit_read<B: IoBuffer>(
        &self,
        buffer: B,
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<Pending<B>> {
        self.submit_owned(Direction::Read, buffer, target, file_offset)
    }

    /// An async parallel write of `buffer` (owned by the op until `wait()`
    /// finishes it, then given back by [`Pending::take`]).
    pub fn submit_write<B: IoBuffer>(
        &self,
        buffer: B,
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<Pending<B>> {
        self.submit_owned(Direction::Write, buffer, target, file_offset)
    }

    pub(super) fn submit_owned<B: IoBuffer>(
        &self,
        direction: Direction,
        mut buffer: B,
        target: FileTarget<'_>,
        file_offset: u64,
    ) -> Result<Pending<B>> {
        let desc = buffer.io_desc();
        let slot = Arc::new(Mutex::new(None));
        let hold = OwnedStaging {
            buffer: Some(buffer),
            desc,
            slot: slot.clone(),
        };
        let request = OpRequest {
            direction,
            target,
            file_offset: offset_arg(file_offset)?,
            buffer: desc,
            staging: Some(Box::new(hold)),
            validate: false,
        };
        self.submit(request, true)?;
        Ok(Pending { slot })
    }
}
