//! GDS probing and driver acquisition, each scenario in a child process (the
//! probe is cached per process, and the driver and environment are
//! process-wide). The test binary re-runs itself with
//! `DEEPNVME_GDS_TEST_CHILD=<scenario>`; the child prints `RESULT:` lines and
//! must exit normally (a panic, abort or hang fails the test).
//!
//! Every scenario passes both without a GPU (the errors must name what is
//! missing) and on a GPU machine (where the same calls may succeed, and then
//! the config/env rules are checked for real).
//!
//! A binary of its own (not a module of `tests/core/`): it re-executes this
//! binary (`--exact child_entry`) with environment variables that cuFile's
//! loader reads once per process.

use deepnvme::test_support as common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use deepnvme::diag::{self, CUFILE_ENV_PATH_JSON, CUFILE_LIB_ENV};
use deepnvme::gds::{self, GdsDriver};
use deepnvme::test_support::CUDA_LIB_ENV;
use deepnvme::{Error, GdsError};

const CHILD: &str = "DEEPNVME_GDS_TEST_CHILD";

/// Whether this process can dlopen `name` (with the test's own search path).
fn loadable(name: &str) -> bool {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: plain dlopen of a shared library by name; never closed (harmless).
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
}

fn fresh_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("deepnvme-gds-probe-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_empty_dir(d: &Path) -> bool {
    std::fs::read_dir(d).map(|mut r| r.next().is_none()).unwrap_or(false)
}

struct Child {
    results: Vec<String>,
    stderr: String,
}

impl Child {
    fn result(&self, key: &str) -> &str {
        let prefix = format!("RESULT:{key}=");
        self.results
            .iter()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("child printed no {key}; results {:?}; stderr:\n{}", self.results, self.stderr))
    }
}

/// Runs scenario `name` in a child with `set` variables set and `unset` removed.
fn run_child(name: &str, set: &[(&str, &str)], unset: &[&str], cwd: Option<&Path>) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"]).env(CHILD, name);
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in set {
        cmd.env(k, v);
    }
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let start = Instant::now();
    let out = cmd.output().expect("spawn the child test process");
    assert!(start.elapsed() < Duration::from_secs(120), "scenario {name} took {:?}", start.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "scenario {name}: the child did not exit cleanly ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    // libtest may print "test child_entry ... " in front of the first line.
    let results: Vec<String> = stdout.lines().filter_map(|l| l.find("RESULT:").map(|i| l[i..].to_string())).collect();
    assert!(results.iter().any(|l| l == "RESULT:done=1"), "scenario {name} did not finish:\n{stdout}\n{stderr}");
    Child { results, stderr }
}

fn say(key: &str, value: impl std::fmt::Display) {
    // One line per result: newlines inside messages are flattened.
    println!("RESULT:{key}={}", value.to_string().replace('\n', " "));
}

fn show<T>(r: &Result<T, GdsError>) -> String {
    match r {
        Ok(_) => "OK".to_string(),
        Err(e) => format!("ERR:{e}"),
    }
}

/// The variant's name, for the parent to check.
fn kind(e: &GdsError) -> &'static str {
    match e {
        GdsError::LibraryNotFound { .. } => "LibraryNotFound",
        GdsError::MissingSymbol { .. } => "MissingSymbol",
        GdsError::Several(_) => "Several",
        GdsError::Cuda { .. } => "Cuda",
        GdsError::NoDevice { .. } => "NoDevice",
        GdsError::CuFile { .. } | GdsError::DriverOpen { .. } | GdsError::DirectIoSize { .. } => "CuFile",
        _ => "other",
    }
}

/// Whether `e` is, or holds, "libcuda was not found".
fn names_missing_libcuda(e: &GdsError) -> bool {
    match e {
        GdsError::LibraryNotFound { library: gds::GdsLibrary::Cuda, .. } => true,
        GdsError::Several(all) => all.iter().any(names_missing_libcuda),
        _ => false,
    }
}

