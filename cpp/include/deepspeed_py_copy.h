// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// deepspeed_memcpy(dest, src): copies dest.size(0) float32 elements from src
// into dest; 0 on success. Unlike the C++ it checks sizes, dtypes and layout
// and throws instead of reading or writing out of bounds.
#pragma once

#include <torch/types.h>

int deepspeed_py_memcpy(torch::Tensor& dest, const torch::Tensor& src);
