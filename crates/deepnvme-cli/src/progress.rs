//! The progress line on stderr: `write  37%  384 MiB of 1 GiB  1.21 GB/s`,
//! rewritten in place (`\r`) on a terminal as ops complete, one line per
//! update when forced onto a non-terminal, and nothing when quiet.

use std::io::Write;

use crate::args::fmt_size;

/// An informational line on stderr, as the core's own (`deepnvme: ...`);
/// `DEEPNVME_LOG=quiet` (or `0`, `off`) silences it, as it does the core's.
pub fn info(msg: &str) {
    if !deepnvme::diag::log_quiet() {
        eprintln!("deepnvme: {msg}");
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Never print.
    Off,
    /// Rewrite one line in place (stderr is a terminal).
    Line,
    /// Print a line per update (forced with `--progress` onto a pipe/file).
    Lines,
}

impl ProgressMode {
    /// `Line` when stderr is a terminal, else `Off`; `force` prints anyway.
    pub fn detect(quiet: bool, force: bool) -> ProgressMode {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        match (quiet, tty, force) {
            (true, _, _) => ProgressMode::Off,
            (false, true, _) => ProgressMode::Line,
            (false, false, true) => ProgressMode::Lines,
            (false, false, false) => ProgressMode::Off,
        }
    }
}

/// Progress of one pass.
pub struct Progress {
    mode: ProgressMode,
    label: String,
    drawn: bool,
}

impl Progress {
    pub fn new(mode: ProgressMode, label: impl Into<String>) -> Progress {
        Progress { mode, label: label.into(), drawn: false }
    }

    /// `done` of `total` bytes moved after `secs` seconds.
    pub fn update(&mut self, done: u64, total: u64, secs: f64) {
        if self.mode == ProgressMode::Off {
            return;
        }
        let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
        let rate = if secs > 0.0 { done as f64 / secs / 1e9 } else { 0.0 };
        let text = format!(
            "{}  {:3.0}%  {} of {}  {:.2} GB/s",
            self.label,
            pct,
            fmt_size(done),
            fmt_size(total),
            rate
        );
        let mut err = std::io::stderr().lock();
        let _ = match self.mode {
            ProgressMode::Line => write!(err, "\r\x1b[2K{text}"),
            _ => writeln!(err, "{text}"),
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// Clears the in-place line so that results print on a clean line.
    pub fn finish(&mut self) {
        if self.mode == ProgressMode::Line && self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
        self.drawn = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
