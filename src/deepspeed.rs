//! DeepSpeed's API semantics on top of the core, shared by every front end
//! (the cxx bridge behind DeepSpeed's own compiled bindings, and the pyo3
//! module): the things a DeepSpeed user sees that are not I/O.
//!
//! * **Return codes.** A request DeepSpeed answers with -1 (a file that
//!   cannot be opened or stat-ed, a size that does not divide among the
//!   workers, a read past the end of the file, a negative offset or fd)
//!   returns -1 and prints the reason on stderr. A failed transfer, which the
//!   C++ silently ignored, is an error (`RuntimeError` in Python).
//! * **The GIL.** Calls that block on I/O or on the handle's lock run with
//!   the GIL released (under the `python` feature), even where DeepSpeed's
//!   bindings keep it, so a thread waiting for I/O never stalls the others.
//! * **The write warning** (DeepSpeed's one-time consumer-SSD note), emitted
//!   before the first write, and **the elapsed-time line** `read`/`write`
//!   print on stdout.
//! * **Module functions**: one-shot `aio_read`/`aio_write`, the checked
//!   `deepspeed_memcpy`, the pinned manager's entry points.
//! * **The handle's knobs** arrive whole, as a `DeepSpeedKnobs`
//!   (`config.rs`), from every front end.
//!
//! Nothing here panics into a caller: front ends call these under their own
//! `catch_unwind`, and these never unwind on their own.

use std::time::Instant;

use crate::buffer::BufferDesc;
use crate::config::DeepSpeedKnobs;
use crate::error::{Direction, Error, Result};
use crate::file::FileTarget;
use crate::handle::IoHandle;
use crate::knobs::SIGNAL_POLL_INTERVAL;
use crate::op::OpRequest;
use crate::pinned::PinnedMemoryManager;

/// A tensor as a front end describes it: its bytes, and what
/// `deepspeed_memcpy` needs to know besides.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc {
    /// The tensor's bytes (pointer 0 and length `nbytes` when it has no storage).
    pub buffer: BufferDesc,
    /// False for meta and fake tensors, which have no memory to move.
    pub has_storage: bool,
    pub element_size: usize,
    /// `size(0)`, or 0 for a scalar.
    pub dim0: i64,
}

impl TensorDesc {
    /// The buffer an op may move; a tensor without storage is refused.
    pub fn io_buffer(&self) -> Result<BufferDesc> {
        if !self.has_storage && !self.buffer.is_empty() {
            return Err(Error::InvalidArgument("the tensor has no storage of its own to move (a meta, fake or sparse tensor; \
                 move a sparse one as .to_dense())".into()));
        }
        Ok(self.buffer)
    }
}

/// Runs the signal handlers of a pending signal (on Python's main thread,
/// with the GIL); an exception they raise is kept for the front end to
/// raise when the call returns, and comes back as [`Error::Interrupted`].
/// Ok without Python.
pub fn check_signals() -> Result<()> {
    crate::rt::interpreter::check_signals()
}

/// Runs a call that blocks on I/O (or on a handle's lock) without the GIL.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    crate::rt::interpreter::without_gil(f)
}

/// Requests DeepSpeed answers with -1: print why, return -1. Anything else
/// stays an error.
pub fn code(result: Result<usize>) -> Result<i32> {
    match result {
        Ok(n) => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
        Err(e @ (Error::File { .. } | Error::InvalidArgument(_) | Error::BounceBudget { .. })) => {
            crate::rt::log::error(&e.to_string());
            Ok(-1)
        }
        Err(other) => Err(other),
    }
}

/// Where an op goes, as DeepSpeed's calls name it: a file name, or a
/// caller's descriptor (`async_pwrite(buffer, fd)`).
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    Path(&'a std::path::Path),
    Fd(i32),
}

impl<'a> Target<'a> {
    fn resolve(self) -> Result<FileTarget<'a>> {
        match self {
            Target::Path(p) => Ok(FileTarget::Path(p)),
            Target::Fd(fd) if fd < 0 => {
                Err(Error::InvalidArgument(format!("async_pwrite: fd {fd} is not a file descriptor")))
            }
            Target::Fd(fd) => Ok(FileTarget::Fd(fd)),
        }
    }
}