/// Acquire, check the config and env rules while open, release, check again.
fn child_acquire_cycle() {
    let user_env = std::env::var_os(CUFILE_ENV_PATH_JSON);
    match GdsDriver::acquire(64, 2, 1 << 20) {
        Err(e) => {
            say("acquire", format!("ERR:{e}"));
            say("acquire_is_gds_error", matches!(e, Error::Gds(_)));
            say(
                "acquire_source_is_the_gds_error",
                std::error::Error::source(&e).and_then(|s| s.downcast_ref::<GdsError>()).is_some(),
            );
            say("acquire_names_missing_libcuda", matches!(&e, Error::Gds(g) if names_missing_libcuda(g)));
            say("open_count", GdsDriver::open_count());
        }
        Ok(g1) => {
            say("acquire", "OK");
            let g2 = GdsDriver::acquire(128, 1, 1 << 20).expect("second acquire shares the driver");
            say("open_count", GdsDriver::open_count());
            say("settings_kept", g2.settings() == g1.settings() && g1.settings().queue_depth == 64);
            match GdsDriver::config_file() {
                Some(file) => {
                    let dir = file.parent().unwrap().to_path_buf();
                    say("config_dir", dir.display());
                    say("config_dir_mode", format!("{:o}", std::fs::metadata(&dir).unwrap().mode() & 0o777));
                    let text = std::fs::read_to_string(&file).unwrap_or_default();
                    say(
                        "config_has_settings",
                        text.contains("\"max_io_queue_depth\": 64") && text.contains("\"max_io_threads\": 2"),
                    );
                    say("env_points_at_config", std::env::var_os(CUFILE_ENV_PATH_JSON) == Some(file.into_os_string()));
                    drop(g1);
                    say("config_kept_while_open", dir.exists());
                    drop(g2);
                    say("config_removed_at_close", !dir.exists());
                }
                None => {
                    say("config_dir", "none");
                    say("env_unchanged_while_open", std::env::var_os(CUFILE_ENV_PATH_JSON) == user_env);
                    drop((g1, g2));
                }
            }
            say("open_count_after", GdsDriver::open_count());
        }
    }
    let now = std::env::var_os(CUFILE_ENV_PATH_JSON);
    say("env_after_matches_before", now == user_env);
}

/// The child side. Does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(scenario) = std::env::var(CHILD) else { return };
    match scenario.as_str() {
        "probe" => {
            let first = diag::gds_probe();
            say("probe", show(&first));
            say("probe_cached", show(&diag::gds_probe()) == show(&first));
            if let Err(e) = &first {
                say("probe_kind", kind(e));
            }
            say("summary", show(&diag::gds_environment()));
            say("open_count", GdsDriver::open_count());
        }
        "acquire" => child_acquire_cycle(),
        other => panic!("unknown scenario {other}"),
    }
    say("done", 1);
}

#[test]
fn probe_names_libcufile_when_it_cannot_be_found() {
    let c = run_child(
        "probe",
        &[(CUFILE_LIB_ENV, "/nonexistent/deepnvme/libcufile.so.0"), ("LD_LIBRARY_PATH", "")],
        &[],
        None,
    );
    let p = c.result("probe");
    assert!(p.starts_with("ERR:"), "{p}");
    assert!(p.contains("libcufile (cuFile"), "{p}");
    assert!(p.contains("/nonexistent/deepnvme/libcufile.so.0"), "{p}");
    assert!(p.contains("DEEPNVME_CUFILE_LIB is set, so only that was tried"), "{p}");
    assert!(["LibraryNotFound", "Several"].contains(&c.result("probe_kind")), "{}", c.result("probe_kind"));
    assert_eq!(c.result("probe_cached"), "true");
    assert_eq!(c.result("open_count"), "0");
}

