// deepnvme-rs: deepspeed_pin_tensor_t, a torch front over the Rust manager.

#include "deepspeed_pin_tensor.h"

#include "glue.h"

std::shared_ptr<deepspeed_pin_tensor_t> deepspeed_pin_tensor_t::shared()
{
    // One per process: this object file is linked only into deepnvme's torch
    // glue (libdeepnvme_torch.so), which every op links against. The state it
    // fronts is Rust's, in the one core object (_native), also unique.
    static auto manager = std::make_shared<deepspeed_pin_tensor_t>();
    return manager;
}

torch::Tensor deepspeed_pin_tensor_t::alloc(const int64_t num_elem, const torch::TensorOptions& options)
{
    const auto element_size = c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
    const auto base = deepnvme::ffi::pinned_alloc(num_elem, element_size);
    return torch::from_blob(reinterpret_cast<void*>(base),
                            {num_elem},
                            options.device(torch::kCPU).pinned_memory(false));
}

torch::Tensor deepspeed_pin_tensor_t::alloc(const int64_t num_elem, const at::ScalarType& elem_type)
{
    return alloc(num_elem, torch::TensorOptions().dtype(elem_type).device(torch::kCPU).requires_grad(false));
}

bool deepspeed_pin_tensor_t::free(torch::Tensor& locked_tensor)
{
    const auto info = deepnvme::describe_tensor(locked_tensor);
    if (!info.has_storage) { return false; }
    return deepnvme::ffi::pinned_free(info.ptr);
}

bool deepspeed_pin_tensor_t::free(void* addr)
{
    return deepnvme::ffi::pinned_free(reinterpret_cast<std::size_t>(addr));
}

bool deepspeed_pin_tensor_t::is_managed(const torch::Tensor& buffer)
{
    return deepnvme::ffi::pinned_is_managed(deepnvme::describe_tensor(buffer));
}
