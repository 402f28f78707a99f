//! `deepnvme info`: what the core would do on this machine: which engine
//! (and why), the O_DIRECT alignment of a directory's file system, and how
//! much memory may be locked (RLIMIT_MEMLOCK, CAP_IPC_LOCK).

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::args::{fmt_size, CliError};
use crate::bench::print_json;
use crate::core_api;

pub const ABOUT: &str = "Engine in use, O_DIRECT alignment of a directory, RLIMIT_MEMLOCK";

pub const LONG_ABOUT: &str = "\
Shows the transfer engine this process would use (io_uring or psync, and
why), the engine files in DIR get (files on tmpfs and ramfs use psync
unless an engine is chosen explicitly), the O_DIRECT alignment of the file system holding DIR (probed with a
small temp file that is removed at once), RLIMIT_MEMLOCK, the page size and
the CPU count.";

/// `deepnvme info`'s options.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Directory to probe
    #[arg(short, long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,

    /// One JSON object on stdout instead of text
    #[arg(long)]
    json: bool,
}

/// `info --json`: field names and order are the tool's output format. The
/// `dio_*` fields are there only when O_DIRECT works, `o_direct_error` only
/// when the probe failed (`o_direct` is then null).
#[derive(Serialize)]
struct InfoReport {
    command: &'static str,
    version: &'static str,
    engine: String,
    io_uring_available: bool,
    io_uring_error: Option<String>,
    deepnvme_engine_env: Option<String>,
    /// The engine per file, in one line.
    file_engine_rule: &'static str,
    dir: String,
    /// The engine a default handle uses for files in `dir`, and the file
    /// system that decided it when it is not the handle's engine.
    dir_engine: Option<String>,
    dir_engine_file_system: Option<&'static str>,
    o_direct: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dio_offset_align: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dio_memory_align: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dio_align_reported_by_statx: Option<bool>,
    /// What statx said, where the core raised it (zram).
    #[serde(skip_serializing_if = "Option::is_none")]
    dio_memory_align_statx: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    o_direct_error: Option<String>,
    /// null when unlimited.
    memlock_soft_bytes: Option<u64>,
    memlock_hard_bytes: Option<u64>,
    cap_ipc_lock: bool,
    page_size: usize,
    cpus: usize,
}

/// What probing a directory's file system found.
pub(crate) enum Dio {
    /// O_DIRECT works; the alignment the core uses, and the memory
    /// alignment statx reported (None: not reported, 4096 assumed).
    Aligned { offset: usize, memory: usize, statx_memory: Option<usize> },
    /// The file system refuses O_DIRECT (EINVAL): ops go buffered.
    Unsupported,
    /// The probe itself failed (directory not writable, ...).
    Unknown(String),
}

pub(crate) fn probe_dio(dir: &Path) -> Dio {
    let path = dir.join(format!(".deepnvme-info-{}.tmp", std::process::id()));
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let result = match opened {
        Ok(f) => match core_api::dio_alignment(f.as_raw_fd()) {
            Some(a) => Dio::Aligned { offset: a.offset, memory: a.memory, statx_memory: statx_dio_memory(f.as_raw_fd()) },
            None => Dio::Unsupported,
        },
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Dio::Unsupported,
        Err(e) => Dio::Unknown(format!("cannot create a probe file in {}: {e}", dir.display())),
    };
    let _ = std::fs::remove_file(&path);
    result
}

/// The engine a default handle uses for files in `dir` (with the file
/// system that decided it), probed on the directory itself.
fn dir_engine(dir: &Path) -> Option<(String, Option<&'static str>)> {
    let d = std::fs::File::open(dir).ok()?;
    core_api::engine_for_file(d.as_raw_fd()).ok().map(|(k, fs)| (k.name().to_string(), fs))
}

/// Where the alignment the core uses came from, for a finding or a line.
pub(crate) fn dio_alignment_source(memory: usize, statx_memory: Option<usize>) -> String {
    match statx_memory {
        None => "not reported by the kernel; the core assumes 4096".into(),
        Some(m) if m < memory => format!(
            "statx STATX_DIOALIGN says memory of {m} B; raised to the page because the device (zram) moves \
             memory that is not page-aligned wrongly"
        ),
        Some(_) => "statx STATX_DIOALIGN".into(),
    }
}

