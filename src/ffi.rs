//! The one cxx bridge between the Rust core and the C++ shims in `cpp/`.
//!
//! The shims do torch glue only: they turn a `torch::Tensor` into a
//! [`bridge::TensorInfo`] (pointer, bytes, device, pinned, contiguity) and
//! hand Rust an `io_op_desc_t` that can copy between the tensor and a host
//! bounce buffer. Everything else — validation, the bounce decision,
//! scheduling, I/O, bookkeeping and errors — happens here.
//!
//! Error contract, as DeepSpeed documents it: a request DeepSpeed answers
//! with -1 (a file that cannot be opened or stat-ed, a size that does not
//! divide among the workers, a read past the end of the file, a negative
//! offset) returns -1 and prints the reason on stderr. A failed transfer,
//! which the C++ silently ignored, is an error: cxx throws `rust::Error` and
//! pybind11 turns it into a Python `RuntimeError`. No panic crosses the
//! boundary: every entry point runs under `catch_unwind`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cxx::UniquePtr;

use crate::config::HandleConfig;
use crate::error::{Direction, Error};
use crate::file::FileTarget;
use crate::gds::op::{self as gds_op, GdsOpRequest};
use crate::gds::{GdsDriver, GdsDriverGuard};
use crate::handle::IoHandle as CoreHandle;
use crate::op::{BufferDesc, OpRequest, Staging};
use crate::pinned::PinnedMemoryManager;

#[cxx::bridge(namespace = "deepnvme::ffi")]
#[allow(clippy::too_many_arguments)] // DeepSpeed's signatures, flattened
pub mod bridge {
    /// What the torch glue learned about a tensor.
    #[derive(Debug, Clone, Copy)]
    struct TensorInfo {
        /// `data_ptr()`, or 0 for a tensor without storage.
        ptr: usize,
        /// `nbytes()`: element count times element size.
        nbytes: usize,
        element_size: usize,
        /// `size(0)`, or 0 for a scalar.
        dim0: i64,
        is_cpu: bool,
        is_cuda: bool,
        device_index: i32,
        /// `is_pinned()` (only asked of CPU tensors).
        torch_pinned: bool,
        contiguous: bool,
        has_storage: bool,
    }

    unsafe extern "C++" {
        include!("deepspeed_aio_op_desc.h");

        /// The torch half of one op: holds the caller's tensor alive and
        /// copies it to or from a host bounce buffer.
        #[namespace = ""]
        type io_op_desc_t;

        /// Tensor -> host memory at `host_addr` (before a bounced write).
        fn copy_to_host(self: &io_op_desc_t, host_addr: usize, nbytes: usize) -> Result<()>;
        /// Host memory at `host_addr` -> tensor (after a bounced read).
        fn copy_from_host(self: &io_op_desc_t, host_addr: usize, nbytes: usize) -> Result<()>;
    }

