//! `deepnvme doctor` against setups broken on purpose, each made real and,
//! wherever possible, only for the doctor's own process: io_uring refused
//! by a seccomp filter (as Docker's profile does) and by the real
//! `kernel.io_uring_disabled` sysctl (for the few milliseconds of one run);
//! a tiny RLIMIT_MEMLOCK without CAP_IPC_LOCK; a tmpfs and a full loop-mounted
//! ext4 in a private mount namespace; a libcufile that is not there. Each
//! must be named, with the right fix, and a fail must exit 1. Setups that
//! need root skip, saying so, without it. (The mismatched compiled front
//! end needs the Python environment: tests/python/test_doctor.py.)

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::RwLock;

use common::*;
use serde_json::Value;

/// The sysctl test changes io_uring for the whole machine: it takes this
/// for writing, every other test for reading, so none runs meanwhile.
static SYSTEM_WIDE: RwLock<()> = RwLock::new(());

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn doctor_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("doctor")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .current_dir(dir)
        .env("DEEPNVME_LOG", "quiet")
        .env_remove("DEEPNVME_ENGINE")
        .env_remove("DEEPNVME_CUFILE_LIB");
    cmd
}

/// The report of a `--json` run and its exit status.
fn report(o: &Output) -> (Value, Option<i32>) {
    let j = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(o), stderr(o)));
    (j, o.status.code())
}

fn run(mut cmd: Command) -> (Value, Option<i32>, String) {
    let o = cmd.output().expect("running deepnvme doctor");
    let (j, code) = report(&o);
    (j, code, stderr(&o))
}

/// The finding `section`/`check`; panics with the whole report when absent.
fn finding<'a>(j: &'a Value, section: &str, check: &str) -> &'a Value {
    j["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|f| f["section"] == section && f["check"] == check))
        .unwrap_or_else(|| panic!("no {section}/{check} finding in {j:#}"))
}

fn text(f: &Value, key: &str) -> String {
    f[key].as_str().unwrap_or("").to_string()
}

/// Asserts `f` has `status` and that its why and fix contain the words.
fn expect(f: &Value, status: &str, why: &[&str], fix: &[&str]) {
    assert_eq!(f["status"], status, "{f:#}");
    for w in why {
        assert!(text(f, "why").contains(w) || text(f, "summary").contains(w), "why lacks {w:?}: {f:#}");
    }
    for w in fix {
        assert!(text(f, "fix").contains(w), "fix lacks {w:?}: {f:#}");
    }
}

/// A DeepSpeed config swapping parameters (bf16) and optimizer state to
/// `dir`, with small buffers: 2 x 1e6 bf16 elements lock 3.82 MiB; the
/// swap-out buffer (2.5e5 bf16, sub_group_size) and the optimizer's 2 x
/// 2.5e5 fp32 at most 2.4 MiB more: 6.2 MiB in all, under the usual 8 MiB.
fn write_config(dir: &Path, extra_aio: &str) -> std::path::PathBuf {
    let path = dir.join("ds_config.json");
    let cfg = format!(
        r#"{{
  "bf16": {{"enabled": true}},
  "zero_optimization": {{
    "stage": 3, "sub_group_size": 2.5e5,
    "offload_param": {{"device": "nvme", "nvme_path": "{d}", "buffer_count": 2, "buffer_size": 1e6}},
    "offload_optimizer": {{"device": "nvme", "nvme_path": "{d}", "buffer_count": 2}}
  }},
  "aio": {{"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1{extra_aio}}}
}}"#,
        d = dir.display()
    );
    std::fs::write(&path, cfg).unwrap();
    path
}

