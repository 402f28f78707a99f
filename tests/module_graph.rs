//! The core's files form a DAG: no file of `src/` reaches, through the
//! paths it names (`crate::…`, `super::…`, its own child modules), a file
//! that reaches back to it. Test code (`#[cfg(test)]` modules, the
//! `internal_tests` folder, `test_support.rs`, `tests.rs` files) is left
//! out: tests may look at anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file's module path (`op::window` for src/bounce/window.rs).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().to_string()).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if name != "internal_tests" {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && name != "test_support.rs" {
            out.push(p);
        }
    }
}

/// The file's text without `#[cfg(test)]` items (a `mod tests { … }` block
/// or a one-line item after the attribute) and without comments.
fn production_text(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            // Skip the next item: to its matching brace, or its line.
            let mut depth = 0i32;
            let mut opened = false;
            for l in lines.by_ref() {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// Module paths a file names: `crate::a::b…` and `super::…` (resolved),
/// and `mod x;` children.
fn named_modules(module: &str, text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let own: Vec<&str> = if module.is_empty() { vec![] } else { module.split("::").collect() };
    // The module `super` names: the parent of this file's module.
    let parent: Vec<&str> = own[..own.len().saturating_sub(1)].to_vec();
    let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).collect();
    for w in words {
        let segs: Vec<&str> = w.split("::").filter(|s| !s.is_empty()).collect();
        // `super::{a, b}` and `crate::x::{a, b}` split into a word that ends
        // in `::`: it names that module. A lone `super` or `crate` without
        // `::` is a visibility (`pub(super)`), not a path.
        if segs.len() < 2 && !w.ends_with("::") {
            continue;
        }
        if segs.len() == 1 && segs[0] == "crate" {
            continue; // `crate::{…}`: the crate root, left out below
        }
        let path: Vec<String> = match segs.first() {
            Some(&"crate") => segs[1..].iter().map(|s| s.to_string()).collect(),
            Some(&"super") => parent.iter().map(|s| s.to_string()).chain(segs[1..].iter().map(|s| s.to_string())).collect(),
            Some(&"self") => own.iter().map(|s| s.to_string()).chain(segs[1..].iter().map(|s| s.to_string())).collect(),
            _ => continue,
        };
        out.insert(path.join("::"));
    }
    // `use child::X` / `child::f()` inside a parent refer to its child modules.
    for line in text.lines() {
        let t = line.trim();
        let decl = t.strip_prefix("pub(crate) mod ").or_else(|| t.strip_prefix("pub mod ")).or_else(|| t.strip_prefix("mod "));
        if let Some(name) = decl.and_then(|d| d.strip_suffix(';')) {
            let child = if module.is_empty() { name.to_string() } else { format!("{module}::{name}") };
            // A child only counts as named when the parent uses it.
            let uses = text.contains(&format!("{name}::"));
            if uses {
                out.insert(child);
            }
        }
    }
    out
}

/// Every file of `src/` (as its module path) and the files it names.
fn file_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files.iter().map(|f| (module_of(&src, f), f.clone())).collect();
    // The file a module path lands in: its longest prefix that is a file.
    let file_of = |path: &str| -> Option<String> {
        let segs: Vec<&str> = path.split("::").collect();
        (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|m| modules.contains_key(m))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = production_text(&std::fs::read_to_string(file).unwrap());
        let targets = named_modules(module, &text)
            .into_iter()
            .filter_map(|p| file_of(&p))
            .filter(|t| t != module && !t.is_empty())
            .collect();
        edges.insert(module.clone(), targets);
    }
    // lib.rs names every module (declarations and re-exports): not an import.
    edges.remove("");
    edges
}

/// The layers, bottom up: a file under the first path may name only files
/// under the paths listed beside it (its own layer's included). So the
/// runtime infrastructure (`rt/`) never reaches up into the domain modules
/// (it shares only `error` and `knobs`, the base every level reads), and
/// GDS is three floors: the dlopen'ed libraries (`gds::shim`), the driver
/// (`gds::driver`) on them, the transfers (`gds::transfer`) on both; the
/// types every floor shares (`gds::error`, `gds::region`) sit below them.
const LAYERS: &[(&str, &[&str])] = &[
    ("rt", &["rt", "error", "knobs"]),
    ("gds::error", &["gds::error", "gds::region", "gds::shim", "error", "knobs", "rt"]),
    ("gds::region", &["gds::region"]),
    ("gds::shim", &["gds::shim", "gds::error", "gds::region", "error", "knobs", "rt"]),
    ("gds::driver", &["gds::driver", "gds::shim", "gds::error", "gds::region", "error", "knobs", "rt"]),
    (
        "gds::transfer",
        &["gds::transfer", "gds::driver", "gds::shim", "gds::error", "gds::region", "error", "file", "knobs", "rt"],
    ),
];

fn under(module: &str, prefix: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

#[test]
fn layers_name_only_what_lies_below_them() {
    let edges = file_edges();
    let mut wrong = Vec::new();
    for (from, targets) in &edges {
        for (layer, may) in LAYERS {
            if !under(from, layer) {
                continue;
            }
            for t in targets {
                if !may.iter().any(|m| under(t, m)) {
                    wrong.push(format!("{from} -> {t} (the layer {layer} may name only {may:?})"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "files reaching above their layer:\n  {}", wrong.join("\n  "));
}

#[test]
fn no_import_cycle_between_files_of_src() {
    let mut edges = file_edges();
    // The one allowed cycle: the crate's error type wraps the GDS error
    // (`Error::Gds(GdsError)`), as error enums do.
    if let Some(e) = edges.get_mut("error") {
        e.remove("gds");
    }
    // Strongly connected components of more than one file are cycles.
    let cycles: Vec<String> = components(&edges).into_iter().filter(|c| c.len() > 1).map(|c| c.join(" <-> ")).collect();
    let new: Vec<&String> = cycles.iter().filter(|c| !KNOWN_CYCLES.contains(&c.as_str())).collect();
    let gone: Vec<&&str> = KNOWN_CYCLES.iter().filter(|k| !cycles.iter().any(|c| c == *k)).collect();
    assert!(new.is_empty(), "new import cycles between files of src/:\n  {}", new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  "));
    assert!(gone.is_empty(), "cycles fixed: remove them from KNOWN_CYCLES: {gone:?}");
}

/// Cycles left to be broken (the list may only shrink): none.
const KNOWN_CYCLES: &[&str] = &[];

/// Tarjan's strongly connected components, each sorted.
fn components(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        on: BTreeSet<String>,
        stack: Vec<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn strong(t: &mut T<'_>, v: &str) {
        t.index.insert(v.to_string(), t.next);
        t.low.insert(v.to_string(), t.next);
        t.next += 1;
        t.stack.push(v.to_string());
        t.on.insert(v.to_string());
        let targets: Vec<String> = t.edges.get(v).into_iter().flatten().cloned().collect();
        for w in targets {
            if !t.index.contains_key(&w) {
                strong(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            comp.sort();
            t.out.push(comp);
        }
    }
    let mut t = T { edges, index: BTreeMap::new(), low: BTreeMap::new(), on: BTreeSet::new(), stack: Vec::new(), next: 0, out: Vec::new() };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            strong(&mut t, v);
        }
    }
    t.out
}
