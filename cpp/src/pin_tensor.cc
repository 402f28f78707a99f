// deepnvme-rs: deepspeed_pin_tensor_t, a torch front over the Rust manager,
// and the holder symbol through which DeepSpeed's own C++ finds it.
//
// This file and tensor_info.cc are their own shared object,
// libdeepnvme_pin.so (bindings/setup.py), exporting only
// deepspeed_pin_tensor_t's members, deepspeed_pin_tensor_mgr_holder and
// deepnvme::describe_tensor. deepnvme.pin_memory links it alone, so when
// DeepSpeed's pin_memory_load.py dlopens that module with RTLD_GLOBAL, glibc
// puts the module and its dependencies (this object, _native, torch) in the
// global scope -- and nothing else of deepnvme. The rest of the glue
// (libdeepnvme_torch.so: deepspeed_io_handle_t, cpu_op_desc_t, ...) never
// becomes global, so it can never interpose on the same-named classes that
// DeepSpeed's stock async_io/gds define for themselves.

#include "deepspeed_pin_tensor.h"

#include "glue.h"

std::shared_ptr<deepspeed_pin_tensor_t> deepspeed_pin_tensor_t::shared()
{
    // One per process: this object file is linked only into
    // libdeepnvme_pin.so, which every deepnvme op (and any third-party
    // extension built against cpp/include) links against. The state it fronts
    // is Rust's, in the one core object (_native), also unique.
    static auto manager = std::make_shared<deepspeed_pin_tensor_t>();
    return manager;
}

// DeepSpeed's seam (0.19.8): its stock async_io and gds do not contain the
// manager; their deepspeed_pin_tensor_t::shared() looks this symbol up with
// dlsym(RTLD_DEFAULT, ...) and copies the std::shared_ptr it points at. Same
// meaning here: a process-lifetime heap std::shared_ptr<deepspeed_pin_tensor_t>*
// (never deleted, so it outlives every extension's static destructors),
// sharing shared()'s control block -- so whichever route a caller takes,
// DeepSpeed's holder or deepnvme's shared(), it reaches the Rust manager.
//
// Layout: DeepSpeed's class declares data members (a std::map and a
// std::mutex); ours is empty. That is sound because the stock C++ that
// receives this pointer never touches the object's storage itself:
//  * it never constructs or destroys one (it only copies the shared_ptr; the
//    deleter lives in the control block make_shared built here, for our type);
//  * every member it uses -- alloc, free, is_managed (and shared) -- is
//    declared out of line in DeepSpeed's header, so its calls are external
//    references resolved to the definitions below (exported from this object,
//    made global by pin_memory_load.py's RTLD_GLOBAL load); no member
//    function of DeepSpeed's is compiled into async_io/gds;
//  * it never names the data members (only deepspeed_pin_tensor.cpp, which
//    is in DeepSpeed's pin_memory, not built when deepnvme provides it).
// So only our member functions ever see `this`, and they read no field of
// it. The symbols match because cpp/include/deepspeed_pin_tensor.h declares
// the same member signatures as DeepSpeed's header (same mangled names);
// tests/python/test_mix_stock_aio.py checks both directions at run time.
extern "C" __attribute__((visibility("default"))) void* deepspeed_pin_tensor_mgr_holder()
{
    static auto* holder = new std::shared_ptr<deepspeed_pin_tensor_t>(deepspeed_pin_tensor_t::shared());
    return static_cast<void*>(holder);
}

torch::Tensor deepspeed_pin_tensor_t::alloc(const int64_t num_elem, const torch::TensorOptions& options)
{
    const auto element_size = c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
    auto memory = deepnvme::ffi::pinned_alloc(num_elem, element_size);
    void* base = reinterpret_cast<void*>(memory->address());
    // The tensor owns the memory: its storage's deleter drops the Rust box,
    // which unlocks and unmaps it (free() before that only unmanages and
    // unlocks it, so a tensor still in use never points at unmapped memory).
    auto* owner = memory.into_raw();
    try {
        return torch::from_blob(
            base,
            {num_elem},
            [owner](void*) { (void)rust::Box<deepnvme::ffi::LockedMemory>::from_raw(owner); },
            // Dense whatever the example's layout: a sparse one would make
            // a sparse tensor over plain bytes (printing it crashed).
            options.device(torch::kCPU).pinned_memory(false).layout(torch::kStrided));
    } catch (...) {
        (void)rust::Box<deepnvme::ffi::LockedMemory>::from_raw(owner);
        throw;
    }
}

torch::Tensor deepspeed_pin_tensor_t::alloc(const int64_t num_elem, const at::ScalarType& elem_type)
{
    return alloc(num_elem, torch::TensorOptions().dtype(elem_type).device(torch::kCPU).requires_grad(false));
}

bool deepspeed_pin_tensor_t::free(torch::Tensor& locked_tensor)
{
    return deepnvme::ffi::pinned_free_tensor(deepnvme::describe_tensor(locked_tensor));
}

bool deepspeed_pin_tensor_t::free(void* addr)
{
    return deepnvme::ffi::pinned_free(reinterpret_cast<std::size_t>(addr));
}

bool deepspeed_pin_tensor_t::is_managed(const torch::Tensor& buffer)
{
    return deepnvme::ffi::pinned_is_managed(deepnvme::describe_tensor(buffer));
}
