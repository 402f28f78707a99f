//! The `bench` section: a short `deepnvme bench` in each folder (once per
//! file system) with the config's aio knobs, once per engine that works
//! here (so the psync fallback's cost is measured, not guessed), then fio
//! on the same file with the same block size and queue depth when fio is
//! installed, the two side by side; and the GB/s against what is needed: a
//! stated floor (`--min-gbps`, else the device kind's: `device::Facts`) or
//! one training step's swaps within `--step-time`, and a cgroup limit the
//! bench ran into, naming why a device is slow (a cgroup limit, a loop
//! device, a network file system, a rotational disk, an NVMe drive slower
//! than its kind). `--bench-size` sets the bytes per pass; `--no-bench`
//! skips the section.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::report::Finding;
use super::{cgroup, device};
use super::{Context, Target};
use crate::args::{fmt_size, fmt_size_approx};
use crate::core_api::{self, Direction, EngineKind};
use crate::progress::{Progress, ProgressMode};
use crate::runner::{self, AioConfig, BenchBuffer, BenchFile, Pass, GB};

const SECTION: &str = "bench";
/// Bytes per op: the passes are short, so one op per pass up to this.
const MAX_OP: u64 = 256 << 20;
/// Below this share of fio's GB/s the knobs (or the tool) deserve a look;
/// short passes are noisy, so only a gap this wide is reported.
const SLOW_RATIO: f64 = 0.5;

/// Write then read GB/s and CPU s/GB of one engine.
struct Measured {
    engine: &'static str,
    write: Pass,
    read: Pass,
}

fn cpu_per_gb(p: &Pass) -> f64 {
    p.cpu_secs / (p.bytes as f64 / GB)
}

fn line(m: &Measured) -> String {
    format!(
        "{}: write {:.2} GB/s ({:.2} CPU s/GB), read {:.2} GB/s ({:.2} CPU s/GB)",
        m.engine,
        m.write.gb_per_s(),
        cpu_per_gb(&m.write),
        m.read.gb_per_s(),
        cpu_per_gb(&m.read)
    )
}

fn measure(
    knobs: &AioConfig,
    engine: EngineKind,
    file: &BenchFile,
    buffer: &mut BenchBuffer,
    size: u64,
) -> Result<Measured, String> {
    let handle = knobs.open_handle(Some(engine)).map_err(|e| e.to_string())?;
    let quiet = || Progress::new(ProgressMode::Off, "");
    let mut pass = |d: Direction, p: &mut Progress| {
        runner::run_pass(&handle, buffer, file.path(), size, d, p).map_err(|e| e.to_string())
    };
    // A new file is written once untimed, so the timed write overwrites
    // allocated blocks, as swapping does in steady state.
    if file.len() < size {
        pass(Direction::Write, &mut quiet())?;
    }
    let write = pass(Direction::Write, &mut quiet())?;
    let read = pass(Direction::Read, &mut quiet())?;
    Ok(Measured { engine: engine.name(), write, read })
}

/// fio's GB/s and CPU s/GB for `rw` (write or read) on `path`.
fn fio(path: &Path, size: u64, ctx: &Context, engine: &str, rw: &str) -> Result<(f64, f64), String> {
    let aio = ctx.aio();
    let jobs = aio.intra_op_parallelism.max(1) as u64;
    let per_job = size / jobs;
    let out = Command::new("fio")
        .args([
            "--name=deepnvme-doctor",
            &format!("--filename={}", path.display()),
            &format!("--size={per_job}"),
            &format!("--offset_increment={per_job}"),
            &format!("--numjobs={jobs}"),
            "--group_reporting",
            &format!("--bs={}", aio.block_size),
            &format!("--iodepth={}", aio.queue_depth),
            &format!("--ioengine={engine}"),
            "--direct=1",
            &format!("--rw={rw}"),
            "--output-format=json",
        ])
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find('{').map(|i| &text[i..]).unwrap_or("");
    let v: Value = serde_json::from_str(json).map_err(|_| {
        format!(
            "fio {rw} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        )
    })?;
    let job = &v["jobs"][0];
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio {rw} failed with error {}", job["error"]));
    }
    let bw = job[rw]["bw_bytes"].as_f64().ok_or("fio reported no bandwidth")? / GB;
    let secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let cpu = (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0)) / 100.0 * secs;
    Ok((bw, cpu / (size as f64 / GB)))
}

