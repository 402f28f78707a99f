//! The `engine` section: whether io_uring works in this process (the core's
//! own probe decides), and when it does not, why: `kernel.io_uring_disabled`
//! (and `io_uring_group`), a seccomp filter (Docker's default profile
//! answers EPERM), or a kernel without io_uring; and what the psync
//! fallback costs. `DEEPNVME_ENGINE` forcing an engine is reported too.

use super::report::{Finding, Status};
use super::Context;
use crate::core_api;

const SECTION: &str = "engine";
const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";
const GROUP_SYSCTL: &str = "/proc/sys/kernel/io_uring_group";
const CAP_SYS_ADMIN: u32 = 21;

/// The kernel's io_uring setting and what this process is allowed.
#[derive(Debug, Default)]
struct Facts {
    /// `kernel.io_uring_disabled` (None: a kernel without the sysctl, before 6.6).
    disabled: Option<u32>,
    /// `kernel.io_uring_group` (-1: none).
    group: Option<i64>,
    /// `Seccomp:` of /proc/self/status: 0 none, 1 strict, 2 filter.
    seccomp: Option<u32>,
    /// The errno of a bare `io_uring_setup`, when it failed.
    setup_errno: Option<i32>,
    in_group: bool,
    cap_sys_admin: bool,
}

fn read_number(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A field of /proc/self/status, e.g. `Seccomp`.
pub(crate) fn status_field(name: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_string()))
}

/// Whether capability `cap` is in the effective set.
pub(crate) fn has_cap(cap: u32) -> bool {
    status_field("CapEff").and_then(|hex| u64::from_str_radix(&hex, 16).ok()).is_some_and(|c| c & (1 << cap) != 0)
}

