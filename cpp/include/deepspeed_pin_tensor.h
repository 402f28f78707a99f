// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// deepspeed_pin_tensor_t: the process-wide manager of page-locked CPU tensors.
// The state (regions, locking, range lookup) lives in the Rust core, which is
// linked once into the shared object every DeepNVMe extension depends on, so
// the manager is process-wide whatever order the extensions load in. This
// class is a stateless torch front: it wraps Rust allocations in tensors.
//
// Defined in deepnvme's libdeepnvme_pin.so. Third-party C++ may include this
// header (deepnvme.include_dir()) and link that library
// (deepnvme.library_dir(), -ldeepnvme_pin, with an rpath) to share the
// process's manager; see README "Migrating from DeepSpeed's C++".
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

struct deepspeed_pin_tensor_t {
    // The one manager of the process.
    static std::shared_ptr<deepspeed_pin_tensor_t> shared();

    // A 1-D CPU tensor of `num_elem` elements over page-locked memory. The
    // memory lives until free(); the tensor has no deleter (as in DeepSpeed).
    // Throws (RuntimeError in Python) when mlock fails, naming RLIMIT_MEMLOCK.
    torch::Tensor alloc(const int64_t num_elem, const at::ScalarType& elem_type);
    torch::Tensor alloc(const int64_t num_elem, const torch::TensorOptions& options);

    // Frees an allocation by its exact base; returns whether one was freed.
    bool free(torch::Tensor& locked_tensor);
    bool free(void* addr);

    // True when the tensor's whole byte extent lies inside one allocation.
    bool is_managed(const torch::Tensor& buffer);
};

// DeepSpeed's cross-extension seam, with DeepSpeed's meaning: a
// process-lifetime heap std::shared_ptr<deepspeed_pin_tensor_t>* holding
// shared(). DeepSpeed's own async_io and gds find it with
// dlsym(RTLD_DEFAULT, "deepspeed_pin_tensor_mgr_holder").
extern "C" void* deepspeed_pin_tensor_mgr_holder();
