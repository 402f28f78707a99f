//! One GPUDirect transfer through a handle (`gds_op_desc_t`): a contiguous
//! CUDA buffer moved by cuFile, queued on the handle like a CPU op so that
//! `wait()` counts and finishes both kinds in submission order.
//!
//! The op opens the file as DeepSpeed does (O_DIRECT, no truncation), checks
//! a read against the file size, and runs as one slice on a handle worker;
//! cuFile's own parallelism (`intra_op_parallelism`) is applied inside
//! [`GdsDriverGuard::run_transfer`]. The file is registered with cuFile for
//! the op only, and closed when the op finishes. `validate=True` copies the
//! device bytes to host through the torch glue and compares with the file.

use std::sync::Arc;

use crate::gds::guard::GdsDriverGuard;
use crate::gds::transfer::gds_transfer::GdsTransfer;
use crate::engine::Engine;
use crate::buffer::{Location, Staging};
use crate::error::{Direction, Error, Result, TransferError};
use crate::file::OpenFile;
use crate::op::checks::{check_file_offset, check_read_extent, report_validation, EarlierWrites};
use crate::op::work::{OpCompletion, OpFootprint, OpMeta, OpWork, PreparedOp};
use crate::op::OpRequest;
use crate::pinned::{LockMode, PageAlignedBuffer};

struct GdsWork {
    driver: Arc<GdsDriverGuard>,
    transfer: GdsTransfer,
    parallelism: usize,
    block_size: usize,
    path: Option<std::path::PathBuf>,
}

impl OpWork for GdsWork {
    fn slice_count(&self) -> usize {
        1
    }
    fn run_slice(&self, _index: usize, _engine: &mut dyn Engine) -> Result<()> {
        self.driver.run_transfer(&self.transfer, self.parallelism, self.block_size).map_err(|e| match e {
            Error::Transfer(t) => Error::Transfer(t.with_path(self.path.clone())),
            other => other,
        })
    }
    fn slice_error(&self, _index: usize, detail: String) -> Error {
        Error::Transfer(TransferError {
            direction: self.transfer.direction,
            path: self.path.clone(),
            fd: self.transfer.fd,
            file_offset: self.transfer.file_offset,
            len: self.transfer.len,
            errno: libc::EIO,
            detail: Some(detail),
        })
    }
}

struct GdsCompletion {
    file: OpenFile,
    direction: Direction,
    file_offset: u64,
    len: usize,
    staging: Option<Box<dyn Staging>>,
    validate: bool,
}

impl OpCompletion for GdsCompletion {
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        if self.validate {
            match self.staging.as_mut() {
                Some(staging) => {
                    let mut host = PageAlignedBuffer::new(self.len, LockMode::None)?;
                    let what = || crate::op::checks::describe_op(self.direction, self.len, self.file_offset, &self.file);
                    staging.copy_to_bounce(host.as_mut_slice()).map_err(|e| e.in_copy_of(&what))?;
                    report_validation(self.direction, &self.file, self.file_offset, host.as_slice());
                }
                None => crate::rt::log::stdout_line(&format!(
                    "Fail: correctness of {} of {}: no way to read the device buffer back",
                    self.direction.verb(),
                    self.file.display_path().display()
                )),
            }
        }
        Ok(())
    }
}

/// Opens the file and builds the op for a contiguous CUDA buffer;
/// `parallelism` and `block_size` are what cuFile's transfer is cut by.
pub(crate) fn prepare(
    driver: &Arc<GdsDriverGuard>,
    request: OpRequest<'_>,
    parallelism: usize,
    block_size: usize,
    earlier_writes: EarlierWrites<'_>,
) -> Result<PreparedOp> {
    let OpRequest { direction, target, file_offset, buffer, staging, validate } = request;
    let device_ordinal = match buffer.location() {
        Location::Cuda(ordinal) => ordinal.max(0),
        other => return Err(Error::InvalidArgument(format!("a GPUDirect op needs a CUDA buffer, not {other:?} memory"))),
    };
    let (device_ptr, len) = (buffer.ptr() as u64, buffer.len());
    let file_offset = check_file_offset(file_offset, &target)?;
    let file = crate::stripe::open(target, direction)?;
    if crate::stripe::is_striped(&file) {
        return Err(Error::InvalidArgument(format!(
            "{} is a striped file (deepnvme stripe set): GPUDirect Storage moves a CUDA buffer to one file; \
             use an aio_handle with a CPU tensor for striped files",
            file.display_path().display()
        )));
    }
    if direction == Direction::Read {
        check_read_extent(&file, file_offset, len, earlier_writes)?;
    }
    let fd = file.direct().map(|(fd, _)| fd).unwrap_or_else(|| file.any_fd());
    let work = GdsWork {
        driver: driver.clone(),
        transfer: GdsTransfer { direction, fd, file_offset, device_ptr, len, device_ordinal },
        parallelism,
        block_size,
        path: file.path().map(|p| p.to_path_buf()),
    };
    // Device addresses never overlap host ones (CUDA's unified addressing),
    // so the same footprint rule orders GPU ops among themselves and with the rest.
    let mut footprint = OpFootprint::of_memory(device_ptr as usize, len, direction == Direction::Read);
    footprint.file = file.order_identity().map(|id| (id, file_offset, file_offset + len as u64));
    let completion = GdsCompletion { file, direction, file_offset, len, staging, validate };
    let meta = OpMeta { direction: Some(direction), bytes: len as u64, bounced_bytes: 0, may_run_inline: false, footprint: Some(footprint) };
    Ok(PreparedOp { work: Arc::new(work), completion: Box::new(completion), meta })
}
