//! `deepnvme doctor` against machines broken on purpose, each made real
//! and, wherever possible, only for the doctor's own process: io_uring
//! refused by a seccomp filter (as Docker's profile does) and by the real
//! `kernel.io_uring_disabled` sysctl (for the few milliseconds of one run);
//! a tiny RLIMIT_MEMLOCK without CAP_IPC_LOCK; in a private mount
//! namespace, a tmpfs (as the optimizer's nvme_path of a config whose
//! parameter path is fine), a full loop-mounted ext4, one mounted
//! `data=journal`, a read-only bind mount; a loop device throttled by a
//! cgroup v1 blkio limit; another process with files open in nvme_path and
//! fresh swap files of another job; a libcufile that is not there. Each
//! must be named, with the right fix, and a fail must exit 1. Setups that
//! need root skip, saying so, without it. (The config's validation, buffer
//! sizing and exit codes: doctor_config.rs; the Python environment's:
//! tests/python/test_doctor.py.)

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::RwLock;

use common::doctor::*;
use common::*;
use serde_json::{json, Value};

/// The sysctl test changes io_uring for the whole machine: it takes this
/// for writing, every other test for reading, so none runs meanwhile.
static SYSTEM_WIDE: RwLock<()> = RwLock::new(());

#[test]
fn a_healthy_directory_passes_and_every_finding_is_complete() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-ok");
    let cfg = write_config(&dir.0, "");
    // The config alone names the folder; the model fits its buffers.
    let (j, code, err) = run(doctor_in(
        &dir.0,
        &["--json", "--config", cfg.to_str().unwrap(), "--bench-size", "4M", "--python", "/bin/false"]
            .into_iter()
            .chain(["--model-params", "2M", "--largest-param", "1M"])
            .chain(["--only", "config,buffers,engine,memlock,filesystem,device,sharing,gds,bench"])
            .collect::<Vec<_>>(),
    ));
    assert_eq!(j["command"], "doctor");
    let checks = j["checks"].as_array().unwrap();
    for f in checks {
        assert!(["ok", "skip", "warn", "fail"].contains(&f["status"].as_str().unwrap()), "{f}");
        assert!(!text(f, "summary").is_empty(), "{f}");
        // A finding that is not ok says what to do.
        assert!(f["status"] == "ok" || !text(f, "fix").is_empty(), "no fix: {f}");
    }
    let count = |s: &str| checks.iter().filter(|f| f["status"] == s).count() as u64;
    assert_eq!(j["counts"]["fail"].as_u64(), Some(count("fail")));
    assert_eq!(j["counts"]["skip"].as_u64(), Some(count("skip")));
    assert_eq!(j["counts"]["ok"].as_u64(), Some(count("ok")));
    // No false alarm on a healthy setup (memlock as root: CAP_IPC_LOCK).
    let (soft, _) = deepnvme_memlock();
    if root() || soft >= 8 << 20 {
        // Except the speed comparison with fio: a debug build on a machine
        // others load may fall under fio's pace (a WARN, exit 0); speed is
        // not what this test checks.
        let alarms: Vec<String> = problems(&j).into_iter().filter(|p| !p.starts_with("\"bench\"/\"fio\" \"warn\"")).collect();
        assert!(alarms.is_empty(), "a healthy setup: {alarms:#?}");
        assert_eq!(code, Some(0), "{err}");
    }
    // The checkout's file system is a disk file system with O_DIRECT.
    let key = "zero_optimization.offload_param.nvme_path";
    expect(finding_at(&j, "filesystem", "type", key), "ok", &[], &[]);
    let both = finding_at(&j, "filesystem", "O_DIRECT", "zero_optimization.offload_optimizer.nvme_path");
    expect(both, "ok", &["works"], &[]);
    assert_eq!(both["path"], dir.0.to_str().unwrap());
    expect(finding(&j, "filesystem", "free space"), "ok", &[], &[]);
    expect(finding(&j, "config", "offload"), "ok", &["ZeRO stage 3", "block_size 1048576"], &[]);
    expect(finding(&j, "config", "validation"), "ok", &["DeepSpeed 0.19.8's rules"], &[]);
    expect(finding(&j, "buffers", "buffer_size"), "ok", &["it fits"], &[]);
    expect(finding(&j, "sharing", "open files"), "ok", &[], &[]);
    let memlock = finding(&j, "memlock", "RLIMIT_MEMLOCK");
    assert!(
        text(memlock, "why").contains("parameter swap buffers (buffer_count 2 x 1000448 elements x 2 B bf16)"),
        "{memlock}"
    );
    // Item 8: other nodes' limits come from PAM; how to check one.
    assert!(text(memlock, "why").contains("ssh NODE deepnvme doctor --only memlock"), "{memlock}");
    let bench = finding(&j, "bench", "deepnvme");
    expect(bench, "ok", &["psync: write", "4 MiB per pass"], &[]);
    // An NVMe drive (or one under device-mapper) has a floor and meets it;
    // another kind (this machine's virtio disk) has none: "not compared".
    let device = text(finding(&j, "device", "device"), "summary").to_ascii_lowercase();
    let speed = finding(&j, "bench", "speed");
    if device.contains("nvme") {
        expect(speed, "ok", &["at least 1 GB/s (an NVMe drive's floor"], &[]);
    } else {
        expect(speed, "skip", &["not compared", "no floor for"], &["--min-gbps"]);
    }
    if !have("fio") {
        expect(finding(&j, "bench", "fio"), "skip", &["not compared"], &["apt-get install -y fio"]);
    }
    assert!(dir.entries().iter().all(|e| e == "ds_config.json"), "the doctor left files: {:?}", dir.entries());

    // Text mode: every section, the folder with its keys, and the summary line.
    let o = doctor_cmd(&dir.0, &["--only", "engine,filesystem"]).output().unwrap();
    let t = stdout(&o);
    assert!(t.contains("\nengine\n") && t.contains("\nfilesystem\n") && t.contains("summary: "), "{t}");
    assert!(t.contains("O_DIRECT: works") && t.contains("(--dir)"), "{t}");
    // Without a config, the config and buffers sections have nothing to
    // say: no empty headings.
    let o = doctor_cmd(&dir.0, &["--only", "config,buffers,engine"]).output().unwrap();
    let t = stdout(&o);
    assert!(t.contains("\nengine\n") && !t.contains("\nbuffers") && !t.contains("\nconfig\n"), "{t}");
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
        skip(&format!("needs root and {PATH} = 0 (it is {current:?})"));
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
        skip(&format!("the healthy half: RLIMIT_MEMLOCK is {soft} B here, without CAP_IPC_LOCK"));
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
        skip("mounting a tmpfs in a private mount namespace needs root");
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
    let f = finding_at(&j, "filesystem", "type", "--dir");
    expect(f, "fail", &["tmpfs", "RAM"], &["nvme_path", "ext4 or xfs"]);
    expect(finding_at(&j, "device", "device", "--dir"), "ok", &["tmpfs has no block device"], &[]);
    assert_eq!(code, Some(1), "{err}");
    // The mount was the child's alone.
    let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!here.contains(mnt.to_str().unwrap()), "the tmpfs leaked into the test's namespace");
}

