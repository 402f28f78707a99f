// deepnvme-rs: deepspeed_gds_handle_t, a front over the Rust handle with a
// cuFile driver reference. Device registration and every cuFile call are
// Rust's; this file only creates and describes CUDA tensors.

#include "deepspeed_py_gds_handle.h"

#include "glue.h"

deepspeed_gds_handle_t::deepspeed_gds_handle_t(const int block_size,
                                               const int queue_depth,
                                               const bool single_submit,
                                               const bool overlap_events,
                                               const int intra_op_parallelism)
    : deepspeed_io_handle_t(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism, true)
{
}

deepspeed_gds_handle_t::~deepspeed_gds_handle_t() = default;

torch::Tensor deepspeed_gds_handle_t::new_pinned_device_tensor(const size_t num_elem,
                                                               const torch::Tensor& example_tensor)
{
    auto options = example_tensor.options();
    if (!example_tensor.is_cuda()) { options = options.device(torch::kCUDA); }
    auto tensor = torch::empty({static_cast<int64_t>(num_elem)}, options.requires_grad(false));
    pin_device_tensor(tensor);
    return tensor;
}

bool deepspeed_gds_handle_t::free_pinned_device_tensor(torch::Tensor& buffer)
{
    return unpin_device_tensor(buffer);
}

bool deepspeed_gds_handle_t::pin_device_tensor(const torch::Tensor& buffer)
{
    return _state->handle->gds_register(deepnvme::describe_tensor(buffer));
}

bool deepspeed_gds_handle_t::unpin_device_tensor(const torch::Tensor& buffer)
{
    return _state->handle->gds_deregister(deepnvme::describe_tensor(buffer));
}
