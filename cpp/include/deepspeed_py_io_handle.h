// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// deepspeed_io_handle_t: the DeepNVMe handle. Its state is a Rust handle
// (deepnvme::handle::IoHandle) behind an opaque pointer; every method turns
// its tensor into (pointer, bytes, device, pinned, contiguity) and calls Rust.
//
// Return codes are DeepSpeed's: 0 for an async submit, the number of ops
// completed for a blocking call or wait(), -1 (reason on stderr) for a request
// DeepSpeed refuses. A failed transfer throws (RuntimeError in Python).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "deepspeed_pin_tensor.h"

namespace deepnvme {
struct io_handle_state;
}

struct deepspeed_io_handle_t {
    std::unique_ptr<deepnvme::io_handle_state> _state;
    const int _block_size;
    const int _queue_depth;
    const bool _single_submit;
    const bool _overlap_events;
    const int _intra_op_parallelism;
    std::shared_ptr<deepspeed_pin_tensor_t> _pinned_tensor_mgr;

    deepspeed_io_handle_t(const int block_size,
                          const int queue_depth,
                          const bool single_submit,
                          const bool overlap_events,
                          const int intra_op_parallelism);
    virtual ~deepspeed_io_handle_t();

    deepspeed_io_handle_t(const deepspeed_io_handle_t&) = delete;
    deepspeed_io_handle_t& operator=(const deepspeed_io_handle_t&) = delete;

    const int get_block_size() const;
    const int get_queue_depth() const;
    const bool get_single_submit() const;
    const bool get_overlap_events() const;
    const int get_intra_op_parallelism() const;
    const int get_alignment() const;

    int read(torch::Tensor& buffer, const char* filename, const bool validate, const int64_t file_offset);
    int write(const torch::Tensor& buffer, const char* filename, const bool validate, const int64_t file_offset);

    int pread(const torch::Tensor& buffer,
              const char* filename,
              const bool validate,
              const bool async,
              const int64_t file_offset);
    int pwrite(const torch::Tensor& buffer,
               const char* filename,
               const bool validate,
               const bool async,
               const int64_t file_offset);

    int sync_pread(torch::Tensor& buffer, const char* filename, const int64_t file_offset);
    int sync_pwrite(const torch::Tensor& buffer, const char* filename, const int64_t file_offset);
    int async_pread(torch::Tensor& buffer, const char* filename, const int64_t file_offset);
    int async_pwrite(const torch::Tensor& buffer, const char* filename, const int64_t file_offset);
    // Writes through a descriptor the caller owns; the handle never closes it.
    int async_pwrite(const torch::Tensor& buffer, const int fd, const int64_t file_offset);

    torch::Tensor new_cpu_locked_tensor(const int64_t num_elem, const torch::Tensor& example_tensor);
    bool free_cpu_locked_tensor(torch::Tensor& locked_tensor);
    bool is_pinned(const torch::Tensor& buffer);

    // Waits for every pending op; returns how many finished (0 if none).
    int wait();

protected:
    // For deepspeed_gds_handle_t: a handle whose CUDA tensors go through cuFile.
    deepspeed_io_handle_t(const int block_size,
                          const int queue_depth,
                          const bool single_submit,
                          const bool overlap_events,
                          const int intra_op_parallelism,
                          const bool use_gds);

    // Submits one parallel op (any of pread/pwrite/async_*/sync_*).
    int submit_op(const bool read,
                  const torch::Tensor& buffer,
                  const char* filename,
                  const int fd,
                  const bool validate,
                  const bool async,
                  const int64_t file_offset);
};
