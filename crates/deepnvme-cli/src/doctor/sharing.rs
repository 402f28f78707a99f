//! The `sharing` section: whether another job uses a checked folder. Two
//! jobs with one `nvme_path` write the same `zero_stage_3/.../rank0/*.swp`
//! files: DeepSpeed then fails with "buffer nbytes != file bytes" or trains
//! on the other job's state (DeepSpeed #1070, #2006, #3376). Found two ways:
//! other processes with files open under the folder (`/proc/*/fd`; all of
//! them as root, only this user's otherwise), and DeepSpeed swap files
//! written there recently (a job on another node of a shared file system
//! is not in this machine's `/proc`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::report::Finding;
use super::{Context, Target};
use crate::args::fmt_size_approx;

const SECTION: &str = "sharing";
/// Swap files written this recently belong to a job that is running.
const RECENT: Duration = Duration::from_secs(600);
/// DeepSpeed's swap folders: `<nvme_path>/zero_stage_3/{dtype}params/rank{N}`
/// and `<nvme_path>/zero_stage_3/optimizer/rank{N}`.
const SWAP_ROOT: &str = "zero_stage_3";

/// A process (not this one) with files open under a folder.
#[derive(Debug)]
pub struct User {
    pub pid: u32,
    pub comm: String,
    pub files: Vec<PathBuf>,
}

/// Processes with a file open under `dir` (canonical).
pub fn open_under(dir: &Path) -> (Vec<User>, bool) {
    let me = std::process::id();
    let mut users = Vec::new();
    let mut unreadable = false;
    let Ok(procs) = std::fs::read_dir("/proc") else { return (users, true) };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            unreadable = true;
            continue;
        };
        let files: Vec<PathBuf> = fds
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter(|target| target.starts_with(dir))
            .collect();
        if !files.is_empty() {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default().trim().to_string();
            users.push(User { pid, comm, files });
        }
    }
    (users, unreadable)
}

/// DeepSpeed swap files under `dir`: (count, bytes, newest modification).
fn swap_files(dir: &Path) -> (usize, u64, Option<SystemTime>) {
    let mut stack = vec![dir.join(SWAP_ROOT)];
    let (mut count, mut bytes, mut newest) = (0, 0, None::<SystemTime>);
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().ends_with(".swp") {
                count += 1;
                bytes += meta.size();
                if let Ok(m) = meta.modified() {
                    newest = Some(newest.map_or(m, |n| n.max(m)));
                }
            }
        }
    }
    (count, bytes, newest)
}

const FIX: &str = "give every job a folder of its own (nvme_path /nvme/$SLURM_JOB_ID, or one per run): DeepSpeed \
                   separates ranks (rank0, rank1, ...) but not jobs, so two jobs write the same swap files";

pub fn check_target(_ctx: &Context, t: &Target) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::canonicalize(&t.path) else {
        return vec![Finding::ok(SECTION, "open files", "the folder does not exist yet: nobody uses it")];
    };
    let (users, unreadable) = open_under(&dir);
    let partial =
        if unreadable { " (only this user's processes could be read: run as root to see every job)" } else { "" };
    out.push(if users.is_empty() {
        Finding::ok(SECTION, "open files", format!("no other process has files open here{partial}"))
    } else {
        let list: Vec<String> = users
            .iter()
            .map(|u| {
                format!(
                    "pid {} ({}): {} file(s), e.g. {}",
                    u.pid,
                    u.comm,
                    u.files.len(),
                    u.files.first().map(|f| f.display().to_string()).unwrap_or_default()
                )
            })
            .collect();
        Finding::warn(SECTION, "open files", format!("{} other process(es) have files open here", users.len()))
            .why(format!(
                "{}; a job sharing nvme_path overwrites the other's swap files: DeepSpeed fails with \"buffer \
                 nbytes != file bytes\" or trains on the other's state (DeepSpeed #1070, #2006, #3376)",
                list.join("; ")
            ))
            .fix(FIX)
    });

    let (count, bytes, newest) = swap_files(&dir);
    if count > 0 {
        let age = newest.and_then(|n| SystemTime::now().duration_since(n).ok()).unwrap_or_default();
        let what = format!(
            "{count} DeepSpeed swap file(s) under {SWAP_ROOT}/ ({}), the newest written {} s ago",
            fmt_size_approx(bytes),
            age.as_secs()
        );
        out.push(if age < RECENT {
            Finding::warn(SECTION, "swap files", what)
                .why(format!(
                    "written within the last {} minutes: a job is (or just was) swapping here, perhaps from another \
                     node of a shared file system, which /proc does not show; a second job would overwrite its \
                     files (DeepSpeed #1070, #2006, #3376)",
                    RECENT.as_secs() / 60
                ))
                .fix(FIX)
        } else {
            Finding::ok(SECTION, "swap files", what).why(
                "left by an earlier job: DeepSpeed's parameter swapper removes its rank folder when it starts, the \
                 optimizer's files are overwritten; delete them to free the space",
            )
        });
    }
    out
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    ctx.per_target(check_target)
}