#[test]
fn a_healthy_directory_passes_and_every_finding_is_complete() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-ok");
    let cfg = write_config(&dir.0, "");
    let (j, code, err) = run({
        let mut c = doctor_cmd(&dir.0, &["--json", "--config", cfg.to_str().unwrap(), "--bench-size", "4M"]);
        c.args(["--only", "config,engine,memlock,filesystem,device,gds,bench"]);
        c
    });
    assert_eq!(j["command"], "doctor");
    let checks = j["checks"].as_array().unwrap();
    for f in checks {
        assert!(["ok", "warn", "fail"].contains(&f["status"].as_str().unwrap()), "{f}");
        assert!(!text(f, "summary").is_empty(), "{f}");
        // A finding that is not ok says what to do.
        assert!(f["status"] == "ok" || !text(f, "fix").is_empty(), "no fix: {f}");
    }
    let count = |s: &str| checks.iter().filter(|f| f["status"] == s).count() as u64;
    assert_eq!(j["counts"]["fail"].as_u64(), Some(count("fail")));
    assert_eq!(j["counts"]["ok"].as_u64(), Some(count("ok")));
    assert_eq!(code, Some(if count("fail") > 0 { 1 } else { 0 }), "{err}");
    // The checkout's file system is a disk file system with O_DIRECT.
    expect(finding(&j, "filesystem", "type"), "ok", &[], &[]);
    expect(finding(&j, "filesystem", "O_DIRECT"), "ok", &["works"], &[]);
    expect(finding(&j, "filesystem", "free space"), "ok", &[], &[]);
    expect(finding(&j, "config", "offload"), "ok", &["ZeRO stage 3", "block_size 1048576"], &[]);
    let memlock = finding(&j, "memlock", "RLIMIT_MEMLOCK");
    assert!(
        text(memlock, "why").contains("parameter swap buffers (buffer_count 2 x 1000448 elements x 2 B bf16)"),
        "{memlock}"
    );
    let bench = finding(&j, "bench", "deepnvme");
    expect(bench, "ok", &["psync: write", "4 MiB per pass"], &[]);
    assert!(dir.entries().iter().all(|e| e == "ds_config.json"), "the doctor left files: {:?}", dir.entries());

    // Text mode: every section, and the summary line.
    let o = doctor_cmd(&dir.0, &["--only", "engine,filesystem"]).output().unwrap();
    let t = stdout(&o);
    assert!(t.contains("\nengine\n") && t.contains("\nfilesystem\n") && t.contains("summary: "), "{t}");
    assert!(t.contains("O_DIRECT: works"), "{t}");
}

/// A seccomp filter answering EPERM to io_uring_setup, installed in the
/// child before exec: what Docker's default profile does, for this process only.
fn refuse_io_uring_setup(cmd: &mut Command) {
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
    let op = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    // seccomp_data: nr at offset 0, arch at 4. Another arch, or another call: allow.
    let filter = [
        op(load, 4, 0, 0),
        op(jeq, ARCH, 0, 3),
        op(load, 0, 0, 0),
        op(jeq, libc::SYS_io_uring_setup as u32, 0, 1),
        op(ret, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32, 0, 0),
        op(ret, libc::SECCOMP_RET_ALLOW, 0, 0),
    ];
    // SAFETY: prctl and seccomp are async-signal-safe; the filter was built
    // before the fork and is only read.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog as *const libc::sock_fprog)
                    != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn io_uring_refused_by_seccomp_names_the_filter() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-seccomp");
    // The filter is real: the core's own probe, in `info`, sees io_uring refused.
    let mut info = Command::new(BIN);
    info.args(["info", "--json", "--dir"]).arg(&dir.0).env("DEEPNVME_LOG", "quiet").env_remove("DEEPNVME_ENGINE");
    refuse_io_uring_setup(&mut info);
    let o = info.output().unwrap();
    let i: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(i["io_uring_available"], false, "{i}");
    assert_eq!(i["engine"], "psync");

    let mut cmd = doctor_cmd(&dir.0, &["--json", "--only", "engine"]);
    refuse_io_uring_setup(&mut cmd);
    let (j, code, err) = run(cmd);
    let f = finding(&j, "engine", "io_uring");
    expect(f, "warn", &["seccomp filter", "fall back to the psync engine"], &["--security-opt seccomp="]);
    expect(finding(&j, "engine", "fallback cost"), "ok", &["pread/pwrite", "queue_depth 8"], &[]);
    assert_eq!(code, Some(0), "a warning alone exits 0: {err}");

    // Asking for io_uring anyway is a failure: handles cannot be created.
    let mut cmd = doctor_cmd(&dir.0, &["--json", "--only", "engine"]);
    cmd.env("DEEPNVME_ENGINE", "uring");
    refuse_io_uring_setup(&mut cmd);
    let (j, code, err) = run(cmd);
    expect(finding(&j, "engine", "io_uring"), "fail", &["seccomp filter"], &["unset DEEPNVME_ENGINE"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("engine/io_uring"), "stderr names the failed check: {err}");
}

/// Sets `kernel.io_uring_disabled` and puts the old value back on drop.
struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> std::io::Result<Sysctl> {
        let old = std::fs::read_to_string(path)?;
        std::fs::write(path, value)?;
        Ok(Sysctl { path, old })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        std::fs::write(self.path, self.old.trim()).expect("restoring the sysctl");
    }
}