/// One request as DeepSpeed's calls make it.
pub struct Request<'a> {
    pub direction: Direction,
    pub target: Target<'a>,
    pub file_offset: i64,
    pub tensor: TensorDesc,
    /// The front end's copier and hold on the tensor (see [`crate::buffer::Staging`]).
    pub staging: Option<Box<dyn crate::buffer::Staging>>,
    pub validate: bool,
}

impl<'a> Request<'a> {
    fn into_op(self) -> Result<OpRequest<'a>> {
        Ok(OpRequest {
            direction: self.direction,
            target: self.target.resolve()?,
            file_offset: self.file_offset,
            buffer: self.tensor.io_buffer()?,
            staging: self.staging,
            validate: self.validate,
        })
    }
}

/// `deepspeed_io_handle_t` (aio) or `deepspeed_gds_handle_t` as DeepSpeed's
/// Python API sees it.
pub struct Handle {
    core: IoHandle,
}

impl Handle {
    /// `aio_handle(block_size, queue_depth, single_submit, overlap_events,
    /// intra_op_parallelism)`, or `gds_handle(...)` with `use_gds`. Bad knobs
    /// and a missing GDS raise.
    pub fn new(knobs: &DeepSpeedKnobs) -> Result<Handle> {
        let config = knobs.config()?;
        let core = if knobs.use_gds { blocking(|| IoHandle::new_gds(config))? } else { IoHandle::new(config)? };
        Ok(Handle { core })
    }

    /// `get_alignment()`: the CPU path's parallelism times 512.
    pub fn alignment(&self) -> i32 {
        i32::try_from(self.core.config().alignment()).unwrap_or(i32::MAX)
    }

    /// pread/pwrite/sync_*/async_*: 0 (async), the number of ops completed
    /// (sync), or -1 for a request DeepSpeed refuses.
    pub fn submit(&self, request: Request<'_>, is_async: bool) -> Result<i32> {
        if request.direction == Direction::Write {
            write_warning::emit();
        }
        code(request.into_op().and_then(|op| {
            if is_async {
                blocking(|| self.core.submit(op, true))
            } else {
                blocking(|| {
                    crate::rt::interpreter::raise_kept_interruption(self.core.submit_blocking_with(
                        op,
                        false,
                        SIGNAL_POLL_INTERVAL,
                        &mut check_signals,
                    ))
                })
            }
        }))
    }

    /// read/write: one unsplit synchronous transfer; 0, or -1. Prints
    /// DeepSpeed's `Elapsed time(usec)` line.
    pub fn transfer_inline(&self, request: Request<'_>) -> Result<i32> {
        if request.direction == Direction::Write {
            write_warning::emit();
        }
        let start = Instant::now();
        let rc = code(request.into_op().and_then(|op| blocking(|| self.core.transfer_inline(op))).map(|()| 0))?;
        if rc == 0 {
            elapsed_line(start);
        }
        Ok(rc)
    }

    /// `wait()`: how many ops finished (0 when none were pending).
    /// Waits in steps of [`SIGNAL_POLL_INTERVAL`] without the GIL, running
    /// pending signal handlers between steps: Ctrl-C during a long wait ends
    /// it with KeyboardInterrupt at once (the ops stay pending, their
    /// buffers held, for the next wait or the handle's drop).
    pub fn wait(&self) -> Result<i32> {
        blocking(|| crate::rt::interpreter::raise_kept_interruption(self.core.wait_with(SIGNAL_POLL_INTERVAL, &mut check_signals)))
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
    }

    /// `is_pinned(tensor)`: a torch-pinned or manager-managed CPU tensor.
    pub fn is_pinned(&self, tensor: &TensorDesc) -> bool {
        tensor.has_storage && self.core.is_pinned(&tensor.buffer)
    }

