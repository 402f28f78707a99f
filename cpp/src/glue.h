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

// A file name as bytes (empty for nullptr), as Rust takes it.
rust::Slice<const uint8_t> filename_bytes(const char* filename);

// What deepspeed_io_handle_t::_state points at: the Rust handle.
struct io_handle_state {
    rust::Box<ffi::IoHandle> handle;
};

}  // namespace deepnvme
