// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// deepspeed_gds_handle_t: the `gds_handle` class. CUDA tensors move through
// NVIDIA cuFile (GPUDirect Storage), loaded at run time (dlopen); CPU
// tensors take the CPU path. Needs no CUDA or cuFile header to build.
// Creating one without a usable GPU and libcufile throws a clear error.
#pragma once

#include <cstddef>

#include "deepspeed_py_io_handle.h"

struct deepspeed_gds_handle_t : deepspeed_io_handle_t {

    deepspeed_gds_handle_t(const int block_size,
                           const int queue_depth,
                           const bool single_submit,
                           const bool overlap_events,
                           const int intra_op_parallelism);
    ~deepspeed_gds_handle_t() override;

    torch::Tensor new_pinned_device_tensor(const size_t num_elem, const torch::Tensor& example_tensor);
    bool free_pinned_device_tensor(torch::Tensor& buffer);
    bool pin_device_tensor(const torch::Tensor& buffer);
    bool unpin_device_tensor(const torch::Tensor& buffer);
};
