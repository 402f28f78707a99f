// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// The async_io module functions aio_read / aio_write: a one-shot transfer of a
// whole tensor with a fresh single-worker handle. 0 on success, -1 (reason on
// stderr) for a refused request; a failed transfer throws.
#pragma once

#include <torch/types.h>

int deepspeed_py_aio_write(const torch::Tensor& buffer,
                           const char* filename,
                           const int block_size,
                           const int queue_depth,
                           const bool single_submit,
                           const bool overlap_events,
                           const bool validate);

int deepspeed_py_aio_read(torch::Tensor& buffer,
                          const char* filename,
                          const int block_size,
                          const int queue_depth,
                          const bool single_submit,
                          const bool overlap_events,
                          const bool validate);
