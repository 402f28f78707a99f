//! The process-wide pinned-memory manager (`deepspeed_pin_tensor_t`).
//!
//! It hands out page-aligned, `mlock`ed regions and remembers each one, so
//! that any buffer lying wholly inside a region (the region itself, a narrow,
//! a view) is recognised as page-locked and can be used for O_DIRECT I/O
//! without a bounce copy. Regions are kept by base address (a `BTreeMap`,
//! for `free` and the totals) and by page (`index.rs`, a page-table-like
//! index), so `is_managed` on the submission path is a hash probe and one
//! table load whatever the number of regions, instead of the C++ linear scan.
//!
//! There is one manager per process ([`PinnedMemoryManager::shared`]): the
//! Rust core is linked into a single shared object that every DeepSpeed
//! extension depends on, so async_io, gds and pin_memory all see the same
//! regions whatever order they are loaded in.
//!
//! Files: `manager.rs` (the manager, its regions and their holds),
//! `index.rs` (the by-page index), `page_buffer.rs` (page-aligned mappings,
//! locked or not, and the memlock limit), `locked_buffer.rs` (the Rust API's
//! owned locked memory).

mod index;
mod locked_buffer;
mod manager;
mod page_buffer;
#[cfg(test)]
mod tests;

pub use locked_buffer::LockedBuffer;
pub(crate) use manager::{hold_for_fork, RegionHold};
pub use manager::PinnedMemoryManager;
pub use page_buffer::{memlock_limit, page_size, LockMode, PageAlignedBuffer};