    /// `pin_device_tensor`: registers a CUDA tensor with cuFile.
    pub fn register_device(&self, tensor: &TensorDesc) -> Result<bool> {
        // A tensor without storage is described as empty host memory, which
        // the core refuses (after saying whether this is a GDS handle at all).
        // SAFETY: an empty description is never dereferenced.
        let none = unsafe { BufferDesc::from_raw_parts(std::ptr::null_mut(), 0) };
        let buffer = if tensor.has_storage { tensor.buffer } else { none };
        blocking(|| self.core.register_device_buffer(&buffer))?;
        Ok(true)
    }

    /// `unpin_device_tensor`: deregisters by base; false when none was registered.
    pub fn deregister_device(&self, tensor: &TensorDesc) -> Result<bool> {
        let base = if tensor.has_storage { tensor.buffer.ptr() } else { std::ptr::null_mut() };
        blocking(|| self.core.deregister_device_buffer(base))
    }
}

impl Drop for Handle {
    /// Runs when Python drops the handle (with the GIL held): ops still in
    /// flight are finished without the GIL, as DeepSpeed's destructor does.
    fn drop(&mut self) {
        if self.core.pending_ops() > 0 {
            if let Err(e) = blocking(|| self.core.wait()) {
                crate::rt::log::error(&format!("handle dropped with ops in flight; finishing them failed: {e}"));
            }
        }
    }
}

/// `aio_read`/`aio_write`: a one-shot whole-buffer transfer on the calling
/// thread with the given knobs (their parallelism is 1, whatever `knobs`
/// says); 0, or -1. No handle (no worker threads) is made: the calling
/// thread's cached engine moves the bytes.
pub fn one_shot(request: Request<'_>, knobs: &DeepSpeedKnobs) -> Result<i32> {
    // Raised, not -1: the environment, not the request, is wrong.
    crate::config::check_settings()?;
    let config = match (DeepSpeedKnobs { intra_op_parallelism: 1, use_gds: false, ..*knobs }).config() {
        Ok(c) => c,
        Err(e) => return code(Err(e)),
    };
    if request.direction == Direction::Write {
        write_warning::emit();
    }
    let start = Instant::now();
    let rc = code(request.into_op().and_then(|op| blocking(|| IoHandle::transfer_once(&config, op))).map(|()| 0))?;
    if rc == 0 {
        elapsed_line(start);
    }
    Ok(rc)
}

/// DeepSpeed's `read`/`write` print this on stdout.
fn elapsed_line(start: Instant) {
    let usec = start.elapsed().as_secs_f64() * 1e6;
    crate::rt::log::stdout_line(&format!("Elapsed time(usec): aio = {usec:.0} call = {usec:.0}"));
}

/// `deepspeed_memcpy(dest, src)`: copies `dest.size(0)` 4-byte elements,
/// after checking both are contiguous CPU float32-sized tensors holding that
/// many bytes (the C++ overran instead).
pub fn memcpy_f32(dest: &TensorDesc, src: &TensorDesc) -> Result<i32> {
    let n = usize::try_from(dest.dim0.max(0)).unwrap_or(0);
    let bytes = n * 4;
    for (name, t) in [("dest", dest), ("src", src)] {
        if !(t.buffer.is_host() && t.buffer.is_contiguous() && t.has_storage) {
            return Err(Error::InvalidArgument(format!("deepspeed_memcpy: {name} must be a contiguous CPU tensor")));
        }
        if t.element_size != 4 {
            return Err(Error::InvalidArgument(format!(
                "deepspeed_memcpy copies 4-byte (float32) elements; {name} has {}-byte elements",
                t.element_size
            )));
        }
        if t.buffer.len() < bytes {
            return Err(Error::InvalidArgument(format!(
                "deepspeed_memcpy: {name} holds {} bytes, fewer than dest.size(0) * 4 = {bytes}",
                t.buffer.len()
            )));
        }
    }
    // SAFETY: both descriptions hold at least `bytes` valid bytes (their
    // contract, and the checks above); copy handles overlap like memmove.
    unsafe { std::ptr::copy(src.buffer.ptr() as *const u8, dest.buffer.ptr(), bytes) };
    Ok(0)
}