#[test]
fn probe_lists_the_default_names_with_a_cleared_library_path() {
    let c = run_child("probe", &[("LD_LIBRARY_PATH", "")], &[CUFILE_LIB_ENV, CUDA_LIB_ENV], None);
    let p = c.result("probe");
    if !loadable("libcufile.so.0") && !loadable("libcufile.so") {
        // Not installed system-wide (this machine): the error must say so, with the names.
        assert!(p.starts_with("ERR:") && p.contains("libcufile (cuFile"), "{p}");
        for name in ["libcufile.so.0", "libcufile.so", "libcufile.so.1"] {
            assert!(p.contains(name), "{name} missing from: {p}");
        }
        assert!(p.contains(CUFILE_LIB_ENV), "hint names the override: {p}");
    } else {
        // Installed system-wide: whatever happens, it is an answer, not a crash.
        assert!(p == "OK" || p.starts_with("ERR:"), "{p}");
    }
}

#[test]
fn probe_with_libcufile_but_no_driver_names_the_driver() {
    let Some(lib) = common::pip_libcufile() else {
        eprintln!("skipped: no pip-installed libcufile.so.0 here");
        return;
    };
    // Deterministic everywhere: libcuda is pointed at a file that does not exist.
    let c =
        run_child("probe", &[(CUFILE_LIB_ENV, &lib), (CUDA_LIB_ENV, "/nonexistent/deepnvme/libcuda.so.1")], &[], None);
    let p = c.result("probe");
    assert!(p.starts_with("ERR:"), "{p}");
    assert!(p.contains("libcuda (the NVIDIA driver's CUDA library) was not found"), "{p}");
    assert!(p.contains("/nonexistent/deepnvme/libcuda.so.1"), "{p}");
    assert!(
        p.contains("libcufile") && p.contains("is at") && p.contains("libcufile.so.0"),
        "names the libcufile found: {p}"
    );
    assert!(!p.contains("libcufile (cuFile, the GPUDirect Storage library) was not found"), "{p}");
    assert_eq!(c.result("probe_kind"), "LibraryNotFound");
    assert!(c.result("summary").starts_with("ERR:"));
}

