//! Lines on stderr (and DeepSpeed's few stdout lines), with once-per-process
//! messages. DeepSpeed's C++ printed to stdout/stderr too; a logging
//! framework would be one more dependency for a handful of lines.
//!
//! No function here can panic: `println!`/`eprintln!` panic when the stream
//! is a closed pipe (`python train.py | head`), which must never fail an I/O
//! or unwind out of a worker. Write errors are ignored.
//!
//! `DEEPNVME_LOG=quiet` silences informational lines (errors still print).

use std::collections::HashSet;
use std::io::Write;

use parking_lot::Mutex;

fn quiet() -> bool {
    crate::knobs::settings().quiet
}

fn write_line(mut out: impl Write, prefix: &str, msg: &str) {
    let _ = writeln!(out, "{prefix}{msg}");
    let _ = out.flush();
}

/// An informational line.
pub fn info(msg: &str) {
    if !quiet() {
        write_line(std::io::stderr().lock(), "deepnvme: ", msg);
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
    write_line(std::io::stderr().lock(), "deepnvme error: ", msg);
}

/// A line on stdout, where DeepSpeed prints it (`Elapsed time`, `Pass:`).
pub(crate) fn stdout_line(msg: &str) {
    write_line(std::io::stdout().lock(), "", msg);
}