#[test]
fn a_full_file_system_fails_naming_the_space_and_the_loop_device() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() || !have("unshare") || !have("mkfs.ext4") {
        skip("needs root, unshare and mkfs.ext4 (a loop-mounted ext4 in a private mount namespace)");
        return;
    }
    let dir = TempDir::new("doctor-full");
    let img = dir.0.join("tiny.img");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    ext4_image(&img, 16);
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

/// A GPU's device node (`/dev/nvidia0`, in a /dev of the child's own) with
/// no driver listing it: the config section (DeepSpeed's CUDA accelerator
/// for use_gds) and the gds section (the fix without a GPU) must agree that
/// there is a GPU.
#[test]
fn the_config_and_gds_sections_agree_on_a_gpu() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() || !have("unshare") {
        skip("needs root and unshare (a /dev of the child's own)");
        return;
    }
    let dir = TempDir::new("doctor-gpu-node");
    let cfg = write_config(&dir.0, r#", "use_gds": true"#);
    let script = r#"mount -t tmpfs none /dev
        mknod -m 666 /dev/null c 1 3
        mknod -m 666 /dev/nvidia0 c 195 0
        unset DS_ACCELERATOR DEEPNVME_CUFILE_LIB
        exec "$1" doctor --config "$2" --only config,gds --python /bin/false --json"#;
    let o = in_private_namespace(script, &[Path::new(BIN), &cfg]);
    let (j, _) = report(&o);
    let gds = findings(&j, "config", "validation").into_iter().find(|f| f["key"] == "aio.use_gds");
    assert!(gds.is_none(), "a GPU is there, so DeepSpeed's CUDA accelerator takes use_gds: {j:#}");
    for f in findings(&j, "gds", "libraries").into_iter().chain(findings(&j, "gds", "driver")) {
        assert!(!text(f, "fix").starts_with("there is no GPU here"), "the gds section saw no GPU: {f:#}");
    }
    assert!(nvidia_gpu() || !Path::new("/dev/nvidia0").exists(), "the child's /dev leaked into the test's");
}

