use super::*;

#[test]
fn engine_names_parse() {
    assert_eq!(parse_engine("io_uring"), Some(EngineChoice::Uring));
    assert_eq!(parse_engine(" PSYNC "), Some(EngineChoice::Psync));
    assert_eq!(parse_engine(""), Some(EngineChoice::Auto));
    assert_eq!(parse_engine("libaio"), None);
}

#[test]
fn numbers_and_switches_parse_and_anything_else_is_malformed() {
    let mut bad = Vec::new();
    assert_eq!(mib_value("X_MB", Some(" 64 ".into()), || 7, &mut bad), 64);
    assert_eq!(mib_value("X_MB", None, || 7, &mut bad), 7);
    assert!(bad.is_empty());
    for v in ["64MB", "1e3", "-1", "0x40"] {
        assert_eq!(mib_value("X_MB", Some(v.into()), || 7, &mut bad), 7, "{v}");
    }
    assert_eq!(bad.len(), 4);
    assert!(bad[0].contains("X_MB=\"64MB\"") && bad[0].contains("MiB"), "{}", bad[0]);

    let mut bad = Vec::new();
    for (v, want) in [("1", true), ("TRUE", true), ("on", true), ("yes", true), ("0", false), ("off", false), ("No", false)] {
        assert_eq!(switch_value("X_ON", Some(v.into()), !want, &mut bad), want, "{v}");
    }
    assert!(switch_value("X_ON", None, true, &mut bad));
    assert!(bad.is_empty(), "{bad:?}");
    assert!(switch_value("X_ON", Some("disable".into()), true, &mut bad));
    assert!(bad.len() == 1 && bad[0].contains("X_ON=\"disable\""), "{bad:?}");

    let mut bad = Vec::new();
    for (v, quiet) in [("quiet", true), (" OFF", true), ("0", true), ("1", false), ("info", false), ("on", false)] {
        assert_eq!(quiet_value("X_LOG", Some(v.into()), &mut bad), quiet, "{v}");
    }
    assert!(!quiet_value("X_LOG", None, &mut bad));
    assert!(bad.is_empty(), "{bad:?}");
    assert!(!quiet_value("X_LOG", Some("verbose".into()), &mut bad));
    assert!(bad.len() == 1 && bad[0].contains("X_LOG=\"verbose\""), "{bad:?}");
}

#[test]
fn every_variable_is_documented_once() {
    let mut names: Vec<_> = VARIABLES.iter().map(|v| v.name).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "a variable is listed twice");
    assert!(VARIABLES.iter().all(|v| !v.meaning.is_empty() && !v.default.is_empty()));
}

/// The README's table and every `DEEPNVME_*` name used anywhere in the
/// repository's sources and scripts agree with [`VARIABLES`].
#[test]
fn readme_and_sources_use_only_listed_variables() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    for v in VARIABLES {
        assert!(readme.contains(&format!("`{}`", v.name)), "README's knob table lacks {}", v.name);
    }
    let mut used = std::collections::BTreeSet::new();
    let mut stack: Vec<std::path::PathBuf> =
        ["src", "bindings", "tests", "benches", "cpp", "crates"].iter().map(|d| root.join(d)).collect();
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&p) else { continue };
        if meta.is_dir() {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if matches!(name, "target" | "build" | "__pycache__") || name.ends_with(".egg-info") {
                continue;
            }
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        } else if let Ok(text) = std::fs::read_to_string(&p) {
            let mut rest = text.as_str();
            while let Some(i) = rest.find("DEEPNVME_") {
                let tail = &rest[i..];
                let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
                let name = &tail[..end];
                if name.len() > "DEEPNVME_".len() && !name.ends_with('_') {
                    used.insert((name.to_string(), p.display().to_string()));
                }
                rest = &tail[end..];
            }
        }
    }
    // Names tests pass to their own child processes are not knobs.
    let private = [
        "DEEPNVME_VALIDATE_CHILD",
        "DEEPNVME_VALIDATE_ENGINE",
        "DEEPNVME_GDS_TEST_CHILD",
        "DEEPNVME_BOUNCE_TEST_CHILD",
        "DEEPNVME_BOUNCE_TEST_ENGINE",
        // The doctor hands the config path to its own Python probe, or the
        // file to read DeepSpeed's way and the marker to print before it.
        "DEEPNVME_DOCTOR_CONFIG",
        "DEEPNVME_DOCTOR_READ",
        "DEEPNVME_DOCTOR_MARKER",
        // The console script tells the CLI binary which Python it ran in.
        "DEEPNVME_CLI_PYTHON",
    ];
    for (name, file) in used {
        if private.contains(&name.as_str()) {
            continue;
        }
        assert!(VARIABLES.iter().any(|v| v.name == name), "{file} uses {name}, which knobs::VARIABLES does not list");
    }
}
