// deepnvme-rs: torch glue. Describes tensors for Rust and performs the tensor
// copies of bounced ops. Nothing here decides anything.

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstring>

#include "deepspeed_cpu_op.h"
#include "glue.h"

namespace deepnvme {

ffi::TensorInfo describe_tensor(const torch::Tensor& tensor)
{
    ffi::TensorInfo info{};
    info.ptr = 0;
    info.nbytes = 0;
    info.element_size = 0;
    info.dim0 = 0;
    info.is_cpu = false;
    info.is_cuda = false;
    info.device_index = -1;
    info.torch_pinned = false;
    info.contiguous = false;
    info.has_storage = false;
    if (!tensor.defined()) { return info; }
    try {
        info.element_size = tensor.element_size();
        info.nbytes = tensor.nbytes();
        info.dim0 = tensor.dim() > 0 ? tensor.size(0) : 0;
        info.is_cpu = tensor.is_cpu();
        info.is_cuda = tensor.is_cuda();
        info.device_index = tensor.device().has_index() ? tensor.device().index() : -1;
        info.contiguous = tensor.is_contiguous();
        if (tensor.has_storage() && !tensor.is_meta()) {
            // From the storage rather than data_ptr(): torch answers nullptr
            // for an empty tensor, which would hide a zero-element locked
            // allocation from free() and is_managed().
            const auto base = reinterpret_cast<std::size_t>(tensor.storage().data());
            info.ptr = base == 0 ? 0 : base + tensor.storage_offset() * tensor.element_size();
            info.has_storage = true;
            if (info.is_cpu) { info.torch_pinned = tensor.is_pinned(); }
        }
    } catch (const std::exception&) {
        // Fake and other storage-less tensors refuse data_ptr(): leave the
        // description as "no storage"; Rust refuses or reports "not pinned".
        info.ptr = 0;
        info.has_storage = false;
        info.torch_pinned = false;
    }
    return info;
}

rust::Slice<const uint8_t> filename_bytes(const char* filename)
{
    if (filename == nullptr) { return rust::Slice<const uint8_t>(); }
    return rust::Slice<const uint8_t>(reinterpret_cast<const uint8_t*>(filename),
                                      std::strlen(filename));
}

}  // namespace deepnvme

io_op_desc_t::~io_op_desc_t() = default;

namespace {
c10::Storage storage_of(const torch::Tensor& tensor) noexcept
{
    try {
        if (tensor.defined() && tensor.has_storage() && !tensor.is_meta()) { return tensor.storage(); }
    } catch (const std::exception&) {
        // Fake and other storage-less tensors: nothing to hold.
    }
    return c10::Storage();
}
}  // namespace

cpu_op_desc_t::cpu_op_desc_t(const torch::Tensor& buffer) : _buffer(buffer), _storage(storage_of(buffer)) {}

std::size_t cpu_op_desc_t::data_address() const noexcept { return deepnvme::describe_tensor(_buffer).ptr; }

std::size_t cpu_op_desc_t::data_bytes() const noexcept { return deepnvme::describe_tensor(_buffer).nbytes; }

cpu_op_desc_t::~cpu_op_desc_t() = default;

namespace {
// A dense CPU tensor of the buffer's shape and dtype over host memory.
torch::Tensor host_view(const torch::Tensor& like, std::size_t host_addr)
{
    return torch::from_blob(reinterpret_cast<void*>(host_addr),
                            like.sizes(),
                            torch::TensorOptions().dtype(like.dtype()).device(torch::kCPU));
}
}  // namespace

void cpu_op_desc_t::copy_to_host(std::size_t host_addr, std::size_t /*nbytes*/) const
{
    at::NoGradGuard no_grad;
    host_view(_buffer, host_addr).copy_(_buffer);
}

void cpu_op_desc_t::copy_from_host(std::size_t host_addr, std::size_t /*nbytes*/) const
{
    at::NoGradGuard no_grad;
    _buffer.copy_(host_view(_buffer, host_addr));
}
