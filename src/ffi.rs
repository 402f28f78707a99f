//! The one cxx bridge between the Rust core and the C++ shims in `cpp/`:
//! conversion and error mapping only.
//!
//! The shims turn a `torch::Tensor` into a [`bridge::TensorInfo`] (pointer,
//! bytes, device, pinned, contiguity) and hand Rust an `io_op_desc_t` that
//! holds the tensor and copies it to or from host memory. This file turns
//! those into the core's types ([`TensorDesc`], [`Staging`]) and calls
//! [`crate::deepspeed`], where DeepSpeed's semantics live (return codes, the
//! GDS routing, the write warning, the elapsed-time line, memcpy checks). A
//! core `Err` becomes a C++ exception (`rust::Error`), which pybind11 turns
//! into `RuntimeError`. No panic crosses the boundary: every entry point
//! runs under `catch_unwind`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use cxx::UniquePtr;

use crate::buffer::{BufferDesc, Location, Staging};
use crate::config::DeepSpeedKnobs;
use crate::deepspeed::{self, Handle, Request, Target, TensorDesc};
use crate::error::{catch_panic, Direction, Error};
use crate::resize_hold::{ResizableStorage, ResizeHold};

#[cxx::bridge(namespace = "deepnvme::ffi")]
pub mod bridge {
    /// DeepSpeed's handle knobs, whole, as the C++ classes were given them.
    #[derive(Debug, Clone, Copy)]
    struct HandleKnobs {
        block_size: i32,
        queue_depth: i32,
        single_submit: bool,
        overlap_events: bool,
        intra_op_parallelism: i32,
        /// A `gds_handle` (CUDA tensors through cuFile).
        use_gds: bool,
    }

    /// Where and how one op goes: all of a DeepSpeed call but the tensor
    /// and the file name.
    #[derive(Debug, Clone, Copy)]
    struct OpPlace {
        read: bool,
        /// `fd` names the file (`async_pwrite(buffer, fd)`), not the file name.
        use_fd: bool,
        fd: i32,
        validate: bool,
        /// Async (`pread(..., async=True)`, `async_*`) rather than blocking.
        is_async: bool,
        file_offset: i64,
    }

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
        /// The tensor's data address and byte size now (0, 0 without storage).
        fn data_address(self: &io_op_desc_t) -> usize;
        fn data_bytes(self: &io_op_desc_t) -> usize;
        /// The storage's StorageImpl address (0 without one), and its
        /// resizable flag: see `resize_hold.rs`.
        fn storage_id(self: &io_op_desc_t) -> usize;
        fn storage_resizable(self: &io_op_desc_t) -> bool;
        fn set_storage_resizable(self: &io_op_desc_t, resizable: bool);
    }

    extern "Rust" {
        /// A DeepNVMe handle (aio or, with `gds`, the CPU half of a GDS handle).
        type IoHandle;

        fn new_io_handle(knobs: &HandleKnobs) -> Result<Box<IoHandle>>;

        /// `get_alignment()`: the CPU path's parallelism times 512.
        fn alignment(self: &IoHandle) -> i32;

        /// pread/pwrite/sync_*/async_*: returns 0 (async), the number of ops
        /// completed (sync), or -1 for a request DeepSpeed refuses.
        fn submit(
            self: &IoHandle,
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            place: &OpPlace,
        ) -> Result<i32>;

        /// read/write: one unsplit synchronous transfer; 0, or -1.
        fn transfer_inline(
            self: &IoHandle,
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            place: &OpPlace,
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
            op: UniquePtr<io_op_desc_t>,
            info: &TensorInfo,
            filename: &[u8],
            knobs: &HandleKnobs,
            place: &OpPlace,
        ) -> Result<i32>;

        /// `deepspeed_memcpy`: copies `dest.size(0)` 4-byte elements.
        fn memcpy_f32(dest: &TensorInfo, src: &TensorInfo) -> Result<i32>;

        /// The process-wide pinned-memory manager. `new_cpu_locked_tensor`'s
        /// memory belongs to the tensor made over it: the glue hands the box
        /// to the tensor's deleter, so the memory is unlocked and unmapped
        /// when the last tensor using it is gone (or unmanaged earlier by
        /// `free`), never left locked by a tensor nobody can free any more.
        type LockedMemory;
        fn pinned_alloc(num_elem: i64, element_size: usize) -> Result<Box<LockedMemory>>;
        fn address(self: &LockedMemory) -> usize;
        fn pinned_free(base: usize) -> bool;
        fn pinned_free_tensor(info: &TensorInfo) -> bool;
        fn pinned_is_managed(info: &TensorInfo) -> bool;

        /// DeepSpeed's one-time consumer-SSD write warning.
        fn warn_consumer_ssd_writes();
    }
}

