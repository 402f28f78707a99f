//! Hand-written command-line parsing: a cursor over the arguments that
//! splits `--name=value`, typed values (sizes with k/M/G suffixes, counts,
//! booleans, comma-separated lists), human-readable sizes for output, and
//! the [`CliError`] that decides the exit status (2 for usage errors).

use std::fmt;

/// Why the tool stops early. `main` maps each to an exit status.
#[derive(Debug)]
pub enum CliError {
    /// A bad command line: exit status 2, with a pointer to `--help`.
    Usage { msg: String, command: &'static str },
    /// The work itself failed (I/O error, allocation, ...): exit status 1.
    Failed(String),
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
            CliError::Failed(msg) => write!(f, "{msg}"),
            CliError::Interrupted => write!(f, "interrupted"),
        }
    }
}

impl From<crate::core_api::Error> for CliError {
    fn from(e: crate::core_api::Error) -> Self {
        CliError::Failed(e.to_string())
    }
}

/// One command-line item.
#[derive(Debug, PartialEq, Eq)]
pub enum Arg {
    /// `--name`, `--name=value` or `-x`; `name` keeps its dashes.
    Flag { name: String, inline: Option<String> },
    /// Anything else.
    Positional(String),
}

/// A cursor over the arguments of one (sub)command.
pub struct Args {
    items: Vec<String>,
    pos: usize,
    /// The subcommand, for error messages ("deepnvme bench").
    command: &'static str,
}

impl Args {
    pub fn new(items: Vec<String>, command: &'static str) -> Args {
        Args { items, pos: 0, command }
    }

    /// The next item, with `--name=value` split. After a bare `--`,
    /// everything is positional.
    pub fn next_arg(&mut self) -> Option<Arg> {
        let item = self.items.get(self.pos)?.clone();
        self.pos += 1;
        if item == "--" {
            // Everything after it is positional; none of our commands takes
            // positionals, so the caller reports the first one.
            return self.items.get(self.pos).map(|s| {
                self.pos += 1;
                Arg::Positional(s.clone())
            });
        }
        if let Some(rest) = item.strip_prefix("--") {
            return Some(match rest.split_once('=') {
                Some((name, value)) => Arg::Flag { name: format!("--{name}"), inline: Some(value.to_string()) },
                None => Arg::Flag { name: item.clone(), inline: None },
            });
        }
        if item.len() > 1 && item.starts_with('-') && !looks_numeric(&item) {
            return Some(Arg::Flag { name: item, inline: None });
        }
        Some(Arg::Positional(item))
    }

    /// The value of `flag`: its `=value`, else the next item.
    pub fn value(&mut self, flag: &str, inline: Option<String>) -> Result<String, CliError> {
        if let Some(v) = inline {
            return Ok(v);
        }
        match self.items.get(self.pos) {
            Some(v) => {
                self.pos += 1;
                Ok(v.clone())
            }
            None => Err(self.error(format!("option {flag} needs a value"))),
        }
    }

    /// Parses the value of `flag` with `parse`, naming the flag on failure.
    pub fn parsed<T>(
        &mut self,
        flag: &str,
        inline: Option<String>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, CliError> {
        let v = self.value(flag, inline)?;
        parse(&v).map_err(|why| self.error(format!("bad value {v:?} for {flag}: {why}")))
    }

    /// For an on/off switch: `--flag` is true, `--flag=VALUE` is parsed.
    pub fn switch(&self, flag: &str, inline: Option<String>) -> Result<bool, CliError> {
        match inline {
            None => Ok(true),
            Some(v) => parse_bool(&v).map_err(|why| self.error(format!("bad value {v:?} for {flag}: {why}"))),
        }
    }

    /// Refuses `--flag=value` on a flag that takes none.
    pub fn no_value(&self, flag: &str, inline: &Option<String>) -> Result<(), CliError> {
        match inline {
            Some(v) => Err(self.error(format!("option {flag} takes no value (got {v:?})"))),
            None => Ok(()),
        }
    }

    pub fn error(&self, msg: impl Into<String>) -> CliError {
        CliError::usage(self.command, msg)
    }

    pub fn unknown(&self, arg: Arg) -> CliError {
        match arg {
            Arg::Flag { name, .. } => self.error(format!("unknown option {name}")),
            Arg::Positional(p) => self.error(format!("unexpected argument {p:?}")),
        }
    }
}

/// "-1" or "-0.5" are values, not flags.
fn looks_numeric(s: &str) -> bool {
    s[1..].chars().next().is_some_and(|c| c.is_ascii_digit() || c == '.')
}

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

/// A comma-separated, non-empty list; duplicates are dropped, order kept.
pub fn parse_list<T: PartialEq>(s: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err("empty item in list (use e.g. 128k,1M)".into());
        }
        let v = item(part).map_err(|why| format!("{part:?}: {why}"))?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// `true`, `false` or `both` (also `true,false`) for the tune grids.
pub fn parse_bool_choice(s: &str) -> Result<Vec<bool>, String> {
    if s.trim().eq_ignore_ascii_case("both") {
        return Ok(vec![false, true]);
    }
    parse_list(s, parse_bool)
}

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
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("1.1").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert_eq!(parse_positive_size("0"), Err("must be positive".into()));
    }

    #[test]
    fn lists_and_bools() {
        assert_eq!(parse_list("128k,1M,1M", parse_size), Ok(vec![131072, 1 << 20]));
        assert!(parse_list("1M,", parse_size).is_err());
        assert_eq!(parse_bool_choice("both"), Ok(vec![false, true]));
        assert_eq!(parse_bool_choice("true"), Ok(vec![true]));
        assert!(parse_bool("maybe").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_size(1 << 30), "1 GiB");
        assert_eq!(fmt_size(3 << 19), "1.5 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
        assert_eq!(fmt_size_short(128 << 10), "128K");
        assert_eq!(fmt_size_short(1 << 20), "1M");
        assert_eq!(fmt_size_short(1000), "1000");
    }

    #[test]
    fn cursor() {
        let mut a = Args::new(vec!["--size=1G".into(), "--loops".into(), "3".into(), "-h".into(), "x".into()], "t");
        assert_eq!(a.next_arg(), Some(Arg::Flag { name: "--size".into(), inline: Some("1G".into()) }));
        assert_eq!(a.next_arg(), Some(Arg::Flag { name: "--loops".into(), inline: None }));
        assert_eq!(a.value("--loops", None).unwrap(), "3");
        assert_eq!(a.next_arg(), Some(Arg::Flag { name: "-h".into(), inline: None }));
        assert_eq!(a.next_arg(), Some(Arg::Positional("x".into())));
        assert_eq!(a.next_arg(), None);
        assert!(a.value("--x", None).is_err());
    }
}