    extern "Rust" {
        /// A DeepNVMe handle (aio or, with `gds`, the CPU half of a GDS handle).
        type IoHandle;

        fn new_io_handle(
            block_size: i32,
            queue_depth: i32,
            single_submit: bool,
            overlap_events: bool,
            intra_op_parallelism: i32,
            use_gds: bool,
        ) -> Result<Box<IoHandle>>;

        /// `get_alignment()`: the CPU path's parallelism times 512.
        fn alignment(self: &IoHandle) -> i32;

        /// pread/pwrite/sync_*/async_*: returns 0 (async), the number of ops
        /// completed (sync), or -1 for a request DeepSpeed refuses.
        fn submit(
            self: &IoHandle,
            read: bool,
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            use_fd: bool,
            fd: i32,
            validate: bool,
            is_async: bool,
            file_offset: i64,
        ) -> Result<i32>;

        /// read/write: one unsplit synchronous transfer; 0, or -1.
        fn transfer_inline(
            self: &IoHandle,
            read: bool,
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            validate: bool,
            file_offset: i64,
        ) -> Result<i32>;

        fn wait(self: &IoHandle) -> Result<i32>;
        fn is_pinned(self: &IoHandle, info: &TensorInfo) -> bool;

        /// gds_handle: cuFileBufRegister a CUDA tensor (`pin_device_tensor`).
        fn gds_register(self: &IoHandle, info: &TensorInfo) -> Result<bool>;
        /// gds_handle: cuFileBufDeregister by base (`unpin_device_tensor`).
        fn gds_deregister(self: &IoHandle, info: &TensorInfo) -> Result<bool>;

        /// `aio_read`/`aio_write`: a one-shot whole-buffer transfer with a
        /// fresh single-worker handle; 0, or -1.
        fn one_shot_transfer(
            read: bool,
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            block_size: i32,
            queue_depth: i32,
            single_submit: bool,
            overlap_events: bool,
            validate: bool,
        ) -> Result<i32>;

        /// `deepspeed_memcpy`: copies `dest.size(0)` 4-byte elements.
        fn memcpy_f32(dest: &TensorInfo, src: &TensorInfo) -> Result<i32>;

        /// The process-wide pinned-memory manager.
        fn pinned_alloc(num_elem: i64, element_size: usize) -> Result<usize>;
        fn pinned_free(base: usize) -> bool;
        fn pinned_is_managed(info: &TensorInfo) -> bool;

        /// DeepSpeed's one-time consumer-SSD write warning.
        fn warn_consumer_ssd_writes();
    }
}

/// Runs `f`, turning a panic into an error so it never unwinds into C++.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(Error::Engine(format!("internal error in {what}: {msg}")))
        }
    }
}

/// Runs a call that blocks on I/O (or on the handle's lock) without the GIL.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "python")]
    {
        crate::python::without_gil(f)
    }
    #[cfg(not(feature = "python"))]
    {
        f()
    }
}

/// Requests DeepSpeed answers with -1: print why, return -1.
fn request_error_to_code(e: Error) -> Result<i32, Error> {
    match e {
        Error::File { .. } | Error::InvalidArgument(_) => {
            crate::log::error(&e.to_string());
            Ok(-1)
        }
        other => Err(other),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Copies through the torch glue when an op bounces.
struct TorchStaging {
    op: UniquePtr<bridge::io_op_desc_t>,
}

// SAFETY: the C++ object only holds a tensor reference; torch copies are
// thread-safe, and the op is used by one thread at a time.
unsafe impl Send for TorchStaging {}

impl Staging for TorchStaging {
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> crate::Result<()> {
        self.op.copy_to_host(bounce.as_mut_ptr() as usize, bounce.len()).map_err(|e| Error::Copy(e.to_string()))
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> crate::Result<()> {
        self.op.copy_from_host(bounce.as_ptr() as usize, bounce.len()).map_err(|e| Error::Copy(e.to_string()))
    }
}

fn buffer_of(info: &bridge::TensorInfo) -> Result<BufferDesc, Error> {
    if !info.has_storage && info.nbytes > 0 {
        return Err(Error::InvalidArgument("the tensor has no storage (meta or fake tensor)".into()));
    }
    Ok(BufferDesc {
        ptr: info.ptr as *mut u8,
        len: info.nbytes,
        is_host: info.is_cpu,
        contiguous: info.contiguous,
        pinned: info.is_cpu && info.torch_pinned,
    })
}

fn path_of(filename: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(filename))
}

fn direction(read: bool) -> Direction {
    if read {
        Direction::Read
    } else {
        Direction::Write
    }
}

fn request<'a>(
    read: bool,
    op: UniquePtr<bridge::io_op_desc_t>,
    info: &bridge::TensorInfo,
    target: FileTarget<'a>,
    validate: bool,
    file_offset: i64,
) -> Result<OpRequest<'a>, Error> {
    Ok(OpRequest {
        direction: direction(read),
        target,
        file_offset,
        buffer: buffer_of(info)?,
        staging: if op.is_null() { None } else { Some(Box::new(TorchStaging { op })) },
        validate,
    })
}