/// Copies through the torch glue when an op bounces, and holds the caller's
/// tensor (the C++ object owns a reference) until the op is finished.
struct TorchStaging {
    op: UniquePtr<bridge::io_op_desc_t>,
    /// A torch-pinned tensor's storage, held unresizable while the op's
    /// direct I/O uses its bytes (see [`staging`]); let go on drop.
    resize_hold: Option<ResizeHold>,
}

impl ResizableStorage for bridge::io_op_desc_t {
    fn storage_id(&self) -> usize {
        bridge::io_op_desc_t::storage_id(self)
    }
    fn resizable(&self) -> bool {
        self.storage_resizable()
    }
    fn set_resizable(&self, resizable: bool) {
        self.set_storage_resizable(resizable)
    }
}

impl Drop for TorchStaging {
    /// Before the glue's object (and its hold on the storage) goes.
    fn drop(&mut self) {
        if let (Some(hold), Some(op)) = (self.resize_hold.take(), self.op.as_ref()) {
            hold.release(op);
        }
    }
}

// SAFETY: the C++ object only holds a tensor reference; torch copies are
// thread-safe, and the op is used by one thread at a time.
unsafe impl Send for TorchStaging {}

impl Staging for TorchStaging {
    // Device and strided tensors are copied by torch, under the GIL too: no
    // Python thread can resize or free the tensor meanwhile (the ownership rule).
    fn copy_to_bounce(&mut self, bounce: &mut [u8]) -> crate::Result<()> {
        let op = &self.op;
        crate::rt::interpreter::with_interpreter_lock(|| {
            op.copy_to_host(bounce.as_mut_ptr() as usize, bounce.len()).map_err(|e| Error::Copy(e.to_string()))
        })
    }
    fn copy_from_bounce(&mut self, bounce: &[u8]) -> crate::Result<()> {
        let op = &self.op;
        crate::rt::interpreter::with_interpreter_lock(|| {
            op.copy_from_host(bounce.as_ptr() as usize, bounce.len()).map_err(|e| Error::Copy(e.to_string()))
        })
    }
    fn current_extent(&self) -> Option<(usize, usize)> {
        Some((self.op.data_address(), self.op.data_bytes()))
    }
    /// Under the GIL: Python code can then neither free nor swap the
    /// tensor's storage (`resize_`, `set_`, `del`).
    fn hold_still(&self, access: &mut dyn FnMut() -> crate::Result<()>) -> crate::Result<()> {
        crate::rt::interpreter::with_interpreter_lock(access)
    }
}

/// The op's staging. A torch-pinned tensor goes straight to the I/O (it is
/// contiguous page-locked host memory: `op/mod.rs`), where a growing
/// `resize_` would free the bytes the kernel reads or writes and hand them
/// to the next `pin_memory()`: its storage is held unresizable until the op
/// is finished (`resize_` then raises). Memory that bounces needs no hold:
/// its copies check where the tensor is (`op/caller.rs`).
fn staging(op: UniquePtr<bridge::io_op_desc_t>, info: &bridge::TensorInfo) -> Option<Box<dyn Staging>> {
    let desc = op.as_ref()?;
    let direct = info.is_cpu && info.torch_pinned && info.contiguous && info.has_storage;
    let resize_hold = if direct { ResizeHold::take(desc) } else { None };
    Some(Box::new(TorchStaging { op, resize_hold }))
}

/// The core's view of a tensor the glue described.
fn tensor(info: &bridge::TensorInfo) -> TensorDesc {
    let location = if info.is_cpu {
        Location::Host
    } else if info.is_cuda {
        Location::Cuda(info.device_index)
    } else {
        Location::OtherDevice
    };
    // SAFETY: the glue's io_op_desc_t holds the tensor (and so its storage)
    // until the op that uses this description is finished: the core keeps
    // it as the op's Staging. Calls without an op (is_pinned, memcpy,
    // pinned_*) use the memory only during the call, while the caller's
    // tensor is alive.
    let buffer = unsafe { BufferDesc::from_raw_parts(info.ptr as *mut u8, info.nbytes) }
        .located(location)
        .contiguous(info.contiguous)
        .pinned(info.is_cpu && info.torch_pinned);
    TensorDesc { buffer, has_storage: info.has_storage, element_size: info.element_size, dim0: info.dim0 }
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
    op: UniquePtr<bridge::io_op_desc_t>,
    info: &bridge::TensorInfo,
    target: Target<'a>,
    place: &bridge::OpPlace,
) -> Request<'a> {
    let staging = staging(op, info);
    Request {
        direction: direction(place.read),
        target,
        file_offset: place.file_offset,
        tensor: tensor(info),
        staging,
        validate: place.validate,
    }
}

