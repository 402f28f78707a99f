//! What the CLI's integration tests share: the binary, a temp dir under
//! the target dir (a real file system, so O_DIRECT is real), running the
//! tool and reading its output.
#![allow(dead_code)]

pub mod doctor;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_deepnvme");

/// A directory under `CARGO_TARGET_TMPDIR`, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("deepnvme-cli-tests")
            .join(format!("{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the test directory");
        TempDir(path)
    }

    /// The names of the entries in the directory.
    pub fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the tool in `dir` with informational lines silenced.
pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("DEEPNVME_LOG", "quiet")
        .env_remove("DEEPNVME_ENGINE")
        .output()
        .expect("running the deepnvme binary")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a command that must succeed and print one JSON object.
pub fn json_of(dir: &Path, args: &[&str]) -> Value {
    let o = run_in(dir, args);
    assert!(o.status.success(), "deepnvme {args:?} failed: {}{}", stdout(&o), stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("deepnvme {args:?}: not JSON ({e}): {}", stdout(&o)))
}

pub fn positive(v: &Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    x
}