/// The GPUDirect half of a `gds_handle`.
struct GdsState {
    driver: Arc<GdsDriverGuard>,
    /// DeepSpeed's intra_op_parallelism, applied to cuFile transfers.
    parallelism: usize,
    block_size: usize,
}

/// The handle behind `deepspeed_io_handle_t`. A `gds_handle` also holds a
/// reference on the cuFile driver; its CPU path runs on one worker, as in
/// DeepSpeed.
pub struct IoHandle {
    core: CoreHandle,
    gds: Option<GdsState>,
    /// Why a `gds_handle` made with `DEEPNVME_GDS_CPU_ONLY=1` has no GPUDirect half.
    gds_unavailable: Option<String>,
}

/// Lets a `gds_handle` be created where GPUDirect Storage is unavailable,
/// serving CPU tensors only (device calls then fail, naming what is
/// missing). Off by default: creating one then raises.
pub const GDS_CPU_ONLY_ENV: &str = "DEEPNVME_GDS_CPU_ONLY";

fn new_io_handle(
    block_size: i32,
    queue_depth: i32,
    single_submit: bool,
    overlap_events: bool,
    intra_op_parallelism: i32,
    use_gds: bool,
) -> Result<Box<IoHandle>, Error> {
    guarded("aio_handle()", || {
        let config = HandleConfig::from_deepspeed(
            block_size as i64,
            queue_depth as i64,
            single_submit,
            overlap_events,
            intra_op_parallelism as i64,
        )?;
        if !use_gds {
            return Ok(Box::new(IoHandle { core: CoreHandle::new(config)?, gds: None, gds_unavailable: None }));
        }
        let cpu_config = HandleConfig { intra_op_parallelism: 1, ..config.clone() };
        if let Err(why) = crate::gds::probe() {
            if std::env::var(GDS_CPU_ONLY_ENV).as_deref() == Ok("1") {
                crate::log::info_once(
                    "gds-cpu-only",
                    &format!("gds_handle without GPUDirect Storage ({why}); {GDS_CPU_ONLY_ENV}=1, so it serves CPU tensors only"),
                );
                return Ok(Box::new(IoHandle { core: CoreHandle::new(cpu_config)?, gds: None, gds_unavailable: Some(why) }));
            }
            return Err(Error::Gds(format!(
                "gds_handle cannot be created: {why} (set {GDS_CPU_ONLY_ENV}=1 for a handle that serves CPU tensors only)"
            )));
        }
        let driver = GdsDriver::acquire(config.queue_depth, config.intra_op_parallelism, config.block_size)?;
        let gds = GdsState {
            driver: Arc::new(driver),
            parallelism: config.intra_op_parallelism,
            block_size: config.block_size,
        };
        Ok(Box::new(IoHandle { core: CoreHandle::new(cpu_config)?, gds: Some(gds), gds_unavailable: None }))
    })
}

impl Drop for IoHandle {
    /// Runs when Python drops the handle (with the GIL held): ops still in
    /// flight are finished without the GIL, as DeepSpeed's destructor does.
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if self.core.pending_ops() > 0 {
                if let Err(e) = blocking(|| self.core.wait()) {
                    crate::log::error(&format!("handle dropped with ops in flight; finishing them failed: {e}"));
                }
            }
        }));
    }
}

