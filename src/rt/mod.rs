//! Runtime infrastructure, below the domain modules (`handle`, `op`,
//! `engine`, `pinned`, `gds`, `file`, ...): how the core locks, forks,
//! starts threads, writes lines, holds the Python interpreter and escapes
//! JSON. A file here names only other files here and the crate's base,
//! `error` and `knobs` (the settings every level reads); never a domain
//! module, which `tests/module_graph.rs` checks. `knobs` stays at the top:
//! it is public API (`deepnvme::knobs`), and its settings install the fork
//! handlers.

pub(crate) mod fork;
pub(crate) mod interpreter;
pub(crate) mod json;
pub(crate) mod log;
pub(crate) mod log_queue;
pub(crate) mod sync;
pub(crate) mod threads;
