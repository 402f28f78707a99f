// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// deepspeed_aio_handle_t: the `aio_handle` class of the async_io extension.
#pragma once

#include "deepspeed_py_aio.h"
#include "deepspeed_py_io_handle.h"

struct deepspeed_aio_handle_t : deepspeed_io_handle_t {
    deepspeed_aio_handle_t(const int block_size,
                           const int queue_depth,
                           const bool single_submit,
                           const bool overlap_events,
                           const int intra_op_parallelism);
    ~deepspeed_aio_handle_t() override;
};