impl IoHandle {
    fn alignment(&self) -> i32 {
        count(self.core.config().alignment())
    }

    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        read: bool,
        op: UniquePtr<bridge::io_op_desc_t>,
        info: &bridge::TensorInfo,
        filename: &[u8],
        use_fd: bool,
        fd: i32,
        validate: bool,
        is_async: bool,
        file_offset: i64,
    ) -> Result<i32, Error> {
        guarded(if read { "pread" } else { "pwrite" }, || {
            if !read {
                write_warning::emit();
            }
            let target = match (use_fd, fd) {
                (true, fd) if fd < 0 => {
                    return request_error_to_code(Error::InvalidArgument(format!(
                        "async_pwrite: fd {fd} is not a file descriptor"
                    )))
                }
                (true, fd) => FileTarget::Fd(fd),
                (false, _) => FileTarget::Path(path_of(filename)),
            };
            let submitted = match &self.gds {
                // Contiguous CUDA tensors go through cuFile; anything else
                // (CPU, strided) takes the CPU path, bouncing as needed.
                Some(gds) if info.is_cuda && info.contiguous && info.has_storage => {
                    let req = GdsOpRequest {
                        direction: direction(read),
                        target,
                        file_offset,
                        device_ptr: info.ptr as u64,
                        len: info.nbytes,
                        device_ordinal: info.device_index.max(0),
                        staging: if op.is_null() { None } else { Some(Box::new(TorchStaging { op })) },
                        validate,
                    };
                    blocking(|| {
                        gds_op::prepare(&gds.driver, req, gds.parallelism, gds.block_size)
                            .and_then(|prepared| self.core.submit_prepared(prepared, is_async))
                    })
                }
                None if info.is_cuda && self.gds_unavailable.is_some() => Err(Error::Gds(format!(
                    "this gds_handle has no GPUDirect Storage: {}",
                    self.gds_unavailable.as_deref().unwrap_or_default()
                ))),
                _ => request(read, op, info, target, validate, file_offset)
                    .and_then(|req| blocking(|| self.core.submit(req, is_async))),
            };
            match submitted {
                Ok(n) => Ok(count(n)),
                Err(e) => request_error_to_code(e),
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn transfer_inline(
        &self,
        read: bool,
        op: UniquePtr<bridge::io_op_desc_t>,
        info: &bridge::TensorInfo,
        filename: &[u8],
        validate: bool,
        file_offset: i64,
    ) -> Result<i32, Error> {
        guarded(if read { "read" } else { "write" }, || {
            if !read {
                write_warning::emit();
            }
            let start = Instant::now();
            let req = match request(read, op, info, FileTarget::Path(path_of(filename)), validate, file_offset) {
                Ok(r) => r,
                Err(e) => return request_error_to_code(e),
            };
            match blocking(|| self.core.transfer_inline(req)) {
                Ok(()) => {
                    let usec = start.elapsed().as_secs_f64() * 1e6;
                    println!("Elapsed time(usec): aio = {usec:.0} call = {usec:.0}");
                    Ok(0)
                }
                Err(e) => request_error_to_code(e),
            }
        })
    }

    fn wait(&self) -> Result<i32, Error> {
        guarded("wait", || blocking(|| self.core.wait()).map(count))
    }

    fn gds_state(&self) -> Result<&GdsState, Error> {
        self.gds.as_ref().ok_or_else(|| match &self.gds_unavailable {
            Some(why) => Error::Gds(format!("this gds_handle has no GPUDirect Storage: {why}")),
            None => Error::Gds("device tensors can only be registered through a gds_handle".into()),
        })
    }

    fn gds_register(&self, info: &bridge::TensorInfo) -> Result<bool, Error> {
        guarded("pin_device_tensor", || {
            let gds = self.gds_state()?;
            if !(info.is_cuda && info.has_storage) {
                return Err(Error::InvalidArgument("pin_device_tensor takes a CUDA tensor".into()));
            }
            blocking(|| gds.driver.register_device_buffer(info.ptr as u64, info.nbytes))?;
            Ok(true)
        })
    }

    fn gds_deregister(&self, info: &bridge::TensorInfo) -> Result<bool, Error> {
        guarded("unpin_device_tensor", || {
            let gds = self.gds_state()?;
            if !info.has_storage {
                return Ok(false);
            }
            blocking(|| gds.driver.deregister_device_buffer(info.ptr as u64))
        })
    }

    fn is_pinned(&self, info: &bridge::TensorInfo) -> bool {
        catch_unwind(AssertUnwindSafe(|| {
            info.is_cpu
                && info.has_storage
                && self.core.is_pinned(info.ptr as *const u8, info.nbytes, info.torch_pinned)
        }))
        .unwrap_or(false)
    }
}

#[allow(clippy::too_many_arguments)]
fn one_shot_transfer(
    read: bool,
    op: UniquePtr<bridge::io_op_desc_t>,
    info: &bridge::TensorInfo,
    filename: &[u8],
    block_size: i32,
    queue_depth: i32,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> Result<i32, Error> {
    guarded(if read { "aio_read" } else { "aio_write" }, || {
        let handle = match new_io_handle(block_size, queue_depth, single_submit, overlap_events, 1, false) {
            Ok(h) => h,
            Err(e) => return request_error_to_code(e),
        };
        handle.transfer_inline(read, op, info, filename, validate, 0)
    })
}

fn memcpy_f32(dest: &bridge::TensorInfo, src: &bridge::TensorInfo) -> Result<i32, Error> {
    guarded("deepspeed_memcpy", || {
        let n = usize::try_from(dest.dim0.max(0)).unwrap_or(0);
        let bytes = n * 4;
        for (name, t) in [("dest", dest), ("src", src)] {
            if !(t.is_cpu && t.contiguous && t.has_storage) {
                return Err(Error::InvalidArgument(format!("deepspeed_memcpy: {name} must be a contiguous CPU tensor")));
            }
            if t.element_size != 4 {
                return Err(Error::InvalidArgument(format!(
                    "deepspeed_memcpy copies 4-byte (float32) elements; {name} has {}-byte elements",
                    t.element_size
                )));
            }
            if t.nbytes < bytes {
                return Err(Error::InvalidArgument(format!(
                    "deepspeed_memcpy: {name} holds {} bytes, fewer than dest.size(0) * 4 = {bytes}",
                    t.nbytes
                )));
            }
        }
        // SAFETY: both ranges were checked to be at least `bytes` long; copy
        // handles overlap like memmove.
        unsafe { std::ptr::copy(src.ptr as *const u8, dest.ptr as *mut u8, bytes) };
        Ok(0)
    })
}

fn pinned_alloc(num_elem: i64, element_size: usize) -> Result<usize, Error> {
    guarded("new_cpu_locked_tensor", || {
        let bytes = usize::try_from(num_elem)
            .ok()
            .and_then(|n| n.checked_mul(element_size))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "cannot allocate {num_elem} elements of {element_size} bytes of locked memory"
                ))
            })?;
        blocking(|| PinnedMemoryManager::shared().alloc(bytes)).map(|p| p.as_ptr() as usize)
    })
}

fn pinned_free(base: usize) -> bool {
    catch_unwind(|| PinnedMemoryManager::shared().free(base as *const u8)).unwrap_or(false)
}

fn pinned_is_managed(info: &bridge::TensorInfo) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        info.is_cpu && info.has_storage && PinnedMemoryManager::shared().is_managed(info.ptr as *const u8, info.nbytes)
    }))
    .unwrap_or(false)
}

fn warn_consumer_ssd_writes() {
    let _ = catch_unwind(write_warning::emit);
}

/// DeepSpeed's one-time warning that heavy NVMe offload wears out consumer
/// SSDs. Process-wide; with the `python` feature it goes through
/// `deepspeed.utils.logger.warning` and honours the cross-extension marker
/// attribute, else it prints on stderr. It must never affect an I/O.
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
        #[cfg(feature = "python")]
        {
            if crate::python::emit_write_warning(MESSAGE) {
                return;
            }
        }
        crate::log::info(MESSAGE);
    }
}
