// deepnvme-rs: deepspeed_io_handle_t and deepspeed_aio_handle_t, fronts over
// the Rust handle. Each method describes its tensor and calls Rust.

#include "deepspeed_py_aio_handle.h"

#include <pybind11/pybind11.h>

#include <memory>

#include "deepspeed_cpu_op.h"
#include "glue.h"

namespace {
std::unique_ptr<io_op_desc_t> torch_half(const torch::Tensor& buffer)
{
    return std::make_unique<cpu_op_desc_t>(buffer);
}
}  // namespace

deepspeed_io_handle_t::deepspeed_io_handle_t(const int block_size,
                                             const int queue_depth,
                                             const bool single_submit,
                                             const bool overlap_events,
                                             const int intra_op_parallelism)
    : deepspeed_io_handle_t(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, false)
{
}

deepspeed_io_handle_t::deepspeed_io_handle_t(const int block_size,
                                             const int queue_depth,
                                             const bool single_submit,
                                             const bool overlap_events,
                                             const int intra_op_parallelism,
                                             const bool use_gds)
    : _state(new deepnvme::io_handle_state{deepnvme::ffi::new_io_handle(deepnvme::ffi::HandleKnobs{
          block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, use_gds})}),
      _block_size(block_size),
      _queue_depth(queue_depth),
      _single_submit(single_submit),
      _overlap_events(overlap_events),
      _intra_op_parallelism(intra_op_parallelism),
      _pinned_tensor_mgr(deepspeed_pin_tensor_t::shared())
{
}

// Dropping the Rust handle finishes any op still in flight, then joins workers.
deepspeed_io_handle_t::~deepspeed_io_handle_t() = default;

const int deepspeed_io_handle_t::get_block_size() const { return _block_size; }
const int deepspeed_io_handle_t::get_queue_depth() const { return _queue_depth; }
const bool deepspeed_io_handle_t::get_single_submit() const { return _single_submit; }
const bool deepspeed_io_handle_t::get_overlap_events() const { return _overlap_events; }
const int deepspeed_io_handle_t::get_intra_op_parallelism() const { return _intra_op_parallelism; }
const int deepspeed_io_handle_t::get_alignment() const { return _state->handle->alignment(); }

int deepspeed_io_handle_t::read(torch::Tensor& buffer,
                                const char* filename,
                                const bool validate,
                                const int64_t file_offset)
{
    return _state->handle->transfer_inline(torch_half(buffer),
                                           deepnvme::describe_tensor(buffer),
                                           deepnvme::filename_bytes(filename),
                                           deepnvme::ffi::OpPlace{true, false, -1, validate, false, file_offset});
}

int deepspeed_io_handle_t::write(const torch::Tensor& buffer,
                                 const char* filename,
                                 const bool validate,
                                 const int64_t file_offset)
{
    return _state->handle->transfer_inline(torch_half(buffer),
                                           deepnvme::describe_tensor(buffer),
                                           deepnvme::filename_bytes(filename),
                                           deepnvme::ffi::OpPlace{false, false, -1, validate, false, file_offset});
}

namespace {

// A call into the core that may stop waiting for a signal (Ctrl-C): the core
// then leaves the exception the signal handler raised (KeyboardInterrupt)
// set, and this raises that one instead of a RuntimeError.
template <class F>
auto raising_pending_python_error(F&& call) -> decltype(call())
{
    try {
        return call();
    } catch (const rust::Error&) {
        // DeepSpeed's bindings release the GIL around some of these calls
        // (call_guard<gil_scoped_release>): take it to look.
        pybind11::gil_scoped_acquire gil;
        if (PyErr_Occurred() != nullptr) { throw pybind11::error_already_set(); }
        throw;
    }
}

}  // namespace

int deepspeed_io_handle_t::submit_op(const bool read,
                                     const torch::Tensor& buffer,
                                     const char* filename,
                                     const int fd,
                                     const bool validate,
                                     const bool async,
                                     const int64_t file_offset)
{
    return raising_pending_python_error([&] {
        return _state->handle->submit(torch_half(buffer),
                                      deepnvme::describe_tensor(buffer),
                                      deepnvme::filename_bytes(filename),
                                      deepnvme::ffi::OpPlace{read, filename == nullptr, fd, validate, async, file_offset});
    });
}

int deepspeed_io_handle_t::pread(const torch::Tensor& buffer,
                                 const char* filename,
                                 const bool validate,
                                 const bool async,
                                 const int64_t file_offset)
{
    return submit_op(true, buffer, filename, -1, validate, async, file_offset);
}

int deepspeed_io_handle_t::pwrite(const torch::Tensor& buffer,
                                  const char* filename,
                                  const bool validate,
                                  const bool async,
                                  const int64_t file_offset)
{
    return submit_op(false, buffer, filename, -1, validate, async, file_offset);
}

int deepspeed_io_handle_t::sync_pread(torch::Tensor& buffer, const char* filename, const int64_t file_offset)
{
    return submit_op(true, buffer, filename, -1, false, false, file_offset);
}

int deepspeed_io_handle_t::sync_pwrite(const torch::Tensor& buffer, const char* filename, const int64_t file_offset)
{
    return submit_op(false, buffer, filename, -1, false, false, file_offset);
}

int deepspeed_io_handle_t::async_pread(torch::Tensor& buffer, const char* filename, const int64_t file_offset)
{
    return submit_op(true, buffer, filename, -1, false, true, file_offset);
}

int deepspeed_io_handle_t::async_pwrite(const torch::Tensor& buffer, const char* filename, const int64_t file_offset)
{
    return submit_op(false, buffer, filename, -1, false, true, file_offset);
}

int deepspeed_io_handle_t::async_pwrite(const torch::Tensor& buffer, const int fd, const int64_t file_offset)
{
    return submit_op(false, buffer, nullptr, fd, false, true, file_offset);
}

torch::Tensor deepspeed_io_handle_t::new_cpu_locked_tensor(const int64_t num_elem,
                                                           const torch::Tensor& example_tensor)
{
    return _pinned_tensor_mgr->alloc(num_elem, example_tensor.scalar_type());
}

bool deepspeed_io_handle_t::free_cpu_locked_tensor(torch::Tensor& locked_tensor)
{
    return _pinned_tensor_mgr->free(locked_tensor);
}

bool deepspeed_io_handle_t::is_pinned(const torch::Tensor& buffer)
{
    return _state->handle->is_pinned(deepnvme::describe_tensor(buffer));
}

int deepspeed_io_handle_t::wait()
{
    return raising_pending_python_error([&] { return _state->handle->wait(); });
}

deepspeed_aio_handle_t::deepspeed_aio_handle_t(const int block_size,
                                               const int queue_depth,
                                               const bool single_submit,
                                               const bool overlap_events,
                                               const int intra_op_parallelism)
    : deepspeed_io_handle_t(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)
{
}

deepspeed_aio_handle_t::~deepspeed_aio_handle_t() = default;
