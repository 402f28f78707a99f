//! What a check finds ([`Finding`]: ok, skip, warn or fail, what, why,
//! what to do, and the config key and folder it is about) and how the
//! findings are printed: as indented text, or as one JSON object (`--json`,
//! field names and order are the tool's output format), and the JSON
//! document of a run that could not start ([`ErrorReport`]).

use serde::Serialize;

/// How bad a finding is. `Fail` makes the exit status 1. `Skip` is a
/// check that could not be made here (no fio to compare with, no floor to
/// compare against): neither ok nor a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Skip,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skip => "skip",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One finding of one check.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The section: config, buffers, engine, memlock, filesystem, ...
    pub section: &'static str,
    /// What was checked, short: "io_uring", "RLIMIT_MEMLOCK", ...
    pub check: &'static str,
    pub status: Status,
    /// What was found, in a line.
    pub summary: String,
    /// Why it matters or what caused it (the facts it rests on).
    pub why: String,
    /// What to do; `None` when nothing needs doing.
    pub fix: Option<String>,
    /// The config key (or keys, comma-separated, or `--dir`) the finding is
    /// about: `zero_optimization.offload_optimizer.nvme_path`, `aio.queue_depth`.
    pub key: Option<String>,
    /// The folder it is about, for the sections that check each folder.
    pub path: Option<String>,
}

impl Finding {
    pub fn new(section: &'static str, check: &'static str, status: Status, summary: impl Into<String>) -> Finding {
        Finding {
            section,
            check,
            status,
            summary: summary.into(),
            why: String::new(),
            fix: None,
            key: None,
            path: None,
        }
    }
    pub fn ok(section: &'static str, check: &'static str, summary: impl Into<String>) -> Finding {
        Finding::new(section, check, Status::Ok, summary)
    }
    pub fn warn(section: &'static str, check: &'static str, summary: impl Into<String>) -> Finding {
        Finding::new(section, check, Status::Warn, summary)
    }
    pub fn fail(section: &'static str, check: &'static str, summary: impl Into<String>) -> Finding {
        Finding::new(section, check, Status::Fail, summary)
    }
    pub fn why(mut self, why: impl Into<String>) -> Finding {
        self.why = why.into();
        self
    }
    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
    pub fn key(mut self, key: impl Into<String>) -> Finding {
        self.key = Some(key.into());
        self
    }
    pub fn skip(section: &'static str, check: &'static str, summary: impl Into<String>) -> Finding {
        Finding::new(section, check, Status::Skip, summary)
    }
}

/// `doctor --json`.
#[derive(Serialize)]
pub struct Report<'a> {
    pub command: &'static str,
    pub version: &'static str,
    /// The first folder checked (kept for scripts written for one folder).
    pub dir: String,
    /// Every folder checked: the config's nvme_paths, then each --dir.
    pub dirs: Vec<String>,
    pub config: Option<String>,
    /// The worst status found.
    pub status: Status,
    pub counts: Counts,
    pub checks: &'a [Finding],
}

#[derive(Serialize, Default, Debug, PartialEq, Eq)]
pub struct Counts {
    pub ok: usize,
    pub skip: usize,
    pub warn: usize,
    pub fail: usize,
}

/// `doctor --json` when the doctor could not run (exit status 2): a bad
/// command line, a config file it cannot read or parse, a `--dir` that is
/// not a folder. stdout is then still one JSON document.
#[derive(Serialize)]
pub struct ErrorReport<'a> {
    pub command: &'static str,
    pub version: &'static str,
    /// Always "error".
    pub status: &'static str,
    pub exit_code: i32,
    pub error: &'a str,
    /// Always empty: no check ran.
    pub checks: [Finding; 0],
}

impl ErrorReport<'_> {
    pub fn new(error: &str) -> ErrorReport<'_> {
        ErrorReport {
            command: "doctor",
            version: env!("CARGO_PKG_VERSION"),
            status: "error",
            exit_code: 2,
            error,
            checks: [],
        }
    }
}

pub fn counts(findings: &[Finding]) -> Counts {
    let mut c = Counts::default();
    for f in findings {
        match f.status {
            Status::Ok => c.ok += 1,
            Status::Skip => c.skip += 1,
            Status::Warn => c.warn += 1,
            Status::Fail => c.fail += 1,
        }
    }
    c
}

/// Wraps `text` at `width` columns, continuation lines indented by `indent`.
fn wrap(text: &str, first: &str, indent: usize, width: usize) -> String {
    let mut out = String::from(first);
    let mut col = first.chars().count();
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if col > indent && col + 1 + len > width {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
        } else {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += len;
    }
    out
}

/// The findings of one section, as text; those about a folder under a line
/// naming it and the config keys that give it. A section without findings
/// (nothing of the config's to check) prints nothing.
pub fn print_section(name: &str, findings: &[Finding]) {
    if findings.is_empty() {
        return;
    }
    println!("\n{name}");
    let mut shown: Option<(&Option<String>, &Option<String>)> = None;
    for f in findings {
        if f.path.is_some() && shown != Some((&f.path, &f.key)) {
            let key = f.key.as_ref().map(|k| format!(" ({k})")).unwrap_or_default();
            println!("  {}{key}", f.path.as_deref().unwrap_or(""));
            shown = Some((&f.path, &f.key));
        }
        let head = format!("  {:<5} {}:", f.status.label(), f.check);
        println!("{}", wrap(&f.summary, &head, 10, 100));
        if !f.why.is_empty() {
            println!("{}", wrap(&f.why, "        why:", 13, 100));
        }
        if let Some(fix) = &f.fix {
            println!("{}", wrap(fix, "        fix:", 13, 100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_every_word_and_the_width() {
        let text = "one two three four five six seven eight nine ten eleven twelve";
        let w = wrap(text, "  ok    x:", 10, 30);
        assert!(w.lines().all(|l| l.chars().count() <= 30), "{w}");
        assert_eq!(w.split_whitespace().skip(2).collect::<Vec<_>>().join(" "), text);
        assert!(w.lines().skip(1).all(|l| l.starts_with("          ") && !l.starts_with("           ")), "{w}");
        // A word longer than the width goes on a line of its own, whole.
        let long = "x".repeat(50);
        assert!(wrap(&long, "  ok    x:", 10, 30).contains(&long));
    }

    #[test]
    fn counts_and_order() {
        let f = [Finding::ok("s", "a", ""), Finding::warn("s", "b", ""), Finding::fail("s", "c", "").fix("do")];
        assert_eq!(counts(&f), Counts { ok: 1, skip: 0, warn: 1, fail: 1 });
        assert!(Status::Skip > Status::Ok && Status::Skip < Status::Warn);
        assert_eq!(f.iter().map(|f| f.status).max(), Some(Status::Fail));
        assert_eq!(serde_json::to_value(Status::Warn).unwrap(), "warn");
    }
}