#[test]
fn io_uring_disabled_by_sysctl_names_the_sysctl() {
    const PATH: &str = "/proc/sys/kernel/io_uring_disabled";
    let current = std::fs::read_to_string(PATH).ok().map(|s| s.trim().to_string());
    if !root() || current.as_deref() != Some("0") {
        println!("skipped: needs root and {PATH} = 0 (it is {current:?})");
        return;
    }
    let dir = TempDir::new("doctor-sysctl");
    let _g = SYSTEM_WIDE.write().unwrap();
    // The whole machine loses io_uring for this one short run (--only
    // engine takes milliseconds); the guard restores it before any assert.
    let o = {
        let _sysctl = Sysctl::set(PATH, "2").expect("setting kernel.io_uring_disabled");
        doctor_cmd(&dir.0, &["--json", "--only", "engine"]).output().expect("running deepnvme doctor")
    };
    assert_eq!(std::fs::read_to_string(PATH).unwrap().trim(), "0", "the sysctl was restored");
    let (j, code) = report(&o);
    expect(
        finding(&j, "engine", "io_uring"),
        "warn",
        &["kernel.io_uring_disabled = 2", "every process"],
        &["sysctl -w kernel.io_uring_disabled=0", "/etc/sysctl.d/"],
    );
    assert_eq!(code, Some(0));
}

#[test]
fn a_tiny_memlock_limit_fails_with_the_limit_and_the_fix() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-memlock");
    let cfg = write_config(&dir.0, "");
    let cfg = cfg.to_str().unwrap();
    let (_, parent_hard) = deepnvme_memlock();
    let limit = |cmd: &mut Command, soft: u64, hard: u64| {
        let drop_cap = root();
        // SAFETY: prctl and setrlimit are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // Root locks without limit through CAP_IPC_LOCK: take it out
                // of the bounding set, so the exec'd tool does not get it.
                const CAP_IPC_LOCK: libc::c_ulong = 14;
                if drop_cap && libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::rlimit { rlim_cur: soft, rlim_max: hard };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    // A soft limit of 64 KiB under a hard one of 8 MiB (or less: raising the
    // hard limit needs CAP_SYS_RESOURCE), which the user may raise alone.
    let hard = parent_hard.min(8 << 20);
    let tiny = |cmd: &mut Command| limit(cmd, 64 << 10, hard);
    // The limit is real: the core cannot lock a 4 MiB buffer under it.
    let mut bench = Command::new(BIN);
    bench.args(["bench", "--size", "4M", "--json", "-q", "--dir"]).arg(&dir.0).env("DEEPNVME_LOG", "quiet");
    tiny(&mut bench);
    let o = bench.output().unwrap();
    let b: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    assert_eq!(b["buffer_locked"], false, "{b}");

    let mut cmd = doctor_cmd(&dir.0, &["--json", "--only", "memlock", "--config", cfg]);
    tiny(&mut cmd);
    let (j, code, err) = run(cmd);
    let f = finding(&j, "memlock", "RLIMIT_MEMLOCK");
    expect(f, "fail", &["soft 64 KiB", "3.82 MiB", "new_cpu_locked_tensor"], &["limits.conf", "LimitMEMLOCK"]);
    assert!(!text(f, "summary").contains("CAP_IPC_LOCK held"), "{f}");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("memlock/RLIMIT_MEMLOCK"), "{err}");
    if hard >= 7 << 20 {
        // ulimit -l takes KiB: the bound of 6.2 MiB, rounded up.
        assert!(text(f, "fix").contains("ulimit -l 6"), "the shell can raise it: {f}");
    }

    // A hard limit as tiny: only root can raise it.
    let mut cmd = doctor_cmd(&dir.0, &["--json", "--only", "memlock", "--config", cfg]);
    limit(&mut cmd, 64 << 10, 64 << 10);
    let (j, code, _) = run(cmd);
    expect(
        finding(&j, "memlock", "RLIMIT_MEMLOCK"),
        "fail",
        &["hard 64 KiB"],
        &["hard limit (64 KiB) is below it too", "as root"],
    );
    assert_eq!(code, Some(1));

    // The same config under this process's own limits fits (the config locks
    // under 8 MiB, the common default, and root holds CAP_IPC_LOCK).
    let (soft, _) = deepnvme_memlock();
    if root() || soft >= 8 << 20 {
        let (j, code, err) = run(doctor_cmd(&dir.0, &["--json", "--only", "memlock", "--config", cfg]));
        expect(finding(&j, "memlock", "RLIMIT_MEMLOCK"), "ok", &["parameter swap buffers"], &[]);
        assert_eq!(code, Some(0), "{err}");
    } else {
        println!("the healthy half skipped: RLIMIT_MEMLOCK is {soft} B here, without CAP_IPC_LOCK");
    }
}