/// Mounts a 64 MiB tmpfs on `dir` in the child's own mount namespace (see
/// `private_tmpfs`), for a config whose optimizer state goes there while its
/// parameters go to a disk folder: every nvme_path is checked, each named
/// by its key.
#[test]
fn the_optimizers_nvme_path_on_tmpfs_fails_though_the_parameters_path_is_fine() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() {
        skip("mounting a tmpfs in a private mount namespace needs root");
        return;
    }
    let dir = TempDir::new("doctor-two-paths");
    let (params, optimizer) = (dir.0.join("params"), dir.0.join("optimizer"));
    std::fs::create_dir(&params).unwrap();
    std::fs::create_dir(&optimizer).unwrap();
    let cfg = write_json(
        &dir.0,
        "ds.json",
        &json!({"zero_optimization": {"stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": params, "buffer_count": 2, "buffer_size": 1e6},
            "offload_optimizer": {"device": "nvme", "nvme_path": optimizer}}}),
    );
    let mut cmd = doctor_in(&dir.0, &["--json", "--only", "filesystem", "--python", "/bin/false", "--config"]);
    cmd.arg(&cfg);
    private_tmpfs(&mut cmd, &optimizer);
    let (j, code, err) = run(cmd);
    let opt = finding_at(&j, "filesystem", "type", "zero_optimization.offload_optimizer.nvme_path");
    expect(opt, "fail", &["tmpfs", "RAM"], &["nvme_path", "ext4 or xfs"]);
    assert_eq!(opt["path"], optimizer.to_str().unwrap());
    expect(finding_at(&j, "filesystem", "type", "zero_optimization.offload_param.nvme_path"), "ok", &["ext4"], &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(!mounted_here(&optimizer), "the tmpfs leaked into the test's namespace");
}

/// A cgroup v1 blkio group of the test's own, removed on drop (it must be
/// empty by then: the process put in it has exited).
struct BlkioGroup(std::path::PathBuf);

