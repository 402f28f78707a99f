//! Every relative link in README.md and docs/ resolves: the file exists,
//! and an anchor names a heading of it (GitHub's slugs).

use std::path::{Path, PathBuf};

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            markdown_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with('#')).map(|l| slug(l.trim_start_matches('#'))).collect()
}

/// The targets of `[text](target)` links, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let tail = &rest[i + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            }
            if !anchor.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(&target).unwrap();
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n  {}", broken.join("\n  "));
}
