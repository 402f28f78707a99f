//! The top floor: one transfer (`gds_op_desc_t`) between a file and device
//! memory, on the driver and the shim. The transfer itself
//! (`gds_transfer`), its pieces (`pieces`) and what each cuFile call's
//! outcome means (`io_outcome`), the kept pool of piece threads
//! (`piece_pool`), and fd registrations shared by concurrent transfers
//! without a lock across cuFile's calls (`fd_handles`).

pub(crate) mod fd_handles;
pub(crate) mod gds_transfer;
pub(crate) mod io_outcome;
pub(crate) mod piece_pool;
pub(crate) mod pieces;
