//! Command-line pieces the subcommands share: the options of `bench` and
//! `tune` ([`Common`]), value parsers for clap (sizes with k/M/G suffixes,
//! counts, booleans, the engine), human-readable sizes for output, and the
//! [`CliError`] that decides the exit status (2 for usage errors).

use std::fmt;
use std::path::PathBuf;

use clap::Args;

use crate::core_api::EngineKind;

/// Why the tool stops early. `main` maps each to an exit status.
#[derive(Debug)]
pub enum CliError {
    /// A bad command line that clap could not see (knob limits, sizes that
    /// do not split among workers): exit status 2, with the usage line.
    Usage { msg: String, command: &'static str },
    /// The work itself failed (I/O error, allocation, ...): exit status 1.
    Failed(String),
    /// The command could not start on what it was given (a file it cannot
    /// read or parse, a path of the wrong kind): exit status 2, without the
    /// usage line; already reported on stdout when the command owed a JSON
    /// document there.
    NotRun(String),
    /// Ctrl-C: exit status 130 after cleaning up.
    Interrupted,
}

impl CliError {
    pub fn usage(command: &'static str, msg: impl Into<String>) -> CliError {
        CliError::Usage { msg: msg.into(), command }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage { msg, .. } => write!(f, "{msg}"),
            CliError::Failed(msg) | CliError::NotRun(msg) => write!(f, "{msg}"),
            CliError::Interrupted => write!(f, "interrupted"),
        }
    }
}

impl From<crate::core_api::Error> for CliError {
    fn from(e: crate::core_api::Error) -> Self {
        CliError::Failed(e.to_string())
    }
}

pub const KNOBS: &str = "Handle knobs";
pub const MOVE: &str = "What to move";
pub const OUTPUT: &str = "Output";

/// The options `bench` and `tune` both take: the engine, where the file is,
/// how much to move, how many times, and how to report. Each command adjusts
/// the help of the few whose defaults or meaning differ (`mut_arg`).
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Transfer engine [default: DEEPNVME_ENGINE, else io_uring when it works, else psync]
    #[arg(long, value_name = "uring|psync", value_parser = parse_engine, help_heading = KNOBS)]
    pub engine: Option<EngineKind>,

    /// Bytes per pass
    #[arg(short, long, value_name = "SIZE", value_parser = parse_positive_size_u64, help_heading = MOVE)]
    pub size: Option<u64>,

    /// Bytes per op (and locked buffer) [default: 256M, or --size when smaller]
    #[arg(long, value_name = "SIZE", value_parser = parse_positive_size, help_heading = MOVE)]
    pub buffer_size: Option<usize>,

    /// Use this file: an existing one is overwritten in place and never removed; a new one is removed
    /// afterwards unless --keep
    #[arg(short, long, value_name = "PATH", conflicts_with = "dir", help_heading = MOVE)]
    pub file: Option<PathBuf>,

    /// Put the temp file in DIR [default: the current directory]
    #[arg(short, long, value_name = "DIR", help_heading = MOVE)]
    pub dir: Option<PathBuf>,

    /// Do not remove the file the tool created
    #[arg(long, help_heading = MOVE)]
    pub keep: bool,

    /// Repeat the passes N times; report best and mean
    #[arg(short = 'n', long, value_name = "N", default_value = "1", value_parser = parse_count, help_heading = MOVE)]
    pub loops: usize,

    /// Only read
    #[arg(long, conflicts_with = "write_only", help_heading = MOVE)]
    pub read_only: bool,

    /// Only write
    #[arg(long, help_heading = MOVE)]
    pub write_only: bool,

    /// One JSON object on stdout instead of the table
    #[arg(long, help_heading = OUTPUT)]
    pub json: bool,

    /// No progress on stderr
    #[arg(short, long, help_heading = OUTPUT)]
    pub quiet: bool,

    /// Progress even when stderr is not a terminal
    #[arg(long, help_heading = OUTPUT)]
    pub progress: bool,
}

impl Common {
    pub fn do_write(&self) -> bool {
        !self.read_only
    }
    pub fn do_read(&self) -> bool {
        !self.write_only
    }
}

// ---------------------------------------------------------------------------
// Value parsers (each error message says what was expected; clap names the
// flag and the value)

