//! The crate's public surface, listed from the source and compared with
//! `tests/public_api.txt`, so that it only changes on purpose: a new `pub`
//! item (or a `pub` that went away) fails here until the list is updated
//! (`DEEPNVME_BLESS_API=1 cargo test --test public_api` rewrites it).
//!
//! The walk starts at `src/lib.rs` and follows what a user can name: `pub
//! use` re-exports, `pub mod` modules and the `pub` items inside them
//! (`#[doc(hidden)]` counts: hidden is still public). Methods are left out;
//! a type counts once. `test_support` (feature `test-support`, for the
//! tests) is listed but not walked nor counted.

use std::path::{Path, PathBuf};

/// The surface must stay small (the issue's bound).
const MAX_ITEMS: usize = 60;

/// The text with comments, string and char literals blanked (braces inside
/// them would throw off the depth count); newlines are kept.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) && !prev_ident(b, i) {
            // A raw string r#"…"#: find its closing quote and hashes.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                if b[j] == b'\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j + close.len();
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == b'\'' && (b.get(i + 1) == Some(&b'\\') || b.get(i + 2) == Some(&b'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) is left alone.
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn prev_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The items at the top level of a module's code: (attributes, the item's
/// text up to its body or `;`, its braced body when it is an inline `mod`).
fn top_items(code: &str) -> Vec<(String, String, Option<String>)> {
    let mut items = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    let mut attrs = String::new();
    while i < chars.len() {
        if chars[i].is_whitespace() {
            i += 1;
            continue;
        }
        if chars[i] == '#' {
            // An attribute: to its matching `]`.
            let start = i;
            let mut depth = 0;
            while i < chars.len() {
                match chars[i] {
                    '[' => depth += 1,
                    ']' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            attrs.push_str(&chars[start..i].iter().collect::<String>());
            attrs.push(' ');
            continue;
        }
        // An item: to a `;` at depth 0, or to the `}` closing its first brace.
        let start = i;
        let mut head_end = None;
        let mut body = None;
        let mut depth = 0;
        while i < chars.len() {
            match chars[i] {
                '{' | '(' | '[' => {
                    if chars[i] == '{' && depth == 0 && head_end.is_none() {
                        head_end = Some(i);
                    }
                    depth += 1;
                }
                '}' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 && chars[i] == '}' && head_end.is_some() {
                        let h = head_end.unwrap();
                        body = Some(chars[h + 1..i].iter().collect::<String>());
                        // `use a::{b, c};` goes on to its `;`.
                        let head: String = chars[start..h].iter().collect();
                        if head.trim_start().starts_with("pub use") || head.contains(" use ") || head.trim_start().starts_with("use") {
                            head_end = None;
                            body = None;
                        } else {
                            i += 1;
                            break;
                        }
                    }
                }
                ';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let end = head_end.unwrap_or(i.min(chars.len()));
        let head: String = chars[start..end].iter().collect::<String>().split_whitespace().collect::<Vec<_>>().join(" ");
        items.push((std::mem::take(&mut attrs), head, body));
    }
    items
}

/// The names a `use` tree brings in: `a::{b, c::d as e, f::self}` → b, e, f.
fn use_leaves(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let prefix = tree[..open].trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let mut parts = Vec::new();
        let (mut depth, mut last) = (0, 0);
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&inner[last..k]);
                    last = k + 1;
                }
                _ => {}
            }
        }
        parts.push(&inner[last..]);
        return parts
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .flat_map(|p| {
                if p.trim() == "self" {
                    vec![prefix.rsplit("::").next().unwrap().to_string()]
                } else {
                    use_leaves(p)
                }
            })
            .collect();
    }
    if let Some((_, alias)) = tree.split_once(" as ") {
        return vec![alias.trim().to_string()];
    }
    vec![tree.rsplit("::").next().unwrap().trim().to_string()]
}

/// The file of module `name` declared in `dir` (the declaring file's
/// directory for its children).
fn module_file(dir: &Path, name: &str) -> PathBuf {
    let flat = dir.join(format!("{name}.rs"));
    if flat.exists() { flat } else { dir.join(name).join("mod.rs") }
}

/// The features an item's `cfg` asks for, as a suffix of its line.
fn gate(attrs: &str) -> String {
    let features: Vec<&str> = attrs.split("feature = ").skip(1).map(|s| s.split('"').nth(1).unwrap_or("")).collect();
    // Feature names were blanked with the strings: read them from the raw
    // text instead (see `walk`).
    if features.is_empty() { String::new() } else { format!(" [feature {}]", features.join(", ")) }
}

