//! The bottom floor: libcufile and libcuda, loaded at run time (no CUDA
//! header or library is needed to build), as kvikio's `shim/` does. Loading
//! and symbol lookup (`dl`, `symbols`), cuFile's status codes (`status`),
//! the two libraries' entry points (`cuda_api`, `cufile_api`: cuFile's two
//! structs declared from `cufile.h`, layouts checked at compile time),
//! CUDA contexts (`context`), panics into errors (`catch`), finding the
//! libraries and a device (`probe`), and the private cuFile config the
//! library reads (`config`). Nothing here knows about the driver's
//! refcount or a transfer.

pub(crate) mod catch;
pub(crate) mod config;
pub(crate) mod context;
pub(crate) mod cuda_api;
pub(crate) mod cufile_api;
pub(crate) mod dl;
pub(crate) mod probe;
pub(crate) mod status;
pub(crate) mod symbols;
