// deepnvme-rs: the async_io module functions (aio_read, aio_write,
// deepspeed_memcpy) and the write warning, as calls into Rust.

#include "deepspeed_aio_op_desc.h"
#include "deepspeed_cpu_op.h"
#include "deepspeed_py_aio.h"
#include "deepspeed_py_copy.h"
#include "glue.h"

namespace {
int one_shot(const bool read,
             const torch::Tensor& buffer,
             const char* filename,
             const int block_size,
             const int queue_depth,
             const bool single_submit,
             const bool overlap_events,
             const bool validate)
{
    // The one-shot transfers run on one thread: parallelism 1, no GDS.
    const deepnvme::ffi::HandleKnobs knobs{block_size, queue_depth, single_submit, overlap_events, 1, false};
    const deepnvme::ffi::OpPlace place{read, false, -1, validate, false, 0};
    return deepnvme::ffi::one_shot_transfer(std::make_unique<cpu_op_desc_t>(buffer),
                                            deepnvme::describe_tensor(buffer),
                                            deepnvme::filename_bytes(filename),
                                            knobs,
                                            place);
}
}  // namespace

int deepspeed_py_aio_write(const torch::Tensor& buffer,
                           const char* filename,
                           const int block_size,
                           const int queue_depth,
                           const bool single_submit,
                           const bool overlap_events,
                           const bool validate)
{
    return one_shot(false, buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate);
}

int deepspeed_py_aio_read(torch::Tensor& buffer,
                          const char* filename,
                          const int block_size,
                          const int queue_depth,
                          const bool single_submit,
                          const bool overlap_events,
                          const bool validate)
{
    return one_shot(true, buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate);
}

int deepspeed_py_memcpy(torch::Tensor& dest, const torch::Tensor& src)
{
    return deepnvme::ffi::memcpy_f32(deepnvme::describe_tensor(dest), deepnvme::describe_tensor(src));
}

void warn_consumer_ssd_writes() noexcept { deepnvme::ffi::warn_consumer_ssd_writes(); }
