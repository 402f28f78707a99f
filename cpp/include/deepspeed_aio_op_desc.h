// deepnvme-rs: DeepSpeed-compatible header (no DeepSpeed code).
//
// The torch half of one DeepNVMe op. The op itself (bounce decision,
// slicing, I/O, validation, errors) lives in the Rust core; this object only
// keeps the caller's tensor alive while the op is in flight and copies
// between it and a host bounce buffer when Rust asks.
//
// This header is torch-free on purpose: the cxx bridge includes it, and the
// bridge is compiled by cargo without torch or CUDA into the core object
// (deepnvme._native), which links nothing of torch. The core only deletes and
// calls these objects through the vtable, so it references no symbol of this
// class: the key function (the destructor), and with it the vtable and
// typeinfo, is defined in the torch glue (cpp/src/tensor_glue.cc).
#pragma once

#include <cstddef>

// DeepSpeed's one-time warning that heavy NVMe offload wears consumer SSDs.
// Logged once per process through deepspeed.utils.logger; never affects I/O.
void warn_consumer_ssd_writes() noexcept;

struct io_op_desc_t {
    virtual ~io_op_desc_t();

    // Tensor -> `nbytes` of host memory at `host_addr` (dense, row-major).
    virtual void copy_to_host(std::size_t host_addr, std::size_t nbytes) const = 0;

    // `nbytes` of host memory at `host_addr` -> tensor (any device, any strides).
    virtual void copy_from_host(std::size_t host_addr, std::size_t nbytes) const = 0;

    // The tensor's data address and byte size now (0, 0 without storage).
    // Rust compares them with what the op was given, to report a storage
    // swapped under the op (set_, resize_, .data =). Never throws.
    virtual std::size_t data_address() const noexcept = 0;
    virtual std::size_t data_bytes() const noexcept = 0;

    // The storage the op holds, for Rust's count of the ops that hold it
    // unresizable (src/resize_hold.rs): its StorageImpl's address, 0
    // without one.
    virtual std::size_t storage_id() const noexcept = 0;

    // StorageImpl::resizable() and set_resizable(): while it is false, a
    // growing resize_ raises instead of freeing the bytes a direct op's I/O
    // uses. Never throw.
    virtual bool storage_resizable() const noexcept = 0;
    virtual void set_storage_resizable(bool resizable) const noexcept = 0;
};
