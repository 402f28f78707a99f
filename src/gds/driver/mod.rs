//! The middle floor: the process-wide cuFile driver on the shim. Its
//! refcount and open/close rules (`lifecycle`), the buffer registry
//! (`registry`), and the real driver calls (`cufile_ops`).

pub(crate) mod cufile_ops;
pub(crate) mod lifecycle;
pub(crate) mod registry;
