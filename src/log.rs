//! Minimal logging to stderr, with once-per-process messages. DeepSpeed's
//! C++ printed to stdout/stderr too; a logging framework would be one more
//! dependency for a handful of lines.
//!
//! `DEEPNVME_LOG=quiet` silences informational lines (errors still print).

use std::collections::HashSet;
use std::sync::OnceLock;

use parking_lot::Mutex;

fn quiet() -> bool {
    static QUIET: OnceLock<bool> = OnceLock::new();
    *QUIET.get_or_init(|| matches!(std::env::var("DEEPNVME_LOG").as_deref(), Ok("quiet") | Ok("0") | Ok("off")))
}

/// An informational line.
pub fn info(msg: &str) {
    if !quiet() {
        eprintln!("deepnvme: {msg}");
    }
}

/// An informational line printed at most once per process for `key`.
pub fn info_once(key: &str, msg: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let first = SEEN.lock().get_or_insert_with(HashSet::new).insert(key.to_string());
    if first {
        info(msg);
    }
}

/// An error the caller gets as a return code (-1) rather than an exception:
/// the message is the only place the reason shows, so it always prints.
pub fn error(msg: &str) {
    eprintln!("deepnvme error: {msg}");
}
