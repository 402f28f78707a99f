// deepnvme-rs: internal helpers shared by the torch shims.
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "deepnvme/src/ffi.rs.h"
#include "rust/cxx.h"

namespace deepnvme {

// (pointer, bytes, device, pinned, contiguity) of a tensor, for Rust. Never
// throws: a tensor without storage (meta, fake) is described as such.
ffi::TensorInfo describe_tensor(const torch::Tensor& tensor);

// Where a tensor's bytes start, 0 without storage. From the storage rather
// than data_ptr(): torch answers nullptr for an empty tensor, which would
// hide a zero-element locked allocation from free() and is_managed().
// Throws what torch throws (fake tensors).
inline std::size_t storage_address(const torch::Tensor& tensor)
{
    if (!tensor.has_storage() || tensor.is_meta()) { return 0; }
    const auto base = reinterpret_cast<std::size_t>(tensor.storage().data());
    return base == 0 ? 0 : base + tensor.storage_offset() * tensor.element_size();
}

// A file name as bytes (empty for nullptr), as Rust takes it.
rust::Slice<const uint8_t> filename_bytes(const char* filename);

// What deepspeed_io_handle_t::_state points at: the Rust handle.
struct io_handle_state {
    rust::Box<ffi::IoHandle> handle;
};

}  // namespace deepnvme