/// A byte count with an optional binary suffix: `4096`, `4k`, `1M`, `1.5G`,
/// `1MiB`, `2GB`. Every suffix is a power of 1024, as in fio and DeepSpeed.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err("expected a number with an optional suffix (k, M, G, T), e.g. 4k or 1G".into());
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("unknown size suffix {suffix:?} (use k, M, G or T)")),
    };
    let unit = 1u64 << shift;
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(unit).ok_or_else(|| "too large".to_string());
    }
    let x: f64 = num.parse().map_err(|_| format!("{num:?} is not a number"))?;
    let bytes = x * unit as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("too large".into());
    }
    if bytes.fract() != 0.0 {
        return Err(format!("{s} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// A size that must be positive and fit in memory (`usize`).
pub fn parse_positive_size(s: &str) -> Result<usize, String> {
    let v = parse_size(s)?;
    if v == 0 {
        return Err("must be positive".into());
    }
    usize::try_from(v).map_err(|_| "too large for this machine".to_string())
}

/// [`parse_positive_size`] as a file length.
pub fn parse_positive_size_u64(s: &str) -> Result<u64, String> {
    parse_positive_size(s).map(|n| n as u64)
}

/// A positive integer (no suffix).
pub fn parse_count(s: &str) -> Result<usize, String> {
    let v: usize = s.trim().parse().map_err(|_| "expected a positive whole number".to_string())?;
    if v == 0 {
        return Err("must be positive".into());
    }
    Ok(v)
}

pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// `uring` (also `io_uring`) or `psync`.
pub fn parse_engine(s: &str) -> Result<EngineKind, String> {
    EngineKind::parse(s).ok_or_else(|| "expected uring or psync".to_string())
}

/// The values of a tune grid's on/off knob: `true`, `false` or `both`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Only(bool),
    Both,
}

impl Choice {
    pub fn values(self) -> Vec<bool> {
        match self {
            Choice::Only(b) => vec![b],
            Choice::Both => vec![false, true],
        }
    }
}

/// `true`, `false` or `both` (also `true,false`) for the tune grids.
pub fn parse_choice(s: &str) -> Result<Choice, String> {
    if s.trim().eq_ignore_ascii_case("both") {
        return Ok(Choice::Both);
    }
    let mut seen = Vec::new();
    for part in s.split(',') {
        let b = parse_bool(part).map_err(|_| "expected true, false or both".to_string())?;
        if !seen.contains(&b) {
            seen.push(b);
        }
    }
    Ok(if seen.len() == 2 { Choice::Both } else { Choice::Only(seen[0]) })
}

/// Drops repeated items of a comma-separated list, keeping the first of each.
pub fn dedup<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for v in items {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Sizes for output

/// Bytes as the shortest exact binary unit: `1 GiB`, `256 MiB`, `1.5 MiB`,
/// `1000 B`.
pub fn fmt_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        let unit = 1u64 << shift;
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes % unit == 0 {
                format!("{} {name}", bytes >> shift)
            } else if bytes % (unit / 16) == 0 || v >= 100.0 {
                format!("{} {name}", trim_float(v, 2))
            } else {
                format!("{bytes} B")
            };
        }
    }
    format!("{bytes} B")
}

/// Bytes to three significant digits in the largest binary unit that fits:
/// `14.5 GiB`, `1 GiB`, `512 B` (for free space and memory, never exact).
pub fn fmt_size_approx(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (name, shift) in UNITS {
        if bytes >= 1u64 << shift {
            let v = bytes as f64 / (1u64 << shift) as f64;
            let decimals = if v >= 100.0 { 0 } else if v >= 10.0 { 1 } else { 2 };
            return format!("{} {name}", trim_float(v, decimals));
        }
    }
    format!("{bytes} B")
}

/// Compact size for table cells: `128K`, `1M`, `4M`, `1.5M`, `1000`.
pub fn fmt_size_short(bytes: u64) -> String {
    for (name, shift) in [("G", 30u32), ("M", 20), ("K", 10)] {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes % (unit / 16) == 0 {
            return format!("{}{name}", trim_float(bytes as f64 / unit as f64, 4));
        }
    }
    bytes.to_string()
}

fn trim_float(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("1.1").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert_eq!(parse_positive_size("0"), Err("must be positive".into()));
        assert_eq!(parse_positive_size_u64("1G"), Ok(1 << 30));
    }

    #[test]
    fn counts_bools_engines_choices() {
        assert_eq!(parse_count("8"), Ok(8));
        assert!(parse_count("0").is_err());
        assert!(parse_count("4k").is_err());
        assert_eq!(parse_bool("on"), Ok(true));
        assert!(parse_bool("maybe").is_err());
        assert_eq!(parse_engine("uring"), Ok(EngineKind::Uring));
        assert_eq!(parse_engine("psync"), Ok(EngineKind::Psync));
        assert!(parse_engine("libaio").is_err());
        assert_eq!(parse_choice("both"), Ok(Choice::Both));
        assert_eq!(parse_choice("true,false"), Ok(Choice::Both));
        assert_eq!(parse_choice("true"), Ok(Choice::Only(true)));
        assert_eq!(parse_choice("no").map(Choice::values), Ok(vec![false]));
        assert!(parse_choice("sometimes").is_err());
        assert_eq!(dedup(vec![131072, 1 << 20, 131072]), vec![131072, 1 << 20]);
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_size(3 << 19), "1.5 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
        assert_eq!(fmt_size_short(128 << 10), "128K");
        assert_eq!(fmt_size_short(1 << 20), "1M");
        assert_eq!(fmt_size_short(1000), "1000");
        assert_eq!(fmt_size_approx(15_535_210_496), "14.5 GiB");
        assert_eq!(fmt_size_approx(4_001_792), "3.82 MiB");
        assert_eq!(fmt_size_approx(1 << 30), "1 GiB");
        assert_eq!(fmt_size_approx(251 << 30), "251 GiB");
        assert_eq!(fmt_size_approx(512), "512 B");
    }
}