impl BlkioGroup {
    fn new(tag: &str) -> Option<BlkioGroup> {
        let root = Path::new("/sys/fs/cgroup/blkio");
        if !root.join("blkio.throttle.write_bps_device").exists() {
            return None;
        }
        let dir = root.join(format!("deepnvme-test-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(BlkioGroup(dir))
    }
}

impl Drop for BlkioGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A loop device throttled to 50 MB/s by a real cgroup v1 blkio limit (in
/// a cgroup of the test's own; the doctor runs in it): the device section
/// names the limit and the file that sets it, and the bench's GB/s falls
/// under the stated floor, with the causes (the cgroup limit, the loop
/// device) and fio's absence "not compared".
#[test]
fn a_throttled_loop_device_is_slow_and_says_why() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() || !have("unshare") || !have("mkfs.ext4") {
        skip("needs root, unshare and mkfs.ext4");
        return;
    }
    let Some(group) = BlkioGroup::new("throttle") else {
        skip("no cgroup v1 blkio controller at /sys/fs/cgroup/blkio");
        return;
    };
    let dir = TempDir::new("doctor-throttle");
    let (img, mnt) = (dir.0.join("slow.img"), dir.0.join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    ext4_image(&img, 64);
    let limit = 50_000_000u64;
    // In the namespace: mount, find the loop device's number, limit it for
    // the group, join the group, run the doctor.
    let script = r#"mount -o loop "$1" "$2"
        dev=$(awk -v m="$2" '$5 == m {print $3}' /proc/self/mountinfo)
        echo "$dev $5" > "$4/blkio.throttle.write_bps_device"
        echo "$dev $5" > "$4/blkio.throttle.read_bps_device"
        echo $$ > "$4/cgroup.procs"
        "$3" doctor --dir "$2" --only bench --bench-size 32M --python /bin/false --json > "$6" || true
        exec "$3" doctor --dir "$2" --only device,bench --bench-size 32M --min-gbps 0.2 --python /bin/false --json"#;
    let limit_arg = limit.to_string();
    let plain = dir.0.join("no-flags.json");
    let o = in_private_namespace(script, &[&img, &mnt, Path::new(BIN), &group.0, Path::new(&limit_arg), &plain]);
    // The issue's run: no --min-gbps, no floor for a loop device over a
    // virtual disk; the cgroup limit the bench runs into is the reason.
    let bare: Value = serde_json::from_str(&std::fs::read_to_string(&plain).unwrap()).unwrap();
    expect(
        finding(&bare, "bench", "speed"),
        "warn",
        &["held to a cgroup limit", "write 0.050 GB/s", "a cgroup limits this process", "is a loop device"],
        &["lift the cgroup limit"],
    );
    let (j, code) = report(&o);
    let throttle = finding(&j, "device", "cgroup limit");
    expect(
        throttle,
        "warn",
        &["throttled by a cgroup", "write 0.050 GB/s", "blkio.throttle.write_bps_device", group.0.to_str().unwrap()],
        &["echo '7:", " 0' > ", "IOWriteBandwidthMax"],
    );
    let speed = finding(&j, "bench", "speed");
    expect(
        speed,
        "warn",
        &["under 0.2 GB/s (--min-gbps)", "a cgroup limits this process", "is a loop device"],
        &["lift the cgroup limit", "not a loop device"],
    );
    let gbps: Vec<f64> = text(speed, "summary")
        .split(':')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // The throttle lets a burst through at first: within 1.5 times the limit.
    assert!(gbps.iter().all(|g| *g < 0.075), "the limit held: {speed}");
    if !have("fio") {
        expect(finding(&j, "bench", "fio"), "skip", &["not compared"], &["fio"]);
    }
    assert_eq!(code, Some(0), "warnings alone exit 0: {}", stderr(&o));
    assert!(!mounted_here(&mnt), "the loop mount leaked into the test's namespace");
}

/// ext4 mounted `data=journal` accepts O_DIRECT and serves it through the
/// page cache: named as such, with the mount option to change.
#[test]
fn ext4_data_journal_is_named_as_the_cause() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() || !have("unshare") || !have("mkfs.ext4") {
        skip("needs root, unshare and mkfs.ext4");
        return;
    }
    let dir = TempDir::new("doctor-journal");
    let (img, mnt) = (dir.0.join("journal.img"), dir.0.join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    ext4_image(&img, 32);
    let script = r#"mount -o loop,data=journal "$1" "$2"
        grep -q "data=journal" /proc/self/mountinfo
        exec "$3" doctor --dir "$2" --only filesystem --python /bin/false --json"#;
    let o = in_private_namespace(script, &[&img, &mnt, Path::new(BIN)]);
    let (j, code) = report(&o);
    expect(
        finding(&j, "filesystem", "O_DIRECT"),
        "warn",
        &["ext4 mounted data=journal", "page cache"],
        &["data=ordered", "/etc/fstab", "umount and mount"],
    );
    assert_eq!(code, Some(0), "{}", stderr(&o));
    assert!(!mounted_here(&mnt));
}

/// A read-only bind mount: named read-only (not "O_DIRECT could not be
/// tested"), with the remount as the fix; a folder that does not exist
/// under it cannot be created by DeepSpeed either.
#[test]
fn a_read_only_mount_is_named_as_such() {
    let _g = SYSTEM_WIDE.read().unwrap();
    if !root() || !have("unshare") {
        skip("needs root and unshare");
        return;
    }
    let dir = TempDir::new("doctor-ro");
    let ro = dir.0.join("ro");
    std::fs::create_dir(&ro).unwrap();
    let later = ro.join("not/yet");
    let script = r#"mount --bind "$1" "$1"
        mount -o remount,bind,ro "$1"
        exec "$2" doctor --dir "$1" --dir "$3" --only filesystem --python /bin/false --json"#;
    let o = in_private_namespace(script, &[&ro, Path::new(BIN), &later]);
    let (j, code) = report(&o);
    let f = findings(&j, "filesystem", "read-only");
    assert_eq!(f.len(), 2, "{j:#}");
    expect(f[0], "fail", &["mounted read-only", "EROFS"], &["mount -o remount,rw"]);
    assert!(findings(&j, "filesystem", "O_DIRECT").is_empty(), "nothing to test on a read-only mount: {j:#}");
    let folder = finding(&j, "filesystem", "folder");
    expect(folder, "fail", &["does not exist yet", "read-only"], &["mkdir -p"]);
    assert_eq!(folder["path"], later.to_str().unwrap());
    assert_eq!(code, Some(1), "{}", stderr(&o));
    assert!(!mounted_here(&ro));
}

/// A folder that does not exist yet under a writable parent is fine:
/// DeepSpeed creates it.
#[test]
fn a_missing_folder_under_a_writable_parent_is_fine() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-later");
    let later = dir.0.join("not/yet");
    let mut cmd = doctor_cmd(&later, &["--json", "--only", "filesystem"]);
    cmd.current_dir(&dir.0);
    let (j, code, err) = run(cmd);
    expect(finding(&j, "filesystem", "folder"), "ok", &["does not exist yet", "DeepSpeed creates it"], &[]);
    expect(finding(&j, "filesystem", "O_DIRECT"), "ok", &[], &[]);
    assert!(problems(&j).is_empty(), "{:#?}", problems(&j));
    assert_eq!(code, Some(0), "{err}");
}

/// Another job in the same nvme_path, both ways the doctor sees one: a
/// process with files open there, and swap files written moments ago in
/// DeepSpeed's layout (as a job on another node of a shared file system
/// leaves them).
#[test]
fn another_job_in_the_same_nvme_path_is_named() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-shared");
    let swap = dir.0.join("zero_stage_3/bfloat16params/rank0");
    std::fs::create_dir_all(&swap).unwrap();
    let held = swap.join("3_param.tensor.swp");
    std::fs::write(&held, vec![0u8; 4096]).unwrap();
    // The other job: a process holding a swap file open.
    let mut other = Command::new("sh").args(["-c", "exec 3<>\"$1\"; exec sleep 60", "sh"]).arg(&held).spawn().unwrap();
    let fd = format!("/proc/{}/fd/3", other.id());
    let t0 = std::time::Instant::now();
    while std::fs::read_link(&fd).ok().as_deref() != Some(held.as_path()) {
        assert!(t0.elapsed().as_secs() < 10, "the other job never opened its file");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (j, code, err) = run(doctor_cmd(&dir.0, &["--json", "--only", "sharing"]));
    let _ = other.kill();
    let _ = other.wait();
    let open = finding(&j, "sharing", "open files");
    expect(
        open,
        "warn",
        &[&format!("pid {} (sleep)", other.id()), "3_param.tensor.swp", "buffer nbytes != file bytes", "#2006"],
        &["a folder of its own", "$SLURM_JOB_ID"],
    );
    expect(
        finding(&j, "sharing", "swap files"),
        "warn",
        &["1 DeepSpeed swap file(s)", "another node"],
        &["a folder of its own"],
    );
    assert_eq!(code, Some(0), "{err}");

    // Nobody there now, and files from long ago are an earlier job's leftovers.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&held).unwrap().set_modified(old).unwrap();
    let (j, _, _) = run(doctor_cmd(&dir.0, &["--json", "--only", "sharing"]));
    expect(finding(&j, "sharing", "open files"), "ok", &[], &[]);
    expect(finding(&j, "sharing", "swap files"), "ok", &["earlier job"], &[]);
}

/// A busy folder: another process has a file open there that is no
/// DeepSpeed swap file (a log, a dataset). Listed, not a warning; DeepSpeed's
/// own swap folders, under another name for the folder, still are.
#[test]
fn other_open_files_are_listed_not_warned() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-busy");
    let log = dir.0.join("logs/train.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, b"step 1\n").unwrap();
    let swap = dir.0.join("zero_stage_3/optimizer/rank0/7.tensor.swp");
    std::fs::create_dir_all(swap.parent().unwrap()).unwrap();
    std::fs::write(&swap, vec![0u8; 4096]).unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&swap).unwrap().set_modified(old).unwrap();
    let hold = |file: &Path| {
        let child = Command::new("sh").args(["-c", "exec 3<\"$1\"; exec sleep 60", "sh"]).arg(file).spawn().unwrap();
        let fd = format!("/proc/{}/fd/3", child.id());
        let t0 = std::time::Instant::now();
        while std::fs::read_link(&fd).ok().as_deref() != Some(file) {
            assert!(t0.elapsed().as_secs() < 10, "the other process never opened {file:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child
    };
    let mut reader = hold(&log);
    let (j, code, err) = run(doctor_cmd(&dir.0, &["--json", "--only", "sharing"]));
    let open = finding(&j, "sharing", "open files");
    expect(open, "ok", &[&format!("pid {} (sleep)", reader.id()), "train.log", "no DeepSpeed swap file"], &[]);
    assert!(problems(&j).is_empty(), "{:#?}", problems(&j));
    assert_eq!(code, Some(0), "{err}");
    // Checked as the optimizer's own folder: its rank folders' files are swap files.
    let mut swapper = hold(&swap);
    let (j, _, _) = run(doctor_cmd(&dir.0.join("zero_stage_3/optimizer"), &["--json", "--only", "sharing"]));
    for child in [&mut reader, &mut swapper] {
        let _ = child.kill();
        let _ = child.wait();
    }
    expect(finding(&j, "sharing", "open files"), "warn", &["7.tensor.swp", "#2006"], &["a folder of its own"]);
}

/// One training step's swaps against a budget (--step-time with
/// --model-params), measured on the checkout's disk: a 1B-parameter job
/// cannot swap its 34 GB in a millisecond; the finding gives the time, the
/// budget and how the bytes were counted.
#[test]
fn a_step_time_budget_the_device_cannot_meet_warns() {
    let _g = SYSTEM_WIDE.read().unwrap();
    let dir = TempDir::new("doctor-step");
    let cfg = write_config(&dir.0, "");
    let mut cmd = doctor_in(&dir.0, &["--json", "--only", "bench", "--bench-size", "4M", "--python", "/bin/false"]);
    cmd.args(["--model-params", "1B", "--step-time", "0.001", "--config"]).arg(&cfg);
    let (j, code, err) = run(cmd);
    let f = finding(&j, "bench", "speed");
    expect(
        f,
        "warn",
        &[
            "over the --step-time budget of 0.001 s",
            "parameters: read 2 x 1000000000 x 2 B",
            "optimizer: read and write",
        ],
        &["budget a longer step"],
    );
    assert_eq!(code, Some(0), "{err}");
    // A generous budget is met.
    let mut cmd = doctor_in(&dir.0, &["--json", "--only", "bench", "--bench-size", "4M", "--python", "/bin/false"]);
    cmd.args(["--model-params", "1M", "--step-time", "1000", "--config"]).arg(&cfg);
    let (j, _, _) = run(cmd);
    expect(finding(&j, "bench", "speed"), "ok", &["of the 1000 s budget"], &[]);
}
