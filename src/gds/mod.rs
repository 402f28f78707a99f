//! GPUDirect Storage (cuFile) support. Placeholder: being written.