/// `new_cpu_locked_tensor` for a front end whose tensor owns its memory:
/// `num_elem * element_size` new bytes of locked memory, managed (so every
/// handle recognises them) and freed when the returned buffer is dropped;
/// [`pinned_free`] may unmanage them earlier, as DeepSpeed's
/// `free_cpu_locked_tensor` does, while the memory stays mapped for its owner.
pub fn pinned_alloc_owned(num_elem: i64, element_size: usize) -> Result<crate::pinned::LockedBuffer> {
    crate::config::check_settings()?;
    let bytes = locked_bytes(num_elem, element_size)?;
    blocking(|| crate::pinned::LockedBuffer::new(bytes))
}

fn locked_bytes(num_elem: i64, element_size: usize) -> Result<usize> {
    usize::try_from(num_elem).ok().and_then(|n| n.checked_mul(element_size)).ok_or_else(|| {
        Error::InvalidArgument(format!("cannot allocate {num_elem} elements of {element_size} bytes of locked memory"))
    })
}

/// `pin_handle.is_pinned(buffer)`: torch-pinned, or inside a managed region.
pub fn pinned_or_managed(tensor: &TensorDesc) -> bool {
    tensor.has_storage && (tensor.buffer.is_declared_pinned() || pinned_is_managed(tensor))
}

/// `deepspeed_pin_tensor_t::free`: frees the allocation based exactly at `base`.
pub fn pinned_free(base: usize) -> bool {
    PinnedMemoryManager::shared().free(base as *const u8)
}

/// `deepspeed_pin_tensor_t::free(tensor)` / `free_cpu_locked_tensor`: frees
/// the allocation only when the tensor covers exactly that allocation (its
/// base and its size, in any dtype or shape). A narrower view that starts at
/// the base (`t[:k]`) passes DeepSpeed's base check and frees memory that `t`
/// still uses; here it is refused (false) with a message naming both extents.
pub fn pinned_free_tensor(tensor: &TensorDesc) -> bool {
    if !tensor.has_storage || !tensor.buffer.is_host() {
        return false;
    }
    let (ptr, len) = (tensor.buffer.ptr() as usize, tensor.buffer.len());
    let manager = PinnedMemoryManager::shared();
    match manager.region_of(ptr as *const u8) {
        Some((base, bytes)) if base == ptr && bytes == len => manager.free(ptr as *const u8),
        Some((base, bytes)) if base == ptr => {
            crate::rt::log::info(&format!(
                "free_cpu_locked_tensor: refused: the tensor is {len} bytes at {ptr:#x}, a view of the {bytes}-byte                  locked allocation there; free the tensor that new_cpu_locked_tensor returned (nothing was freed)"
            ));
            false
        }
        _ => false,
    }
}

/// `deepspeed_pin_tensor_t::is_managed`: the tensor lies wholly inside one allocation.
pub fn pinned_is_managed(tensor: &TensorDesc) -> bool {
    let b = tensor.buffer;
    b.is_host() && tensor.has_storage && PinnedMemoryManager::shared().is_managed(b.ptr(), b.len())
}

/// DeepSpeed's one-time warning that heavy NVMe offload wears out consumer
/// SSDs. Process-wide; with the `python` feature it is a Python warning
/// (`deepnvme.DeepNVMeWarning`, which `warnings` filters can silence) and
/// honours DeepSpeed's cross-extension marker attribute, else it prints on
/// stderr. It never affects an I/O.
pub mod write_warning {
    use std::sync::atomic::{AtomicBool, Ordering};

    pub const MESSAGE: &str = "Offloading to NVMe can generate heavy write traffic. On consumer/home SSDs, \
        repeated offloading (optimizer states, parameters, hidden states) can exhaust the drive's rated write \
        endurance (TBW) and shorten its life. Prefer enterprise/datacenter SSDs for sustained offloading.";

    static EMITTED: AtomicBool = AtomicBool::new(false);

    /// Emits the warning the first time it is called in this process. Call it
    /// before taking any lock: the first call may need the GIL.
    pub fn emit() {
        if EMITTED.swap(true, Ordering::AcqRel) {
            return;
        }
        if !crate::rt::interpreter::emit_write_warning(MESSAGE) {
            crate::rt::log::info(MESSAGE);
        }
    }
}
