//! `deepnvme info`: what the core would do on this machine: which engine
//! (and why), the O_DIRECT alignment of a directory's file system, and how
//! much memory may be locked (RLIMIT_MEMLOCK, CAP_IPC_LOCK).

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::args::{fmt_size, Arg, Args, CliError};
use crate::core_api;
use crate::json::Json;

pub const USAGE: &str = "\
Usage: deepnvme info [OPTIONS]

Shows the transfer engine this process would use (io_uring or psync, and
why), the O_DIRECT alignment of the file system holding DIR (probed with a
small temp file that is removed at once), RLIMIT_MEMLOCK, the page size and
the CPU count.

  -d, --dir DIR      directory to probe [current directory]
      --json         one JSON object on stdout instead of text
  -h, --help         this text
";

/// What probing a directory's file system found.
enum Dio {
    /// O_DIRECT works; alignment and whether statx reported it.
    Aligned { offset: usize, memory: usize, reported: bool },
    /// The file system refuses O_DIRECT (EINVAL): ops go buffered.
    Unsupported,
    /// The probe itself failed (directory not writable, ...).
    Unknown(String),
}

fn probe_dio(dir: &Path) -> Dio {
    let path = dir.join(format!(".deepnvme-info-{}.tmp", std::process::id()));
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let result = match opened {
        Ok(f) => match core_api::dio_alignment(f.as_raw_fd()) {
            Some(a) => Dio::Aligned { offset: a.offset, memory: a.memory, reported: statx_reports_dio(f.as_raw_fd()) },
            None => Dio::Unsupported,
        },
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Dio::Unsupported,
        Err(e) => Dio::Unknown(format!("cannot create a probe file in {}: {e}", dir.display())),
    };
    let _ = std::fs::remove_file(&path);
    result
}

/// Whether the kernel answers STATX_DIOALIGN for `fd` (else the core
/// assumes a conservative 4096).
fn statx_reports_dio(fd: i32) -> bool {
    // SAFETY: statx fills a zeroed struct; AT_EMPTY_PATH refers to `fd`.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(fd, c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx);
        rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0
    }
}

/// CAP_IPC_LOCK in the effective set: mlock is then not limited.
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// `rlim_t` is not `u64` on every target, hence the cast.
#[allow(clippy::unnecessary_cast)]
fn unlimited(v: u64) -> bool {
    v == libc::RLIM_INFINITY as u64
}

fn fmt_limit(v: u64) -> String {
    if unlimited(v) {
        "unlimited".into()
    } else {
        fmt_size(v)
    }
}

/// Runs `deepnvme info` with the arguments after the subcommand.
pub fn main(argv: Vec<String>) -> Result<(), CliError> {
    let mut args = Args::new(argv, "info");
    let mut dir = PathBuf::from(".");
    let mut json = false;
    while let Some(arg) = args.next_arg() {
        let Arg::Flag { name, inline } = arg else { return Err(args.unknown(arg)) };
        match name.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            "--dir" | "-d" => dir = PathBuf::from(args.value(&name, inline)?),
            "--json" => json = args.switch(&name, inline)?,
            _ => return Err(args.unknown(Arg::Flag { name, inline: None })),
        }
    }
    if !dir.is_dir() {
        return Err(CliError::Failed(format!("{} is not a directory", dir.display())));
    }

    let uring = core_api::io_uring_status();
    let engine = core_api::default_engine();
    let env = std::env::var("DEEPNVME_ENGINE").ok().filter(|v| !v.trim().is_empty());
    let dio = probe_dio(&dir);
    let (soft, hard) = core_api::memlock_limit();
    let cap = has_cap_ipc_lock();
    let page = core_api::page_size();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let dir_shown = std::fs::canonicalize(&dir).unwrap_or(dir.clone());

    if json {
        let mut out = Json::object()
            .set("command", "info")
            .set("version", env!("CARGO_PKG_VERSION"))
            .set("engine", engine.as_ref().map(|k| k.name().to_string()).unwrap_or_else(|e| format!("error: {e}")))
            .set("io_uring_available", uring.is_ok())
            .set("io_uring_error", uring.as_ref().err().cloned())
            .set("deepnvme_engine_env", env.clone())
            .set("dir", dir_shown.display().to_string());
        out = match &dio {
            Dio::Aligned { offset, memory, reported } => out
                .set("o_direct", true)
                .set("dio_offset_align", *offset)
                .set("dio_memory_align", *memory)
                .set("dio_align_reported_by_statx", *reported),
            Dio::Unsupported => out.set("o_direct", false),
            Dio::Unknown(why) => out.set("o_direct", Json::Null).set("o_direct_error", why.as_str()),
        };
        out = out
            .set("memlock_soft_bytes", if unlimited(soft) { Json::Null } else { soft.into() })
            .set("memlock_hard_bytes", if unlimited(hard) { Json::Null } else { hard.into() })
            .set("cap_ipc_lock", cap)
            .set("page_size", page)
            .set("cpus", cpus);
        println!("{}", out.render(2));
        return Ok(());
    }

    println!("deepnvme {}", env!("CARGO_PKG_VERSION"));
    match &engine {
        Ok(k) => println!("engine:          {}", k.name()),
        Err(e) => println!("engine:          none ({e})"),
    }
    match &uring {
        Ok(()) => println!("io_uring:        available"),
        Err(why) => println!("io_uring:        unavailable: {why}"),
    }
    println!("DEEPNVME_ENGINE: {}", env.as_deref().unwrap_or("(unset)"));
    println!("directory:       {}", dir_shown.display());
    match dio {
        Dio::Aligned { offset, memory, reported } => println!(
            "  O_DIRECT:      yes; file offsets/lengths in multiples of {offset} B, memory of {memory} B ({})",
            if reported { "statx STATX_DIOALIGN" } else { "not reported by the kernel; 4096 assumed" }
        ),
        Dio::Unsupported => println!("  O_DIRECT:      not supported by this file system (transfers go buffered)"),
        Dio::Unknown(why) => println!("  O_DIRECT:      unknown ({why})"),
    }
    println!(
        "RLIMIT_MEMLOCK:  soft {}, hard {}{}",
        fmt_limit(soft),
        fmt_limit(hard),
        if cap { "; CAP_IPC_LOCK held, so locking is not limited" } else { "" }
    );
    println!("page size:       {page} B");
    println!("CPUs:            {cpus}");
    Ok(())
}