/// The memory alignment the kernel answers STATX_DIOALIGN with for `fd`
/// (None when it does not: the core then assumes a conservative 4096).
fn statx_dio_memory(fd: i32) -> Option<usize> {
    // SAFETY: statx fills a zeroed struct; AT_EMPTY_PATH refers to `fd`.
    // A raw system call: glibc's statx wrapper (2.28) would raise the
    // wheel's glibc floor above manylinux2014's 2.17.
    unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::syscall(
            libc::SYS_statx,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx as *mut libc::statx,
        );
        (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0).then_some(stx.stx_dio_mem_align as usize)
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
pub(crate) fn unlimited(v: u64) -> bool {
    v == libc::RLIM_INFINITY as u64
}

pub(crate) fn fmt_limit(v: u64) -> String {
    if unlimited(v) {
        "unlimited".into()
    } else {
        fmt_size(v)
    }
}

/// Runs `deepnvme info`.
pub fn main(args: InfoArgs) -> Result<(), CliError> {
    let InfoArgs { dir, json } = args;
    if !dir.is_dir() {
        return Err(CliError::Failed(format!("{} is not a directory", dir.display())));
    }

    let uring = core_api::io_uring_status();
    let engine = core_api::default_engine();
    let env = std::env::var("DEEPNVME_ENGINE").ok().filter(|v| !v.trim().is_empty());
    let dio = probe_dio(&dir);
    let for_dir = dir_engine(&dir);
    let (soft, hard) = core_api::memlock_limit();
    let cap = has_cap_ipc_lock();
    let page = core_api::page_size();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let dir_shown = std::fs::canonicalize(&dir).unwrap_or(dir.clone());

    if json {
        let limit = |v: u64| (!unlimited(v)).then_some(v);
        let mut report = InfoReport {
            command: "info",
            version: env!("CARGO_PKG_VERSION"),
            engine: engine.as_ref().map(|k| k.name().to_string()).unwrap_or_else(|e| format!("error: {e}")),
            io_uring_available: uring.is_ok(),
            io_uring_error: uring.as_ref().err().cloned(),
            deepnvme_engine_env: env.clone(),
            file_engine_rule: core_api::FILE_ENGINE_RULE,
            dir: dir_shown.display().to_string(),
            dir_engine: for_dir.as_ref().map(|(k, _)| k.clone()),
            dir_engine_file_system: for_dir.as_ref().and_then(|(_, fs)| *fs),
            o_direct: None,
            dio_offset_align: None,
            dio_memory_align: None,
            dio_align_reported_by_statx: None,
            dio_memory_align_statx: None,
            o_direct_error: None,
            memlock_soft_bytes: limit(soft),
            memlock_hard_bytes: limit(hard),
            cap_ipc_lock: cap,
            page_size: page,
            cpus,
        };
        match &dio {
            Dio::Aligned { offset, memory, statx_memory } => {
                report.o_direct = Some(true);
                report.dio_offset_align = Some(*offset);
                report.dio_memory_align = Some(*memory);
                report.dio_align_reported_by_statx = Some(statx_memory.is_some());
                report.dio_memory_align_statx = statx_memory.filter(|m| m < memory);
            }
            Dio::Unsupported => report.o_direct = Some(false),
            Dio::Unknown(why) => report.o_direct_error = Some(why.clone()),
        }
        return print_json(&report);
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
    println!("per file:        {}", core_api::FILE_ENGINE_RULE);
    println!("directory:       {}", dir_shown.display());
    match &for_dir {
        Some((k, Some(fs))) => println!("  engine:        {k} (the directory is on {fs})"),
        Some((k, None)) => println!("  engine:        {k}"),
        None => println!("  engine:        unknown"),
    }
    match dio {
        Dio::Aligned { offset, memory, statx_memory } => println!(
            "  O_DIRECT:      yes; file offsets/lengths in multiples of {offset} B, memory of {memory} B ({})",
            dio_alignment_source(memory, statx_memory)
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
