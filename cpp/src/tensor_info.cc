// deepnvme-rs: torch glue. Describes a tensor for Rust: (pointer, bytes,
// device, pinned, contiguity). Part of the pinned front's shared object
// (libdeepnvme_pin.so), which the pinned manager needs and the rest of the
// glue (libdeepnvme_torch.so) reuses.

#include <torch/types.h>

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
    if (tensor.layout() != torch::kStrided) {
        // Sparse and other layouts have no one block of bytes: "no storage",
        // with their element count, so that Rust refuses them by name.
        info.element_size = tensor.element_size();
        info.nbytes = static_cast<size_t>(tensor.numel()) * info.element_size;
        return info;
    }
    try {
        info.element_size = tensor.element_size();
        info.nbytes = tensor.nbytes();
        info.dim0 = tensor.dim() > 0 ? tensor.size(0) : 0;
        info.is_cpu = tensor.is_cpu();
        info.is_cuda = tensor.is_cuda();
        info.device_index = tensor.device().has_index() ? tensor.device().index() : -1;
        info.contiguous = tensor.is_contiguous();
        if (tensor.has_storage() && !tensor.is_meta()) {
            info.ptr = storage_address(tensor);
            info.has_storage = true;
            // The pinned manager's memory is recognised by address (and torch
            // calls it unpinned): is_pinned() is asked only of other memory,
            // as it costs more than the rest of a small op's description.
            if (info.is_cpu && !ffi::pinned_is_managed(info)) { info.torch_pinned = tensor.is_pinned(); }
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

}  // namespace deepnvme
