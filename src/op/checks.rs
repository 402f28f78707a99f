//! The checks an op makes before it runs (offsets, extents, DeepSpeed's
//! divisibility rule), and DeepSpeed's `validate=True` re-read afterwards.
//! CPU and GPUDirect ops share them.

use std::path::PathBuf;

use crate::error::{Direction, Error, Result};
use crate::file::{FileIdentity, FileTarget, OpenFile};

/// What a read's extent check may ask of the handle that admits it: let
/// the writes it admitted earlier to `file` that reach the read's end
/// (`end`) run, so that the read is checked against the size they leave
/// (the one order per handle: a read after a write of the same bytes sees
/// them).
pub(crate) type EarlierWrites<'a> = &'a dyn Fn(FileIdentity, u64) -> Result<()>;

/// For an op no handle admits (nothing earlier to wait for).
pub(crate) const NO_EARLIER_WRITES: EarlierWrites<'static> = &|_, _| Ok(());

/// A read must lie inside the file or block device (DeepSpeed asserted,
/// killing the process), once the earlier writes that grow the file ran.
pub(crate) fn check_read_extent(
    file: &OpenFile,
    file_offset: u64,
    len: usize,
    earlier_writes: EarlierWrites<'_>,
) -> Result<()> {
    let end = file_offset.checked_add(len as u64);
    let fits = |size: u64| end.is_some_and(|end| end <= size);
    let mut size = file.size()?;
    if fits(size) {
        return Ok(());
    }
    if let (Some(identity), Some(end)) = (file.order_identity().filter(|id| !id.block_device), end) {
        earlier_writes(identity, end)?;
        // Asked again even when nothing was pending: a write may have
        // finished, and been retired, since the file was opened.
        size = file.size_now()?;
        if fits(size) {
            return Ok(());
        }
    }
    let what = if file.is_block_device() { "device" } else { "file" };
    Err(Error::InvalidArgument(format!(
        "{}: reading {len} bytes at offset {file_offset} runs past the end of the {what} ({size} bytes)",
        file.display_path().display()
    )))
}

/// A negative file offset is refused before anything is opened.
pub(crate) fn check_file_offset(file_offset: i64, target: &FileTarget<'_>) -> Result<u64> {
    u64::try_from(file_offset)
        .map_err(|_| Error::InvalidArgument(format!("file_offset {file_offset} is negative for {target}")))
}

/// DeepSpeed requires a parallel op's bytes to divide evenly among the
/// workers (it returns -1 otherwise); kept for compatibility.
pub(crate) fn check_divisible(
    direction: Direction,
    len: usize,
    file_offset: i64,
    target: &FileTarget<'_>,
    parallelism: usize,
) -> Result<()> {
    if len % parallelism != 0 {
        return Err(Error::InvalidArgument(format!(
            "parallel {} of {len} bytes at offset {file_offset} of {target} is not divisible by \
             intra_op_parallelism = {parallelism}",
            direction.verb(),
        )));
    }
    Ok(())
}

/// DeepSpeed's `validate=True`: re-reads `[offset, offset + ours.len())` of
/// the file with plain reads and compares. Prints `Pass:`/`Fail:` on stdout
/// (as DeepSpeed does); the op's return code does not change.
pub(crate) fn report_validation(direction: Direction, file: &OpenFile, offset: u64, ours: &[u8]) {
    let verb = direction.verb();
    let name = file.display_path();
    let len = ours.len();
    let line = match read_back(file, offset, len) {
        Ok(theirs) => match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            None => format!("Pass: correctness of {verb} of {len} bytes at offset {offset} of {}", name.display()),
            Some(i) => format!(
                "Fail: correctness of {verb} of {len} bytes at offset {offset} of {}: first difference at byte {i}",
                name.display()
            ),
        },
        Err(e) => format!("Fail: correctness of {verb} of {}: could not re-read: {e}", name.display()),
    };
    crate::rt::log::stdout_line(&line);
}

/// Reads `len` bytes at `offset` with a fresh buffered, read-only descriptor.
fn read_back(file: &OpenFile, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if let Some(bytes) = crate::stripe::read_back(file, offset, len) {
        return bytes;
    }
    let path = match file.path() {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from(format!("/proc/self/fd/{}", file.any_fd())),
    };
    let f = std::fs::File::open(path)?;
    let mut out = vec![0u8; len];
    f.read_exact_at(&mut out, offset)?;
    Ok(out)
}

/// Names an op in messages: "read of N bytes at offset O of PATH".
pub(crate) fn describe_op(direction: Direction, len: usize, file_offset: u64, file: &OpenFile) -> String {
    format!("{} of {len} bytes at offset {file_offset} of {}", direction.verb(), file.display_path().display())
}
