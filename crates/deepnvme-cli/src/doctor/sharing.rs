//! The `sharing` section: whether another job uses a checked folder. Two
//! jobs with one `nvme_path` write the same `zero_stage_3/.../rank0/*.swp`
//! files: DeepSpeed then fails with "buffer nbytes != file bytes" or trains
//! on the other job's state (DeepSpeed #1070, #2006, #3376). Found two ways:
//! other processes with DeepSpeed's swap files open under the folder
//! (`/proc/*/fd`; all of them as root, only this user's otherwise; other
//! open files, a log or a dataset, are listed but are no sign of a job
//! swapping there), and DeepSpeed swap files written there recently (a job
//! on another node of a shared file system is not in this machine's
//! `/proc`).

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
/// (`partitioned_param_swapper.py`) and `<nvme_path>/zero_stage_3/optimizer/rank{N}`
/// (`optimizer_utils.py`), holding `{id}_param.tensor.swp`, `{id}.tensor.swp`
/// and `{id}_gradient_{offset}_{length}.tensor.swp`.
const SWAP_ROOT: &str = "zero_stage_3";

/// Whether `rel`, a path under a checked folder, is DeepSpeed's swap data:
/// under `zero_stage_3/`, a `*.swp` file (what a swapper's rank folder
/// holds, when the folder checked is one of DeepSpeed's own), or in a
/// swapper's rank folder (`optimizer/rank0`, `bfloat16params/rank0`).
pub fn is_swap_path(rel: &Path) -> bool {
    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let rank = |p: &str| p.strip_prefix("rank").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let swapper = |p: &str| p == "optimizer" || (p.ends_with("params") && p.len() > "params".len());
    parts.iter().any(|p| p == SWAP_ROOT)
        || parts.last().is_some_and(|f| f.ends_with(".swp"))
        || parts.windows(2).any(|w| swapper(&w[0]) && rank(&w[1]))
}

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

/// "pid 42 (python): 3 file(s), e.g. /nvme/zero_stage_3/optimizer/rank0/1.tensor.swp".
fn describe(users: &[(&User, Vec<&PathBuf>)]) -> String {
    let list: Vec<String> = users
        .iter()
        .map(|(u, files)| {
            format!(
                "pid {} ({}): {} file(s), e.g. {}",
                u.pid,
                u.comm,
                files.len(),
                files.first().map(|f| f.display().to_string()).unwrap_or_default()
            )
        })
        .collect();
    list.join("; ")
}

pub fn check_target(_ctx: &Context, t: &Target) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::canonicalize(&t.path) else {
        return vec![Finding::ok(SECTION, "open files", "the folder does not exist yet: nobody uses it")];
    };
    let (users, unreadable) = open_under(&dir);
    let partial =
        if unreadable { " (only this user's processes could be read: run as root to see every job)" } else { "" };
    let swap = |f: &&PathBuf| f.strip_prefix(&dir).is_ok_and(is_swap_path);
    let swapping: Vec<(&User, Vec<&PathBuf>)> = users
        .iter()
        .map(|u| (u, u.files.iter().filter(swap).collect::<Vec<_>>()))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    let others: Vec<(&User, Vec<&PathBuf>)> = users
        .iter()
        .filter(|u| !swapping.iter().any(|(s, _)| s.pid == u.pid))
        .map(|u| (u, u.files.iter().collect()))
        .collect();
    let also = if others.is_empty() {
        String::new()
    } else {
        format!("; also open here, no swap files: {}", describe(&others))
    };
    out.push(if !swapping.is_empty() {
        Finding::warn(
            SECTION,
            "open files",
            format!("{} other process(es) have DeepSpeed swap files open here", swapping.len()),
        )
        .why(format!(
            "{}; a job sharing nvme_path overwrites the other's swap files: DeepSpeed fails with \"buffer \
             nbytes != file bytes\" or trains on the other's state (DeepSpeed #1070, #2006, #3376){also}",
            describe(&swapping)
        ))
        .fix(FIX)
    } else if !others.is_empty() {
        Finding::ok(
            SECTION,
            "open files",
            format!("{} other process(es) have files open here, no DeepSpeed swap file among them", others.len()),
        )
        .why(format!(
            "{}; only DeepSpeed's swap files (under {SWAP_ROOT}/, *.swp) would mean another job swaps here{partial}",
            describe(&others)
        ))
    } else {
        Finding::ok(SECTION, "open files", format!("no other process has files open here{partial}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepspeeds_swap_files_and_folders() {
        for swap in [
            "zero_stage_3/bfloat16params/rank0/3_param.tensor.swp",
            "zero_stage_3/optimizer/rank1/7.tensor.swp",
            "zero_stage_3",
            "rank0/7_gradient_0_512.tensor.swp",
            "optimizer/rank3/x",
            "float16params/rank0/anything",
            "rank2/1.tensor.swp",
        ] {
            assert!(is_swap_path(Path::new(swap)), "{swap}");
        }
        for other in [
            "logs/train.log",
            "data/shard-0.bin",
            "params/rank0",
            "rank/x",
            "rank0/train.log",
            "checkpoints/global_step10/mp_rank_00_model_states.pt",
        ] {
            assert!(!is_swap_path(Path::new(other)), "{other}");
        }
    }
}