fn fio_engine(uring: bool) -> Option<&'static str> {
    let help = Command::new("fio").arg("--enghelp").output().ok()?;
    let engines = String::from_utf8_lossy(&help.stdout).to_string();
    let has = |e: &str| engines.lines().any(|l| l.trim() == e);
    if uring && has("io_uring") {
        Some("io_uring")
    } else if has("libaio") {
        Some("libaio")
    } else {
        Some("psync")
    }
}

/// A cgroup limit at least this share of which the bench reached is what
/// held it (a throttle lets short bursts through, and passes are short).
const BINDING_SHARE: f64 = 0.5;

/// Bytes one training step swaps through `t` on this machine (all its
/// ranks): reads, writes, and how they were counted. Per parameter: the
/// parameter swapper reads each twice (forward and backward) and writes it
/// once (after the step), in the model's dtype; the optimizer swapper reads
/// and writes 16 B (the fp32 parameter, exp_avg, exp_avg_sq, and the
/// gradient, written in backward and read in the step).
fn step_bytes(ctx: &Context, t: &Target) -> Option<(f64, f64, String)> {
    let cfg = ctx.config.as_ref()?;
    let n = ctx.model.params? / ctx.model.nodes.max(1);
    let (mut read, mut write, mut how) = (0u64, 0u64, Vec::new());
    for o in cfg.offloads().filter(|o| o.nvme_path.as_deref() == Some(t.path.as_path())) {
        if o.block.ends_with("offload_param") {
            let e = cfg.model_dtype_bytes;
            read += 2 * n * e;
            write += n * e;
            how.push(format!("parameters: read 2 x {n} x {e} B, write {n} x {e} B"));
        } else {
            read += 16 * n;
            write += 16 * n;
            how.push(format!("optimizer: read and write {n} x 16 B"));
        }
    }
    (read + write > 0).then(|| (read as f64, write as f64, how.join("; ")))
}

/// The device kinds without a floor, in words.
fn kind_phrase(facts: &device::Facts) -> String {
    match facts.kind {
        Some("virtio") => format!("{}, a virtual disk: its speed is the host's storage", facts.name),
        Some("scsi") => format!("{}, a SCSI/SATA/SAS disk: its speed is its model's", facts.name),
        Some("memory") => format!("{}, compressed RAM", facts.name),
        Some("loop") => format!("{}, a loop device over a device without one", facts.name),
        Some(kind) => format!("{} ({kind})", facts.name),
        None => "a file system without a block device".to_string(),
    }
}