/// Lists the public items of the module whose code is `code` (its children
/// live in `dir`), under the path `path`.
fn walk(code: &str, raw_attrs: &dyn Fn(&str) -> String, dir: &Path, path: &str, out: &mut Vec<String>) {
    for (attrs, head, body) in top_items(code) {
        if attrs.contains("#[cfg(test)]") {
            continue;
        }
        let Some(rest) = head.strip_prefix("pub ") else { continue };
        let feature = gate(&raw_attrs(&head));
        let words: Vec<&str> = rest.split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == ':' || c == '{' || c == ';').filter(|w| !w.is_empty()).collect();
        let (kind, name) = match words.as_slice() {
            ["use", ..] => {
                let tree = rest.trim_start_matches("use").trim().trim_end_matches(';');
                for leaf in use_leaves(tree) {
                    out.push(format!("use {path}::{leaf}{feature}"));
                }
                continue;
            }
            ["unsafe", "fn", name, ..] | ["const", "fn", name, ..] | ["unsafe", "trait", name, ..] => ("fn", *name),
            [kind @ ("fn" | "struct" | "enum" | "union" | "trait" | "type" | "const" | "static" | "mod"), name, ..] => (*kind, *name),
            other => panic!("{path}: an item this test cannot read: `pub {}`", other.join(" ")),
        };
        let full = format!("{path}::{name}");
        out.push(format!("{kind} {full}{feature}"));
        if kind != "mod" || name == "test_support" {
            continue;
        }
        match body {
            Some(inline) => walk(&inline, raw_attrs, &dir.join(name), &full, out),
            None => {
                let file = module_file(dir, name);
                let raw = std::fs::read_to_string(&file).unwrap();
                let child_dir = if file.ends_with("mod.rs") { file.parent().unwrap().to_path_buf() } else { dir.join(name) };
                walk(&code_only(&raw), &|h| attrs_before(&raw, h), &child_dir, &full, out);
            }
        }
    }
}

/// The attribute lines just above the line where `head` (an item's first
/// words) starts in the raw text, so that feature names survive.
fn attrs_before(raw: &str, head: &str) -> String {
    let first: String = head.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let lines: Vec<&str> = raw.lines().collect();
    let Some(at) = lines.iter().position(|l| l.split_whitespace().collect::<Vec<_>>().join(" ").starts_with(&first)) else {
        return String::new();
    };
    let mut attrs = Vec::new();
    for l in lines[..at].iter().rev() {
        let t = l.trim();
        if t.starts_with("#[") {
            attrs.push(t);
        } else if !t.starts_with("///") {
            break;
        }
    }
    attrs.join(" ")
}

fn public_items() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let raw = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut out = Vec::new();
    walk(&code_only(&raw), &|h| attrs_before(&raw, h), &src, "deepnvme", &mut out);
    out.sort();
    out.dedup();
    out
}

#[test]
fn public_surface_is_the_listed_one() {
    let listed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/public_api.txt");
    let items = public_items();
    let text = format!(
        "# The public surface of the crate `deepnvme` (tests/public_api.rs checks it).\n\
         # Rewrite with DEEPNVME_BLESS_API=1 cargo test --test public_api, on purpose.\n{}\n",
        items.join("\n")
    );
    if std::env::var_os("DEEPNVME_BLESS_API").is_some() {
        std::fs::write(&listed_path, &text).unwrap();
    }
    let listed = std::fs::read_to_string(&listed_path).unwrap_or_default();
    let listed: Vec<&str> = listed.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    let added: Vec<&String> = items.iter().filter(|i| !listed.contains(&i.as_str())).collect();
    let removed: Vec<&&str> = listed.iter().filter(|l| !items.iter().any(|i| i == **l)).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the public surface changed (update tests/public_api.txt on purpose):\n  added: {added:#?}\n  removed: {removed:#?}"
    );
    let counted = items.iter().filter(|i| !i.contains("test_support")).count();
    assert!(counted < MAX_ITEMS, "{counted} public items; the bound is {MAX_ITEMS}");
}

/// The walk itself reads what it must: a `use` tree, an inline module.
#[test]
fn the_walk_reads_use_trees_and_inline_modules() {
    assert_eq!(use_leaves("a::{b, c::d as e, f::{self, g}}"), ["b", "e", "f", "g"]);
    let code = code_only("pub mod m { pub fn f() {} fn g() {} }\npub(crate) fn h() {}\n/// {\npub const C: &str = \"}\";\n");
    let mut out = Vec::new();
    walk(&code, &|_| String::new(), Path::new("."), "x", &mut out);
    assert_eq!(out, ["mod x::m", "fn x::m::f", "const x::C"]);
}