fn deepnvme_memlock() -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills `r`.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (r.rlim_cur, r.rlim_max)
}

/// Mounts a 64 MiB tmpfs on `dir` in a mount namespace of the child's own,
/// before exec: nobody else sees it, and it goes when the child exits.
fn private_tmpfs(cmd: &mut Command, dir: &Path) {
    let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: unshare and mount are async-signal-safe; the strings were
    // made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let null = std::ptr::null();
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(c"none".as_ptr(), c"/".as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null())
                    != 0
                || libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, c"size=64m".as_ptr().cast())
                    != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn a_tmpfs_directory_fails_naming_ram_and_nvme_path() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() {
        println!("skipped: mounting a tmpfs in a private mount namespace needs root");
        return;
    }
    let dir = TempDir::new("doctor-tmpfs");
    let cfg = write_config(&dir.0, "");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = doctor_cmd(&mnt, &["--json", "--only", "filesystem,device", "--config", cfg.to_str().unwrap()]);
    cmd.current_dir(&dir.0);
    private_tmpfs(&mut cmd, &mnt);
    let (j, code, err) = run(cmd);
    let f = finding(&j, "filesystem", "type");
    expect(f, "fail", &["tmpfs", "RAM"], &["nvme_path", "ext4 or xfs"]);
    expect(finding(&j, "device", "device"), "ok", &["tmpfs has no block device"], &[]);
    assert_eq!(code, Some(1), "{err}");
    // The mount was the child's alone.
    let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!here.contains(mnt.to_str().unwrap()), "the tmpfs leaked into the test's namespace");
}

/// `unshare -m` runs `script` in a private mount namespace: a loop mount
/// made there vanishes (and its loop device detaches) when it exits.
fn in_private_namespace(script: &str, args: &[&Path]) -> Output {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-euc", script, "sh"]).args(args);
    cmd.env("DEEPNVME_LOG", "quiet").env_remove("DEEPNVME_ENGINE");
    cmd.output().expect("running unshare")
}

