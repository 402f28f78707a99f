// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// cpu_op_desc_t: the torch glue of one transfer through the CPU path. It holds
// the caller's tensor and performs the copies a bounced op needs (CPU, CUDA or
// any other torch device, contiguous or strided). The op's logic is Rust's
// (deepnvme::op::CpuOp).
#pragma once

#include <torch/types.h>

#include "deepspeed_aio_op_desc.h"

struct cpu_op_desc_t : io_op_desc_t {
    torch::Tensor _buffer;
    // The storage the op was given, held until the op is finished: if the
    // caller swaps the tensor's storage (set_, resize_, .data =), the memory
    // the I/O targets stays alive instead of being freed under it.
    c10::Storage _storage;

    explicit cpu_op_desc_t(const torch::Tensor& buffer);
    ~cpu_op_desc_t() override;

    void copy_to_host(std::size_t host_addr, std::size_t nbytes) const override;
    void copy_from_host(std::size_t host_addr, std::size_t nbytes) const override;
    std::size_t data_address() const noexcept override;
    std::size_t data_bytes() const noexcept override;
    std::size_t storage_id() const noexcept override;
    bool storage_resizable() const noexcept override;
    void set_storage_resizable(bool resizable) const noexcept override;
};