/// The core's knobs from the C++ class's.
fn knobs(k: &bridge::HandleKnobs) -> DeepSpeedKnobs {
    DeepSpeedKnobs {
        block_size: k.block_size.into(),
        queue_depth: k.queue_depth.into(),
        single_submit: k.single_submit,
        overlap_events: k.overlap_events,
        intra_op_parallelism: k.intra_op_parallelism.into(),
        use_gds: k.use_gds,
    }
}

/// For entry points that answer with a value instead of an error.
fn or_default<T: Default>(f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_default()
}

/// The handle behind `deepspeed_io_handle_t` / `deepspeed_gds_handle_t`.
pub struct IoHandle(Handle);

fn new_io_handle(k: &bridge::HandleKnobs) -> Result<Box<IoHandle>, Error> {
    catch_panic("aio_handle()", || Handle::new(&knobs(k)).map(|h| Box::new(IoHandle(h))))
}

impl IoHandle {
    fn alignment(&self) -> i32 {
        self.0.alignment()
    }

    fn submit(
        &self,
        op: UniquePtr<bridge::io_op_desc_t>,
        info: &bridge::TensorInfo,
        filename: &[u8],
        place: &bridge::OpPlace,
    ) -> Result<i32, Error> {
        catch_panic(if place.read { "pread" } else { "pwrite" }, || {
            let target = if place.use_fd { Target::Fd(place.fd) } else { Target::Path(path_of(filename)) };
            self.0.submit(request(op, info, target, place), place.is_async)
        })
    }

    fn transfer_inline(
        &self,
        op: UniquePtr<bridge::io_op_desc_t>,
        info: &bridge::TensorInfo,
        filename: &[u8],
        place: &bridge::OpPlace,
    ) -> Result<i32, Error> {
        catch_panic(if place.read { "read" } else { "write" }, || {
            self.0.transfer_inline(request(op, info, Target::Path(path_of(filename)), place))
        })
    }

    fn wait(&self) -> Result<i32, Error> {
        catch_panic("wait", || self.0.wait())
    }

    fn is_pinned(&self, info: &bridge::TensorInfo) -> bool {
        or_default(|| self.0.is_pinned(&tensor(info)))
    }

    fn gds_register(&self, info: &bridge::TensorInfo) -> Result<bool, Error> {
        catch_panic("pin_device_tensor", || self.0.register_device(&tensor(info)))
    }

    fn gds_deregister(&self, info: &bridge::TensorInfo) -> Result<bool, Error> {
        catch_panic("unpin_device_tensor", || self.0.deregister_device(&tensor(info)))
    }
}

fn one_shot_transfer(
    op: UniquePtr<bridge::io_op_desc_t>,
    info: &bridge::TensorInfo,
    filename: &[u8],
    k: &bridge::HandleKnobs,
    place: &bridge::OpPlace,
) -> Result<i32, Error> {
    catch_panic(if place.read { "aio_read" } else { "aio_write" }, || {
        deepspeed::one_shot(request(op, info, Target::Path(path_of(filename)), place), &knobs(k))
    })
}

fn memcpy_f32(dest: &bridge::TensorInfo, src: &bridge::TensorInfo) -> Result<i32, Error> {
    catch_panic("deepspeed_memcpy", || deepspeed::memcpy_f32(&tensor(dest), &tensor(src)))
}

/// Locked memory owned by the torch tensor made over it (its deleter drops
/// the box).
pub struct LockedMemory(crate::pinned::LockedBuffer);

impl LockedMemory {
    fn address(&self) -> usize {
        self.0.as_ptr() as usize
    }
}

fn pinned_alloc(num_elem: i64, element_size: usize) -> Result<Box<LockedMemory>, Error> {
    catch_panic("new_cpu_locked_tensor", || deepspeed::pinned_alloc_owned(num_elem, element_size))
        .map(|buffer| Box::new(LockedMemory(buffer)))
}

fn pinned_free(base: usize) -> bool {
    or_default(|| deepspeed::pinned_free(base))
}

fn pinned_free_tensor(info: &bridge::TensorInfo) -> bool {
    or_default(|| deepspeed::pinned_free_tensor(&tensor(info)))
}

fn pinned_is_managed(info: &bridge::TensorInfo) -> bool {
    or_default(|| deepspeed::pinned_is_managed(&tensor(info)))
}

fn warn_consumer_ssd_writes() {
    or_default(deepspeed::write_warning::emit)
}
