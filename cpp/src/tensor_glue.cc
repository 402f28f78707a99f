// deepnvme-rs: torch glue. Names files for Rust and performs the tensor
// copies of bounced ops (tensors are described in tensor_info.cc). Nothing
// here decides anything.

#include <ATen/ATen.h>
#include <torch/types.h>

#include <cstring>

#include "deepspeed_cpu_op.h"
#include "glue.h"

namespace deepnvme {

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

// Asked once per op (has the storage moved?): the extent only, not a whole
// description, whose is_pinned() is the costly part of a small op's call.
std::size_t cpu_op_desc_t::data_address() const noexcept
{
    try {
        return _buffer.defined() ? deepnvme::storage_address(_buffer) : 0;
    } catch (const std::exception&) {
        return 0;
    }
}

std::size_t cpu_op_desc_t::data_bytes() const noexcept
{
    try {
        return _buffer.defined() ? _buffer.nbytes() : 0;
    } catch (const std::exception&) {
        return 0;
    }
}

std::size_t cpu_op_desc_t::storage_id() const noexcept
{
    return reinterpret_cast<std::size_t>(_storage.unsafeGetStorageImpl());
}

bool cpu_op_desc_t::storage_resizable() const noexcept
{
    try {
        return _storage && _storage.resizable();
    } catch (const std::exception&) {
        return false;
    }
}

// Only ever sets back what storage_resizable() said (Rust keeps it), so the
// allocator a resizable storage needs is there.
void cpu_op_desc_t::set_storage_resizable(const bool resizable) const noexcept
{
    try {
        if (_storage) { _storage.unsafeGetStorageImpl()->set_resizable(resizable); }
    } catch (const std::exception&) {
        // (set_resizable only asserts that a resizable storage has an allocator.)
    }
}

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