/// The GB/s measured against the floor and the job's needs, with the causes
/// of a slow device.
fn speed(ctx: &Context, t: &Target, write: f64, read: f64) -> Finding {
    let facts = device::facts(&t.probe_dir);
    let mount = super::filesystem::mount_of(&t.probe_dir);
    let fstype = mount.as_ref().map(|m| m.fstype.clone()).unwrap_or_default();
    let summary = format!("write {write:.3} GB/s, read {read:.3} GB/s");
    let floor = match ctx.min_gbps {
        Some(g) => Some((g, "--min-gbps".to_string())),
        None => facts.floor.clone(),
    };
    // A cgroup limit the bench ran into is the speed measured, whatever the
    // device: slow, with the reason, floor or not.
    let binding: Vec<&cgroup::Limit> = facts
        .limits
        .iter()
        .filter(|l| {
            let got = if l.what.starts_with("read") { read } else { write };
            l.bytes_per_s().is_some_and(|b| got * 1e9 >= BINDING_SHARE * b as f64)
        })
        .collect();
    let needs = ctx.step_time.zip(step_bytes(ctx, t)).map(|(budget, (r, w, how))| {
        let secs = r / (read * 1e9) + w / (write * 1e9);
        (budget, secs, how)
    });
    let mut short = Vec::new();
    if let Some((g, what)) = &floor {
        if write < *g || read < *g {
            short.push(format!("under {g} GB/s ({what})"));
        }
    }
    if let Some((budget, secs, how)) = &needs {
        if secs > budget {
            short.push(format!(
                "one training step's swaps take {secs:.1} s at these speeds, over the --step-time budget of {budget} s \
                 ({how}; on {} rank(s))",
                ctx.model.world_size
            ));
        }
    }
    if !binding.is_empty() {
        let list: Vec<String> = binding.iter().map(|l| device::fmt_limit(l)).collect();
        short.push(format!("held to a cgroup limit ({})", list.join(", ")));
    }
    let compared = floor.is_some() || needs.is_some() || !binding.is_empty();
    if !compared {
        let why = if ctx.step_time.is_some() {
            "--step-time needs --model-params and a config swapping to this folder".to_string()
        } else {
            format!("no floor for {} (docs/doctor.md lists the floors)", kind_phrase(&facts))
        };
        return Finding::skip(SECTION, "speed", format!("{summary}: not compared"))
            .why(why)
            .fix("pass --min-gbps G (the GB/s the job needs), or --step-time S with --model-params N");
    }
    if short.is_empty() {
        let against = [
            floor.map(|(g, w)| format!("at least {g} GB/s ({w})")),
            needs.map(|(b, s, _)| format!("a step's swaps take {s:.1} s of the {b} s budget")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
        return Finding::ok(SECTION, "speed", summary).why(against);
    }
    // Why it is slow, and what to do about each cause.
    let mut causes = Vec::new();
    let mut fixes = Vec::new();
    for l in &facts.limits {
        causes.push(format!(
            "a cgroup limits this process on {}: {} ({})",
            l.device,
            device::fmt_limit(l),
            l.file.display()
        ));
        fixes.push(format!("lift the cgroup limit ({})", l.lift()));
    }
    match facts.kind {
        Some("loop") => {
            causes
                .push(format!("{} is a loop device: the speed of the file system under its backing file", facts.name));
            fixes.push("put nvme_path on the drive's own file system, not a loop device".into());
        }
        Some("nvme") if facts.limits.is_empty() => {
            causes.push(format!(
                "{} is an NVMe drive slower than its kind: worn or nearly full, thermally throttled, or on a narrow \
                 PCIe link",
                facts.name
            ));
            fixes.push(format!(
                "check the link (lspci -vv: LnkSta against LnkCap), nvme smart-log /dev/{} (temperature, \
                 percentage_used), and its free space",
                facts.name
            ));
        }
        Some("virtio") => causes.push(format!("{} is a virtual disk: the host's storage sets its speed", facts.name)),
        Some("memory") => causes.push("zram: compressed RAM".into()),
        _ => {}
    }
    if facts.rotational {
        causes.push(format!("{} is a rotational disk", facts.name));
        fixes.push("put nvme_path on an NVMe drive".into());
    }
    if fstype.starts_with("nfs")
        || fstype.starts_with("fuse")
        || ["cifs", "smb3", "9p", "virtiofs", "ceph", "glusterfs"].contains(&fstype.as_str())
    {
        causes.push(format!("{fstype} is a network or FUSE file system"));
        fixes.push("put nvme_path on a local NVMe file system".into());
    }
    if causes.is_empty() {
        causes.push("no cause found in the device, the file system or cgroup limits".into());
    }
    if fixes.is_empty() {
        fixes.push("see the device section; deepnvme tune finds the best aio knobs".into());
    }
    if needs.as_ref().is_some_and(|(b, s, _)| s > b) {
        fixes.push("or budget a longer step, or swap less (more memory, a smaller model per node)".into());
    }
    Finding::warn(SECTION, "speed", format!("{summary}: {}", short.join("; ")))
        .why(format!("slow because: {}", causes.join("; ")))
        .fix(fixes.join("; "))
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    // Once per file system: folders on one share its speed.
    let mut measured_on: Vec<(u64, &Target)> = Vec::new();
    let mut out = Vec::new();
    for t in &ctx.targets {
        let dev = t.dev();
        if let Some((_, first)) = measured_on.iter().find(|(d, _)| Some(*d) == dev) {
            out.push(t.stamp(Finding::ok(
                SECTION,
                "deepnvme",
                format!("the file system of {}: measured there", first.path.display()),
            )));
            continue;
        }
        if let Some(d) = dev {
            measured_on.push((d, t));
        }
        out.extend(check_target(ctx, t).into_iter().map(|f| t.stamp(f)));
    }
    out
}

pub fn check_target(ctx: &Context, t: &Target) -> Vec<Finding> {
    let aio = ctx.aio();
    let knobs = AioConfig {
        block_size: aio.block_size,
        queue_depth: aio.queue_depth,
        single_submit: aio.single_submit,
        overlap_events: aio.overlap_events,
        parallelism: aio.intra_op_parallelism,
    };
    let size = ctx.bench_size;
    let knobs_line = crate::bench::knobs_line(&knobs);
    let not_run = |why: String| {
        vec![Finding::warn(SECTION, "deepnvme", "not run")
            .why(why)
            .fix("fix what the other sections name, or pass a smaller --bench-size (or --no-bench)")]
    };
    if let Err(m) = knobs.check(None).and_then(|()| runner::check_split(size, size.min(MAX_OP), knobs.parallelism)) {
        return not_run(format!("the aio knobs cannot run: {m}"));
    }
    if let Some((free, _)) = super::filesystem::space(&t.probe_dir) {
        if free < size {
            return not_run(format!(
                "{} free, fewer than the {} pass (see free space)",
                fmt_size_approx(free),
                fmt_size(size)
            ));
        }
    }
    let file = match BenchFile::open(None, Some(&t.probe_dir), false, "doctor") {
        Ok(f) => f,
        Err(e) => return not_run(e.to_string()),
    };
    let mut buffer = match BenchBuffer::new(size.min(MAX_OP) as usize) {
        Ok(b) => b,
        Err(e) => return not_run(e.to_string()),
    };
    let uring = core_api::io_uring_status().is_ok();
    let mut engines = vec![EngineKind::Psync];
    if uring {
        engines.insert(0, EngineKind::Uring);
    }
    let mut out = Vec::new();
    let mut measured = Vec::new();
    for engine in engines {
        match measure(&knobs, engine, &file, &mut buffer, size) {
            Ok(m) => measured.push(m),
            Err(e) => out.push(
                Finding::fail(SECTION, "deepnvme", format!("{} pass failed", engine.name()))
                    .why(e)
                    .fix("see the filesystem and device sections; the error names the file, offset and errno"),
            ),
        }
    }
    let locked = if buffer.locked() { "a locked buffer" } else { "an unlocked buffer (RLIMIT_MEMLOCK)" };
    let what = format!("{} per pass in {}, {knobs_line}, {locked}", fmt_size(size), t.probe_dir.display());
    if !measured.is_empty() {
        out.push(
            Finding::ok(SECTION, "deepnvme", measured.iter().map(line).collect::<Vec<_>>().join("; "))
                .why(format!("{what}; 1 GB = 10^9 B")),
        );
        let best = |f: fn(&Measured) -> f64| measured.iter().map(f).fold(0.0, f64::max);
        out.push(speed(ctx, t, best(|m| m.write.gb_per_s()), best(|m| m.read.gb_per_s())));
    }
    if let [u, p] = &measured[..] {
        let r = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        out.push(Finding::ok(
            SECTION,
            "fallback cost",
            format!(
                "psync against io_uring: write {:.2}x the GB/s at {:.2}x the CPU per GB, read {:.2}x at {:.2}x",
                r(p.write.gb_per_s(), u.write.gb_per_s()),
                r(cpu_per_gb(&p.write), cpu_per_gb(&u.write)),
                r(p.read.gb_per_s(), u.read.gb_per_s()),
                r(cpu_per_gb(&p.read), cpu_per_gb(&u.read))
            ),
        ));
    }

    // fio on the same file, with the same block size and depth.
    let has_fio = Command::new("fio").arg("--version").output().is_ok_and(|o| o.status.success());
    if !has_fio {
        out.push(
            Finding::skip(SECTION, "fio", "not compared: fio is not installed")
                .why("deepnvme's GB/s could not be set beside fio's on the same file")
                .fix("apt-get install -y fio (or dnf install fio) to compare"),
        );
    } else if let (Some(engine), Some(best)) = (fio_engine(uring), measured.first()) {
        match (fio(file.path(), size, ctx, engine, "write"), fio(file.path(), size, ctx, engine, "read")) {
            (Ok((w, wc)), Ok((r, rc))) => {
                let summary =
                    format!("fio {engine}: write {w:.2} GB/s ({wc:.2} CPU s/GB), read {r:.2} GB/s ({rc:.2} CPU s/GB)");
                let why = format!(
                    "the same file, --bs={} --iodepth={} --numjobs={} --direct=1; deepnvme {} reached {:.2}x \
                     (write) and {:.2}x (read)",
                    aio.block_size,
                    aio.queue_depth,
                    aio.intra_op_parallelism,
                    best.engine,
                    best.write.gb_per_s() / w,
                    best.read.gb_per_s() / r
                );
                let slow = best.write.gb_per_s() < SLOW_RATIO * w || best.read.gb_per_s() < SLOW_RATIO * r;
                out.push(if slow {
                    Finding::warn(SECTION, "fio", summary).why(format!("{why}: well under fio")).fix(format!(
                        "sweep the knobs: deepnvme tune --dir {} (and use the aio block it prints)",
                        t.probe_dir.display()
                    ))
                } else {
                    Finding::ok(SECTION, "fio", summary).why(why)
                });
            }
            (Err(e), _) | (_, Err(e)) => out.push(
                Finding::warn(SECTION, "fio", "did not run").why(e).fix("run the fio command by hand to see its error"),
            ),
        }
    }
    drop(file);
    out
}