/// The errno of `io_uring_setup(1, ...)`, or None when it made a ring. The
/// core's probe says whether io_uring works; this only names the errno it
/// got, which tells a seccomp or sysctl refusal (EPERM) from a kernel
/// without io_uring (ENOSYS).
fn setup_errno() -> Option<i32> {
    // struct io_uring_params is 120 bytes; zeroed asks for nothing special.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup reads and fills the 120-byte params struct.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: the ring's descriptor is ours.
        unsafe { libc::close(fd as i32) };
        None
    } else {
        Some(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

fn in_group(gid: i64) -> bool {
    if gid < 0 {
        return false;
    }
    // SAFETY: getgroups fills at most `n` entries of the vector.
    unsafe {
        if libc::getegid() as i64 == gid {
            return true;
        }
        let n = libc::getgroups(0, std::ptr::null_mut());
        let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
        let n = libc::getgroups(n, groups.as_mut_ptr());
        groups.truncate(n.max(0) as usize);
        groups.iter().any(|g| *g as i64 == gid)
    }
}

fn facts() -> Facts {
    let group = read_number(GROUP_SYSCTL);
    Facts {
        disabled: read_number(SYSCTL).map(|v| v as u32),
        group,
        seccomp: status_field("Seccomp").and_then(|v| v.parse().ok()),
        setup_errno: setup_errno(),
        in_group: group.is_some_and(in_group),
        cap_sys_admin: has_cap(CAP_SYS_ADMIN),
    }
}

/// Why io_uring is refused, and what to do about it.
fn cause(f: &Facts, probe_error: &str) -> (String, String) {
    let persist = "to keep it after a reboot, put kernel.io_uring_disabled = 0 in /etc/sysctl.d/90-io_uring.conf";
    match f.disabled {
        Some(2) => {
            return (
                format!("kernel.io_uring_disabled = 2: the kernel refuses io_uring to every process ({probe_error})"),
                format!("as root: sysctl -w kernel.io_uring_disabled=0 ({persist}); or live with the psync engine"),
            )
        }
        Some(1) if !f.in_group && !f.cap_sys_admin => {
            let group = match f.group {
                Some(g) if g >= 0 => format!("add the user to group {g} (kernel.io_uring_group) and log in again, or "),
                _ => String::new(),
            };
            return (
                format!(
                    "kernel.io_uring_disabled = 1: only processes in kernel.io_uring_group or with CAP_SYS_ADMIN may \
                     create rings, and this one is neither ({probe_error})"
                ),
                format!("{group}as root: sysctl -w kernel.io_uring_disabled=0 ({persist})"),
            );
        }
        _ => {}
    }
    let seccomp = f.seccomp == Some(2);
    match f.setup_errno {
        Some(e) if (e == libc::EPERM || e == libc::ENOSYS) && seccomp => (
            format!(
                "a seccomp filter on this process refuses io_uring_setup with {} (Docker's and containerd's default \
                 profiles do); kernel.io_uring_disabled is {}",
                core_api::errno_text(e),
                f.disabled.map(|d| d.to_string()).unwrap_or_else(|| "not there (kernel before 6.6)".into())
            ),
            "run the container with a seccomp profile that allows io_uring_setup, io_uring_enter and \
             io_uring_register (docker run --security-opt seccomp=PROFILE.json; seccomp=unconfined also works), or \
             live with the psync engine"
                .into(),
        ),
        Some(e) if e == libc::ENOSYS => (
            format!("the kernel has no io_uring (io_uring_setup: {}; CONFIG_IO_URING off?)", core_api::errno_text(e)),
            "use a kernel built with CONFIG_IO_URING (5.6 or later), or live with the psync engine".into(),
        ),
        Some(e) if e == libc::EPERM => (
            format!(
                "io_uring_setup is refused with {} by something other than the sysctl or a seccomp filter of this \
                 process (an LSM such as SELinux or AppArmor, or a sandbox)",
                core_api::errno_text(e)
            ),
            "check the audit log (ausearch -m AVC, dmesg) for io_uring denials and allow them, or live with the \
             psync engine"
                .into(),
        ),
        _ => (
            format!("the core's io_uring probe failed: {probe_error}"),
            "use a kernel of 5.6 or later with io_uring's READ and WRITE operations, or live with the psync engine"
                .into(),
        ),
    }
}

/// What the psync engine costs, as far as it can be said without measuring
/// (the bench section measures it).
fn fallback_cost(ctx: &Context) -> String {
    let aio = ctx.aio();
    format!(
        "psync moves each request with a blocking pread/pwrite on a thread of its own (up to queue_depth {} threads \
         per worker, {} worker(s) per handle), one system call per {} block, and never registers io_uring fixed \
         buffers: on NVMe it usually keeps the GB/s but spends more CPU per GB{}",
        aio.queue_depth,
        aio.intra_op_parallelism,
        crate::args::fmt_size(aio.block_size as u64),
        if ctx.runs("bench") { "; the bench section measures both on this directory" } else { "" }
    )
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    let probe = core_api::io_uring_status();
    let env = std::env::var(core_api::ENGINE_ENV).ok().filter(|v| !v.trim().is_empty());
    let f = facts();
    let sysctl = match f.disabled {
        Some(d) => format!("kernel.io_uring_disabled = {d}"),
        None => "no kernel.io_uring_disabled (kernel before 6.6)".into(),
    };
    let mut out = Vec::new();
    match &probe {
        Ok(()) => out.push(
            Finding::ok(SECTION, "io_uring", "available: handles use the io_uring engine")
                .why(format!("a ring was set up and ran a NOP, with READ and WRITE supported; {sysctl}")),
        ),
        Err(e) => {
            let (why, fix) = cause(&f, e);
            let forced_uring =
                env.as_deref().and_then(core_api::EngineKind::parse) == Some(core_api::EngineKind::Uring);
            let status = if forced_uring { Status::Fail } else { Status::Warn };
            let summary = if forced_uring {
                format!("unavailable, and {}=uring asks for it: creating a handle fails", core_api::ENGINE_ENV)
            } else {
                "unavailable: handles fall back to the psync engine (pread/pwrite threads)".to_string()
            };
            let fix = if forced_uring { format!("{fix}; or unset {}", core_api::ENGINE_ENV) } else { fix };
            out.push(Finding::new(SECTION, "io_uring", status, summary).why(why).fix(fix));
            out.push(Finding::ok(SECTION, "fallback cost", "psync instead of io_uring").why(fallback_cost(ctx)));
        }
    }
    match core_api::default_engine() {
        Ok(k) => {
            let mut finding = Finding::ok(SECTION, "engine", format!("handles get {}", k.name()));
            if let Some(v) = &env {
                finding = finding.why(format!("{}={v} chooses it", core_api::ENGINE_ENV));
                if k == core_api::EngineKind::Psync && probe.is_ok() {
                    finding.status = Status::Warn;
                    finding = finding
                        .why(format!("{}={v} forces psync although io_uring works here", core_api::ENGINE_ENV))
                        .fix(format!("unset {} unless psync is meant", core_api::ENGINE_ENV));
                }
            } else {
                finding = finding.why("the default: io_uring where it works, else psync");
            }
            out.push(finding);
        }
        // Already reported as the io_uring finding when it is DEEPNVME_ENGINE=uring.
        Err(e) if !out.iter().any(|f| f.status == Status::Fail) => out.push(
            Finding::fail(SECTION, "engine", format!("no engine: {e}"))
                .why(format!("{} has a value the core does not know", core_api::ENGINE_ENV))
                .fix(format!("set {}=uring or psync, or unset it", core_api::ENGINE_ENV)),
        ),
        Err(_) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_name_the_sysctl_the_filter_and_the_kernel() {
        let sysctl = Facts { disabled: Some(2), setup_errno: Some(libc::EPERM), ..Facts::default() };
        let (why, fix) = cause(&sysctl, "io_uring_setup: EPERM");
        assert!(why.contains("kernel.io_uring_disabled = 2") && fix.contains("sysctl -w kernel.io_uring_disabled=0"));

        let group = Facts { disabled: Some(1), group: Some(1234), setup_errno: Some(libc::EPERM), ..Facts::default() };
        let (why, fix) = cause(&group, "");
        assert!(why.contains("= 1") && fix.contains("group 1234"), "{why} / {fix}");
        // In the group (or CAP_SYS_ADMIN), the sysctl is not what refused it.
        let member = Facts { in_group: true, seccomp: Some(2), ..group };
        assert!(cause(&member, "").0.contains("seccomp"));

        let docker = Facts { disabled: Some(0), seccomp: Some(2), setup_errno: Some(libc::EPERM), ..Facts::default() };
        let (why, fix) = cause(&docker, "");
        assert!(why.contains("seccomp filter") && fix.contains("--security-opt seccomp="), "{why} / {fix}");

        let old = Facts { setup_errno: Some(libc::ENOSYS), ..Facts::default() };
        assert!(cause(&old, "").0.contains("no io_uring"));
        let lsm = Facts { disabled: Some(0), seccomp: Some(0), setup_errno: Some(libc::EPERM), ..Facts::default() };
        assert!(cause(&lsm, "").0.contains("LSM"));
    }

    /// The bare setup agrees with the core's probe in this process.
    #[test]
    fn setup_errno_agrees_with_the_core() {
        assert_eq!(setup_errno().is_none(), core_api::io_uring_status().is_ok());
    }
}
