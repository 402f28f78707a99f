//! What a check finds ([`Finding`]: ok, warn or fail, what, why, what to
//! do) and how the findings are printed: as indented text, or as one JSON
//! object (`--json`, field names and order are the tool's output format).

use serde::Serialize;

/// How bad a finding is. `Fail` makes the exit status 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// One finding of one check.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// The section: engine, memlock, filesystem, device, gds, frontend, bench.
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
}

impl Finding {
    pub fn new(section: &'static str, check: &'static str, status: Status, summary: impl Into<String>) -> Finding {
        Finding { section, check, status, summary: summary.into(), why: String::new(), fix: None }
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
}

/// `doctor --json`.
#[derive(Serialize)]
pub struct Report<'a> {
    pub command: &'static str,
    pub version: &'static str,
    pub dir: String,
    pub config: Option<String>,
    /// The worst status found.
    pub status: Status,
    pub counts: Counts,
    pub checks: &'a [Finding],
}

#[derive(Serialize, Default, Debug, PartialEq, Eq)]
pub struct Counts {
    pub ok: usize,
    pub warn: usize,
    pub fail: usize,
}

pub fn counts(findings: &[Finding]) -> Counts {
    let mut c = Counts::default();
    for f in findings {
        match f.status {
            Status::Ok => c.ok += 1,
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

/// The findings of one section, as text.
pub fn print_section(name: &str, findings: &[Finding]) {
    println!("\n{name}");
    for f in findings {
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
        assert_eq!(counts(&f), Counts { ok: 1, warn: 1, fail: 1 });
        assert_eq!(f.iter().map(|f| f.status).max(), Some(Status::Fail));
        assert_eq!(serde_json::to_value(Status::Warn).unwrap(), "warn");
    }
}
