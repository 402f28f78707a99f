//! Lines on stderr (and DeepSpeed's few stdout lines), with once-per-process
//! messages. DeepSpeed's C++ printed to stdout/stderr too; a logging
//! framework would be one more dependency for a handful of lines.
//!
//! No function here can panic: `println!`/`eprintln!` panic when the stream
//! is a closed pipe (`python train.py | head`), which must never fail an I/O
//! or unwind out of a worker. Write errors are ignored. Nothing here takes
//! a lock that a fork() could leave held: lines go out with write(2), and
//! the fork handler holds `info_once`'s across the fork (`fork.rs`).
//!
//! Inside Python, informational lines go through `logging` instead
//! (`log_queue.rs`, the `deepnvme` logger), which prints them the same way
//! unless the application configured logging or filters them.
//!
//! `DEEPNVME_LOG=quiet` silences informational lines (errors still print).

use std::collections::HashSet;

use crate::rt::sync::{Mutex, MutexGuard};

fn quiet() -> bool {
    crate::knobs::settings().quiet
}

/// Writes one whole line to `fd` with write(2), bypassing the locks of
/// `std::io::stdout()`/`stderr()`: a child made by fork() while another
/// thread of the parent held one of those locks would wait for it forever.
/// One line is one buffer (one syscall unless the stream takes it in
/// parts), so lines from several threads do not interleave mid-line.
/// A closed or broken stream is ignored.
fn write_line(fd: libc::c_int, prefix: &str, msg: &str) {
    let line = format!("{prefix}{msg}\n");
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing our own bytes; a bad fd only returns an error.
        let n = unsafe { libc::write(fd, rest.as_ptr() as *const libc::c_void, rest.len()) };
        if n > 0 {
            rest = &rest[n as usize..];
        } else if n < 0 && crate::error::last_errno() == libc::EINTR {
            continue;
        } else {
            return;
        }
    }
}

/// An informational line: a record of Python's `deepnvme` logger when the
/// core runs inside Python (`log_queue.rs`), else a line on stderr.
pub fn info(msg: &str) {
    if !quiet() && !crate::rt::log_queue::offer(msg, print_info) {
        print_info(msg);
    }
}

fn print_info(msg: &str) {
    write_line(libc::STDERR_FILENO, "deepnvme: ", msg);
}

/// The keys `info_once` printed. Held across `fork()` by the fork handler
/// (see `fork.rs`), so that a child can print too.
static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// `SEEN`'s lock (the fork handlers installed first: see `fork.rs`).
fn seen() -> MutexGuard<'static, Option<HashSet<String>>> {
    crate::rt::fork::install();
    SEEN.lock()
}

/// The fork handler's hook (`fork.rs`): holds `SEEN` across `fork()`.
pub(crate) fn hold_for_fork(_: std::time::Instant) -> crate::rt::fork::Held {
    Some(Box::new(SEEN.lock()))
}

/// An informational line printed at most once per process for `key`.
pub fn info_once(key: &str, msg: &str) {
    let first = seen().get_or_insert_with(HashSet::new).insert(key.to_string());
    if first {
        info(msg);
    }
}

/// An error the caller gets as a return code (-1) rather than an exception:
/// the message is the only place the reason shows, so it always prints.
pub fn error(msg: &str) {
    write_line(libc::STDERR_FILENO, "deepnvme error: ", msg);
}

/// A line on stdout, where DeepSpeed prints it (`Elapsed time`, `Pass:`).
pub(crate) fn stdout_line(msg: &str) {
    write_line(libc::STDOUT_FILENO, "", msg);
}