#[test]
fn a_full_file_system_fails_naming_the_space_and_the_loop_device() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !root() || !have("unshare") || !have("mkfs.ext4") {
        println!("skipped: needs root, unshare and mkfs.ext4 (a loop-mounted ext4 in a private mount namespace)");
        return;
    }
    let dir = TempDir::new("doctor-full");
    let img = dir.0.join("tiny.img");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::File::create(&img).unwrap().set_len(16 << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&img).output().unwrap();
    assert!(mkfs.status.success(), "{}", stderr(&mkfs));
    // The config's parameter buffers (2 x 1e6 bf16, 4 MB) are what must fit
    // on a file system of 16 MiB: it does until it is filled.
    let cfg = write_config(&mnt, "");
    let cfg_outside = dir.0.join("ds_config.json");
    std::fs::rename(&cfg, &cfg_outside).unwrap();
    let run_doctor = r#"mount -o loop "$1" "$2"
        if [ "$4" = fill ]; then dd if=/dev/zero of="$2/fill" bs=64k 2>/dev/null || true; sync; fi
        exec "$3" doctor --dir "$2" --config "$5" --only filesystem,device,bench --bench-size 8M --json"#;
    let bin = Path::new(BIN);
    let empty = in_private_namespace(run_doctor, &[&img, &mnt, bin, Path::new("empty"), &cfg_outside]);
    let (j, _) = report(&empty);
    expect(finding(&j, "filesystem", "free space"), "ok", &[], &[]);
    let dev = finding(&j, "device", "device");
    expect(dev, "warn", &["loop device over", "tiny.img"], &["nvme_path"]);

    let full = in_private_namespace(run_doctor, &[&img, &mnt, bin, Path::new("fill"), &cfg_outside]);
    let (j, code) = report(&full);
    let f = finding(&j, "filesystem", "free space");
    expect(f, "fail", &["ENOSPC", "swap buffers"], &["free space", "nvme_path"]);
    expect(finding(&j, "bench", "deepnvme"), "warn", &["fewer than the 8 MiB pass"], &[]);
    assert_eq!(code, Some(1), "{}", stderr(&full));
    let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!here.contains(mnt.to_str().unwrap()), "the loop mount leaked into the test's namespace");
}

#[test]
fn a_missing_libcufile_fails_when_the_config_wants_gds() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-gds");
    let cfg = write_config(&dir.0, r#", "use_gds": true"#);
    let missing = dir.0.join("no-such-libcufile.so.0");
    // `--python /bin/false`: no torch process to ask, so the core's own probe decides.
    let args = ["--json", "--only", "gds", "--python", "/bin/false", "--config", cfg.to_str().unwrap()];
    let mut cmd = doctor_cmd(&dir.0, &args);
    cmd.env("DEEPNVME_CUFILE_LIB", &missing);
    let (j, code, err) = run(cmd);
    let f = finding(&j, "gds", "libraries");
    expect(
        f,
        "fail",
        &["no-such-libcufile.so.0", "DEEPNVME_CUFILE_LIB is set, so only that was tried", "aio.use_gds"],
        &["point DEEPNVME_CUFILE_LIB at a libcufile that exists", "unset it"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("gds/libraries"), "{err}");

    // Without use_gds a missing GDS is no failure at all.
    let plain = write_config(&dir.0, "");
    let mut cmd =
        doctor_cmd(&dir.0, &["--json", "--only", "gds", "--python", "/bin/false", "--config", plain.to_str().unwrap()]);
    cmd.env_remove("DEEPNVME_CUFILE_LIB");
    let (j, code, _) = run(cmd);
    let f = finding(&j, "gds", "libraries");
    if f["summary"] == "GPUDirect Storage is not available" {
        expect(f, "ok", &["only aio.use_gds needs it"], &[]);
        assert_eq!(code, Some(0));
    }
}

#[test]
fn a_bad_config_is_an_error_naming_the_file() {
    let dir = TempDir::new("doctor-badcfg");
    let bad = dir.0.join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let o = doctor_cmd(&dir.0, &["--config", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad.json is not JSON"), "{}", stderr(&o));
    let o = doctor_cmd(&dir.0, &["--only", "disks"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let mut cmd = doctor_cmd(&dir.0, &["--only", "filesystem"]);
    let o = cmd.args(["--dir", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad.json is not a directory"), "{}", stderr(&o));
    // A directory that does not exist yet is checked where it would be created.
    let later = dir.0.join("not/yet");
    let mut cmd = doctor_cmd(&dir.0, &["--json", "--only", "filesystem"]);
    cmd.args(["--dir", later.to_str().unwrap()]);
    let (j, code, _) = run(cmd);
    expect(finding(&j, "filesystem", "directory"), "warn", &["does not exist"], &["mkdir -p"]);
    expect(finding(&j, "filesystem", "O_DIRECT"), "ok", &[], &[]);
    assert_eq!(code, Some(0));
}
