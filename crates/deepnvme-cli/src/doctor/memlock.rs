//! The `memlock` section: RLIMIT_MEMLOCK (soft and hard) and CAP_IPC_LOCK
//! of this process, which a job started from the same shell inherits,
//! against what the DeepSpeed config's swap buffers lock per rank
//! ([`DsConfig::locked`](super::config::DsConfig::locked)), and the machine's
//! memory against all ranks' locked buffers. Ranks a launcher starts on
//! other nodes (ssh, pdsh) get the limits PAM gives their login there, not
//! this shell's: the findings say how to check those nodes.

use super::config::{DsConfig, Estimate};
use super::report::{Finding, Status};
use super::Context;
use crate::args::fmt_size_approx;
use crate::core_api;
use crate::info::{fmt_limit, unlimited};

const SECTION: &str = "memlock";
/// Where other nodes' limits come from, and how to see them.
const REMOTE: &str = "Ranks started on other nodes over ssh or pdsh get the limits PAM sets there \
                      (/etc/security/limits.conf and limits.d on that node), not this shell's: check each with \
                      ssh NODE deepnvme doctor --only memlock --config ds_config.json";
const CAP_IPC_LOCK: u32 = 14;

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// How to raise the soft limit to `need` bytes, given the hard limit.
fn raise(hard: u64, need: u64) -> String {
    let within_hard = unlimited(hard) || hard >= need;
    let shell = if within_hard {
        format!(
            "in the shell that starts the job: ulimit -l {} (the hard limit, {}, allows it)",
            if unlimited(hard) { "unlimited".to_string() } else { (need.div_ceil(1024)).to_string() },
            fmt_limit(hard)
        )
    } else {
        format!("the hard limit ({}) is below it too, so as root: raise both", fmt_limit(hard))
    };
    format!(
        "{shell}; for good: '* - memlock unlimited' in /etc/security/limits.conf (log in again), LimitMEMLOCK=infinity \
         for a systemd service, docker run --ulimit memlock=-1, or grant CAP_IPC_LOCK; or lock less (smaller \
         buffer_count or buffer_size). {REMOTE}"
    )
}

/// How to make the parameter swap buffers (the fixed part) fit in `avail`
/// for `ranks` ranks, in numbers.
fn shrink(cfg: &DsConfig, avail: u64, ranks: u64) -> String {
    let Some(p) = &cfg.param else {
        return "run fewer ranks on this machine, or free memory".into();
    };
    let e = cfg.model_dtype_bytes;
    let per_buffer = cfg.aligned_numel(p.buffer_size, e) * e;
    let per_rank = avail / ranks.max(1);
    let count = per_rank / per_buffer.max(1);
    let size = per_rank / p.buffer_count.max(1) / e;
    let fit_ranks = avail / (p.buffer_count * per_buffer).max(1);
    let ranks_fix = match fit_ranks {
        0 => String::new(),
        n => format!(", or run at most {n} rank(s) on this machine"),
    };
    format!(
        "each parameter swap buffer locks {} per rank: lower {}.buffer_count to {count} or less, or buffer_size to \
         {size} elements or less (at least the largest parameter's partition: see buffers){ranks_fix}",
        fmt_size_approx(per_buffer),
        p.block
    )
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    let (soft, hard) = core_api::memlock_limit();
    let cap = super::engine::has_cap(CAP_IPC_LOCK);
    let limit = format!(
        "soft {}, hard {}{}",
        fmt_limit(soft),
        fmt_limit(hard),
        if cap { "; CAP_IPC_LOCK held (locking is not limited)" } else { "" }
    );
    let Some(cfg) = ctx.config.as_ref().filter(|c| c.swaps()) else {
        let why = match &ctx.config {
            Some(_) => "the config swaps nothing to NVMe, so its swap buffers lock nothing",
            None => "pass --config ds_config.json to compare it with what a job's swap buffers lock",
        };
        return vec![Finding::ok(SECTION, "RLIMIT_MEMLOCK", limit).why(format!("{why}. {REMOTE}"))];
    };
    let page = core_api::page_size() as u64;
    let need: Estimate = cfg.locked(&ctx.model, page);
    let (exact, total) = (need.exact(), need.total());
    let basis = format!("per rank, {}. {REMOTE}", need.describe());
    let allowed = |bytes: u64| cap || unlimited(soft) || soft >= bytes;
    let mut out = Vec::new();
    let summary =
        |what: &str, n: u64| format!("{limit}; the config's swap buffers lock {what}{} per rank", fmt_size_approx(n));
    let finding = if !allowed(exact) {
        Finding::fail(SECTION, "RLIMIT_MEMLOCK", summary("", exact))
            .why(format!(
                "new_cpu_locked_tensor cannot lock more than the soft limit, so the swapper's first buffer fails \
                 (mlock ENOMEM) when DeepSpeed starts; {basis}"
            ))
            .fix(raise(hard, total.max(exact)))
    } else if !allowed(total) {
        let status = if need.is_exact() { Status::Fail } else { Status::Warn };
        let f = Finding::new(
            SECTION,
            "RLIMIT_MEMLOCK",
            status,
            summary(if need.is_exact() { "" } else { "up to " }, total),
        )
        .why(format!(
            "the fixed buffers fit, but the model-sized ones may not{}; {basis}",
            if ctx.model.params.is_none() { " (pass --model-params N for an estimate instead of a bound)" } else { "" }
        ));
        f.fix(raise(hard, total))
    } else {
        Finding::ok(SECTION, "RLIMIT_MEMLOCK", summary(if need.is_exact() { "" } else { "up to " }, total)).why(basis)
    };
    out.push(finding);

    // Locked memory cannot be paged out: every rank's buffers need RAM.
    let ranks = ctx.model.world_size.max(1);
    if let Some(avail) = mem_available() {
        let all = exact.saturating_mul(ranks);
        let bound = total.saturating_mul(ranks);
        let who = if ranks > 1 { format!("{ranks} ranks' ") } else { String::new() };
        if all > avail {
            out.push(
                Finding::fail(
                    SECTION,
                    "memory",
                    format!(
                        "{who}fixed swap buffers ({}) exceed MemAvailable ({})",
                        fmt_size_approx(all),
                        fmt_size_approx(avail)
                    ),
                )
                .why(
                    "locked pages stay in RAM; locking more than is free fails or pushes the rest of the job into swap",
                )
                .fix(shrink(cfg, avail, ranks)),
            );
        } else if bound > avail {
            out.push(
                Finding::warn(
                    SECTION,
                    "memory",
                    format!(
                        "{who}swap buffers may lock up to {}, more than MemAvailable ({})",
                        fmt_size_approx(bound),
                        fmt_size_approx(avail)
                    ),
                )
                .why("the optimizer's and swap-out buffers grow with the largest sub-group (sub_group_size bounds it)")
                .fix(
                    "lower zero_optimization.sub_group_size or the buffer counts, or pass --model-params for an \
                      estimate",
                ),
            );
        } else {
            out.push(Finding::ok(
                SECTION,
                "memory",
                format!(
                    "MemAvailable {} holds {who}locked buffers ({})",
                    fmt_size_approx(avail),
                    fmt_size_approx(bound)
                ),
            ));
        }
    }
    out
}
