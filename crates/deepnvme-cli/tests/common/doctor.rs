//! What the doctor's tests share: running `deepnvme doctor --json`, finding
//! and checking findings, the DeepSpeed config they write, and the broken
//! setups' building blocks (a private mount namespace, a loop-mounted ext4).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::{stderr, stdout, BIN};

/// Reports a skipped test on stderr, past libtest's output capture (which
/// hides what a passing test prints), so a skip is never silent.
pub fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// Whether this machine has an NVIDIA GPU: the driver lists one, or a
/// device node (`/dev/nvidia0`, ...) is there.
pub fn nvidia_gpu() -> bool {
    let listed = std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some());
    let node = std::fs::read_dir("/dev").is_ok_and(|d| {
        d.flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("nvidia").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
    });
    listed || node
}

pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `tool` is an executable on PATH (`mkfs.ext4 --version` exits 1,
/// so running it proves nothing).
pub fn have(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .any(|d| std::fs::metadata(d.join(tool)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
    })
}

/// `deepnvme doctor ARGS` in `cwd`, with no `--dir`: the folders come from
/// the config (or the current directory).
pub fn doctor_in(cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("doctor")
        .args(args)
        .current_dir(cwd)
        .env("DEEPNVME_LOG", "quiet")
        .env_remove("DEEPNVME_ENGINE")
        .env_remove("DEEPNVME_CUFILE_LIB")
        .env_remove("DS_ACCELERATOR");
    cmd
}

/// `deepnvme doctor --dir DIR ARGS`.
pub fn doctor_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = doctor_in(dir, &[]);
    cmd.arg("--dir").arg(dir).args(args);
    cmd
}

/// The report of a `--json` run and its exit status.
pub fn report(o: &Output) -> (Value, Option<i32>) {
    let j = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(o), stderr(o)));
    (j, o.status.code())
}

pub fn run(mut cmd: Command) -> (Value, Option<i32>, String) {
    let o = cmd.output().expect("running deepnvme doctor");
    let (j, code) = report(&o);
    (j, code, stderr(&o))
}

/// Every finding `section`/`check`.
pub fn findings<'a>(j: &'a Value, section: &str, check: &str) -> Vec<&'a Value> {
    j["checks"]
        .as_array()
        .map(|c| c.iter().filter(|f| f["section"] == section && f["check"] == check).collect())
        .unwrap_or_default()
}

/// The finding `section`/`check`; panics with the whole report when absent.
pub fn finding<'a>(j: &'a Value, section: &str, check: &str) -> &'a Value {
    findings(j, section, check).into_iter().next().unwrap_or_else(|| panic!("no {section}/{check} finding in {j:#}"))
}

/// The finding `section`/`check` about config key `key`.
pub fn finding_at<'a>(j: &'a Value, section: &str, check: &str, key: &str) -> &'a Value {
    findings(j, section, check)
        .into_iter()
        .find(|f| f["key"].as_str().is_some_and(|k| k.split(", ").any(|k| k == key)))
        .unwrap_or_else(|| panic!("no {section}/{check} finding about {key} in {j:#}"))
}

pub fn text(f: &Value, key: &str) -> String {
    f[key].as_str().unwrap_or("").to_string()
}

/// Asserts `f` has `status` and that its why (or summary) and fix contain the words.
pub fn expect(f: &Value, status: &str, why: &[&str], fix: &[&str]) {
    assert_eq!(f["status"], status, "{f:#}");
    for w in why {
        assert!(text(f, "why").contains(w) || text(f, "summary").contains(w), "why lacks {w:?}: {f:#}");
    }
    for w in fix {
        assert!(text(f, "fix").contains(w), "fix lacks {w:?}: {f:#}");
    }
}

/// The findings that are neither ok nor skip, as "section/check: summary".
pub fn problems(j: &Value) -> Vec<String> {
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["status"] == "warn" || f["status"] == "fail")
        .map(|f| {
            format!("{}/{} {}: {} ({})", f["section"], f["check"], f["status"], text(f, "summary"), text(f, "why"))
        })
        .collect()
}

/// A DeepSpeed config swapping parameters (bf16) and optimizer state to
/// `dir`, with small buffers: 2 x 1e6 bf16 elements lock 3.82 MiB; the
/// swap-out buffer (1.25e5 bf16, sub_group_size) and the optimizer's 4 x
/// 1.25e5 fp32 at most 2.2 MiB more: 6 MiB in all, under the usual 8 MiB.
pub fn write_config(dir: &Path, extra_aio: &str) -> PathBuf {
    let path = dir.join("ds_config.json");
    let cfg = format!(
        r#"{{
  "bf16": {{"enabled": true}},
  "zero_optimization": {{
    "stage": 3, "sub_group_size": 1.25e5,
    "offload_param": {{"device": "nvme", "nvme_path": "{d}", "buffer_count": 2, "buffer_size": 1e6}},
    "offload_optimizer": {{"device": "nvme", "nvme_path": "{d}", "buffer_count": 4}}
  }},
  "aio": {{"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1{extra_aio}}}
}}"#,
        d = dir.display()
    );
    std::fs::write(&path, cfg).unwrap();
    path
}

/// Writes `text` as `dir/name` and returns the path.
pub fn write_json(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(v).unwrap()).unwrap();
    path
}

/// `unshare -m` runs `script` in a private mount namespace: a loop mount
/// made there vanishes (and its loop device detaches) when it exits.
pub fn in_private_namespace(script: &str, args: &[&Path]) -> Output {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-euc", script, "sh"]).args(args);
    cmd.env("DEEPNVME_LOG", "quiet").env_remove("DEEPNVME_ENGINE");
    cmd.output().expect("running unshare")
}

/// An ext4 image of `mib` MiB at `img`.
pub fn ext4_image(img: &Path, mib: u64) {
    std::fs::File::create(img).unwrap().set_len(mib << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(img).output().unwrap();
    assert!(mkfs.status.success(), "{}", stderr(&mkfs));
}

/// Whether `mnt` shows in this process's mounts (a private one must not).
pub fn mounted_here(mnt: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(mnt.to_str().unwrap())
}