#[test]
fn probe_with_libcufile_and_the_machines_own_driver() {
    let Some(lib) = common::pip_libcufile() else {
        eprintln!("skipped: no pip-installed libcufile.so.0 here");
        return;
    };
    let cwd = fresh_dir("cwd-probe");
    let tmp = fresh_dir("tmp-probe");
    let c = run_child(
        "probe",
        &[(CUFILE_LIB_ENV, &lib), ("TMPDIR", tmp.to_str().unwrap())],
        &[CUDA_LIB_ENV, CUFILE_ENV_PATH_JSON],
        Some(&cwd),
    );
    let p = c.result("probe");
    if !loadable("libcuda.so.1") {
        // No NVIDIA driver here: the answer names libcuda, and cuFileDriverOpen
        // (which spins forever without libcuda) was never reached.
        assert!(p.starts_with("ERR:") && p.contains("libcuda.so.1"), "{p}");
        assert!(p.contains("is the NVIDIA driver installed"), "{p}");
        assert!(!p.contains("cuFileDriverOpen"), "{p}");
    } else {
        // A driver: either GDS works, or the reason is past the libraries.
        assert!(!p.contains("was not found"), "{p}");
        eprintln!("probe on this machine: {p}; {}", c.result("summary"));
    }
    assert_eq!(c.result("open_count"), "0", "the probe closes what it opened");
    assert!(is_empty_dir(&cwd), "nothing written into the current directory");
    assert!(is_empty_dir(&tmp), "the probe's config directory is removed");
    let _ = std::fs::remove_dir_all(&cwd);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn acquire_fails_cleanly_without_a_gpu_and_leaves_nothing_behind() {
    let cwd = fresh_dir("cwd-nogpu");
    let tmp = fresh_dir("tmp-nogpu");
    let mut set = vec![(CUDA_LIB_ENV, "/nonexistent/deepnvme/libcuda.so.1"), ("TMPDIR", tmp.to_str().unwrap())];
    let lib = common::pip_libcufile();
    if let Some(l) = &lib {
        set.push((CUFILE_LIB_ENV, l));
    }
    let c = run_child("acquire", &set, &[CUFILE_ENV_PATH_JSON], Some(&cwd));
    let a = c.result("acquire");
    assert!(a.starts_with("ERR:GPUDirect Storage: "), "{a}");
    assert!(a.contains("libcuda"), "{a}");
    assert_eq!(c.result("acquire_is_gds_error"), "true");
    assert_eq!(c.result("acquire_source_is_the_gds_error"), "true");
    assert_eq!(c.result("acquire_names_missing_libcuda"), "true");
    assert_eq!(c.result("open_count"), "0");
    assert_eq!(c.result("env_after_matches_before"), "true", "CUFILE_ENV_PATH_JSON not left set");
    assert!(is_empty_dir(&tmp), "no config directory left behind");
    assert!(is_empty_dir(&cwd), "nothing written into the current directory");
    let _ = std::fs::remove_dir_all(&cwd);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn acquire_on_this_machine_follows_the_config_rules() {
    let cwd = fresh_dir("cwd-acquire");
    let tmp = fresh_dir("tmp-acquire");
    let mut set = vec![("TMPDIR", tmp.to_str().unwrap())];
    let lib = common::pip_libcufile();
    if let Some(l) = &lib {
        set.push((CUFILE_LIB_ENV, l));
    }
    let c = run_child("acquire", &set, &[CUFILE_ENV_PATH_JSON, CUDA_LIB_ENV], Some(&cwd));
    let a = c.result("acquire");
    if a == "OK" {
        assert_eq!(c.result("open_count"), "2");
        assert_eq!(c.result("settings_kept"), "true");
        let dir = c.result("config_dir");
        assert!(Path::new(dir).starts_with(&tmp), "config dir {dir} is under TMPDIR {}", tmp.display());
        assert_eq!(c.result("config_dir_mode"), "700");
        assert_eq!(c.result("config_has_settings"), "true");
        assert_eq!(c.result("env_points_at_config"), "true");
        assert_eq!(c.result("config_kept_while_open"), "true");
        assert_eq!(c.result("config_removed_at_close"), "true");
        assert_eq!(c.result("open_count_after"), "0");
    } else {
        assert!(a.starts_with("ERR:GPUDirect Storage: "), "{a}");
        assert_eq!(c.result("open_count"), "0");
    }
    assert_eq!(c.result("env_after_matches_before"), "true");
    assert!(is_empty_dir(&tmp), "config directory removed");
    assert!(is_empty_dir(&cwd), "no cufile.log or config in the current directory");
    let _ = std::fs::remove_dir_all(&cwd);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_users_cufile_env_path_json_is_never_overridden() {
    let cwd = fresh_dir("cwd-user");
    let tmp = fresh_dir("tmp-user");
    let user = fresh_dir("user-config");
    let user_json = user.join("my-cufile.json");
    std::fs::write(&user_json, format!("{{ \"logging\": {{ \"dir\": \"{}\" }} }}\n", user.display())).unwrap();
    let mut set = vec![("TMPDIR", tmp.to_str().unwrap()), (CUFILE_ENV_PATH_JSON, user_json.to_str().unwrap())];
    let lib = common::pip_libcufile();
    if let Some(l) = &lib {
        set.push((CUFILE_LIB_ENV, l));
    }
    let c = run_child("acquire", &set, &[CUDA_LIB_ENV], Some(&cwd));
    if c.result("acquire") == "OK" {
        assert_eq!(c.result("config_dir"), "none", "no config of ours is written");
        assert_eq!(c.result("env_unchanged_while_open"), "true");
    }
    assert_eq!(c.result("env_after_matches_before"), "true");
    assert!(is_empty_dir(&tmp), "nothing written under TMPDIR");
    assert!(is_empty_dir(&cwd));
    let _ = std::fs::remove_dir_all(&cwd);
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(&user);
}
