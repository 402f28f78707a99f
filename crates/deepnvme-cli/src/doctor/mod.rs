//! `deepnvme doctor`: checks that this machine, the folders DeepSpeed will
//! write to and (with `--config`) a DeepSpeed config are fit for NVMe
//! offload through deepnvme. Every finding says ok, skip, warn or fail,
//! why, and what to do. Exit status: 0 when nothing failed (warnings
//! allowed), 1 when a check failed, 2 when the doctor could not run (bad
//! flags, a config it cannot read or parse, a `--dir` that is not a
//! folder); under `--json` stdout is one JSON document in every case.
//!
//! This file owns the options, the [`Context`] the sections share (the
//! folders to check: every `nvme_path` of the config and each `--dir`), the
//! section table, their order and the output. One concern per sibling module:
//! * `report`: [`report::Finding`] and [`report::Status`], text and JSON output;
//! * `config`: the DeepSpeed config as DeepSpeed reads it, what its swap buffers lock and write;
//! * `ds_rules`: DeepSpeed 0.19.8's rules for `zero_optimization` (the models
//!   as data in `ds_zero_table`);
//! * `aio_rules`: the `aio` block as DeepSpeed's `aio_handle(...)` binding and the handle take it;
//! * `lax`: JSON values as pydantic's lax mode and Python read them (coercions, bounds, truth);
//! * `validation`: the `config` section: DeepSpeed's own validation (`config_probe.py`) or the table;
//! * `buffers`: buffer_size and buffer_count against the model;
//! * `engine`: io_uring allowed or not, and why (sysctl, seccomp, kernel);
//! * `memlock`: RLIMIT_MEMLOCK and CAP_IPC_LOCK against the locked buffers;
//! * `filesystem`: each folder's mount, O_DIRECT, statx alignment, free space;
//! * `stripe`: a stripe set's members (present, writable, O_DIRECT, distinct drives, room);
//! * `device`: the block device: model, transport, rotational, scheduler, nr_requests, cgroup limits;
//! * `cgroup`: the I/O limits cgroups put on this process for a device;
//! * `sharing`: another job's open files or fresh swap files in a folder;
//! * `gds`: libcufile and libcuda, nvidia-fs or P2PDMA, cufile.json, compatibility mode;
//! * `frontend`: which front end DeepSpeed will load and why (runs `frontend_probe.py`);
//! * `bench`: a short deepnvme pass per engine, fio, and GB/s against a floor or the job's needs.

mod aio_rules;
mod bench;
mod buffers;
mod cgroup;
mod config;
mod device;
mod ds_rules;
mod ds_zero_table;
mod engine;
mod filesystem;
mod frontend;
mod gds;
mod lax;
mod memlock;
mod report;
mod sharing;
mod stripe;
mod validation;

use std::cell::OnceCell;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::args::{parse_positive_size_u64, CliError};
use config::{Aio, DsConfig, Model};
use report::{Finding, Status};

/// A section: its name (for `--only`) and its check.
type Section = (&'static str, fn(&Context) -> Vec<Finding>);

/// The sections, in the order they run and print. A new check is a module
/// and a line here.
const SECTIONS: &[Section] = &[
    ("config", validation::check),
    ("buffers", buffers::check),
    ("engine", engine::check),
    ("memlock", memlock::check),
    ("filesystem", filesystem::check),
    ("stripe", stripe::check),
    ("device", device::check),
    ("sharing", sharing::check),
    ("gds", gds::check),
    ("frontend", frontend::check),
    ("bench", bench::check),
];

pub const ABOUT: &str =
    "Check a DeepSpeed config, io_uring, memlock, every nvme_path's file system and device, GDS and the front end";

pub const LONG_ABOUT: &str = "\
Checks what NVMe offload through deepnvme needs on this machine, and says
for each finding ok, skip (not checked here), WARN or FAIL, why, and what to do:

  config      the DeepSpeed config through DeepSpeed's own validation (or its rules)
  buffers     buffer_size and buffer_count against the model (--largest-param, --model-params)
  engine      io_uring allowed (kernel.io_uring_disabled, seccomp), the psync fallback
  memlock     RLIMIT_MEMLOCK against what the config's swap buffers lock
  filesystem  each folder's file system: type, read-only, O_DIRECT, alignment, free space
  stripe      a stripe set's members: present, writable, O_DIRECT, distinct drives, free space
  device      the block device: kind, rotational, scheduler, nr_requests, cgroup I/O limits
  sharing     other jobs' open files or fresh swap files in each folder
  gds         GPUDirect Storage: libcufile, libcuda, nvidia-fs or P2PDMA, cufile.json
  frontend    which front end DeepSpeed loads and why; torch, DeepSpeed, pybind11
  bench       a short deepnvme bench per engine, fio, GB/s against a floor or the job's needs

The folders are every nvme_path in --config and each --dir.
The exit status is 1 when a check failed, 0 when none did (warnings
allowed), 2 when the doctor could not run (bad flags, a config it cannot
read or parse, a --dir that is not a folder). With --json, stdout is one
JSON document in every case.";

pub const AFTER_HELP: &str = "\
Sizes that depend on the model (the optimizer's swap buffers, the swap
files, how many parameter buffers ZeRO-3 holds) are bounds or not checked
unless --model-params and --largest-param describe it.
Example: deepnvme doctor --config ds_config.json --model-params 7B --largest-param 131M
Ranks on other nodes get their limits from PAM there: ssh NODE deepnvme doctor --only memlock --config ds_config.json";

fn parse_section(s: &str) -> Result<&'static str, String> {
    let s = s.trim().to_ascii_lowercase();
    SECTIONS
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n == s)
        .ok_or_else(|| format!("expected one of {}", SECTIONS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")))
}

/// A parameter count: `125000000`, `1.3e9`, `350M`, `7B` (powers of 1000).
fn parse_params(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, scale) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1e3),
        Some('M') => (&t[..t.len() - 1], 1e6),
        Some('B') | Some('G') => (&t[..t.len() - 1], 1e9),
        Some('T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    let v: f64 =
        num.trim().parse().map_err(|_| "expected a parameter count such as 125000000, 350M or 7B".to_string())?;
    let n = v * scale;
    if !(1.0..1e18).contains(&n) {
        return Err("must be a positive count".into());
    }
    Ok(n.round() as u64)
}

/// A positive number of GB/s or seconds.
fn parse_positive_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| "expected a number such as 1.5".to_string())?;
    if !(v.is_finite() && v > 0.0) {
        return Err("must be positive".into());
    }
    Ok(v)
}

/// `deepnvme doctor`'s options.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// A folder to check (repeatable) besides the config's nvme_paths, e.g. FastPersist's checkpoint folder
    /// [default without --config: the current directory]
    #[arg(short, long, value_name = "DIR")]
    dir: Vec<PathBuf>,

    /// DeepSpeed config (JSON) to validate, whose nvme_paths and buffers to check
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// The model's parameter count (125000000, 350M, 7B), for the sizes that depend on it
    #[arg(long, value_name = "N", value_parser = parse_params)]
    model_params: Option<u64>,

    /// Elements of the model's largest parameter (e.g. vocab x hidden for the embedding: 131M), for buffer_size
    #[arg(long, value_name = "N", value_parser = parse_params)]
    largest_param: Option<u64>,

    /// Data-parallel ranks on this machine (they share its memory and nvme_path)
    #[arg(long, value_name = "N", default_value = "1", value_parser = crate::args::parse_count)]
    world_size: usize,

    /// Machines the job runs on, each with --world-size ranks (ZeRO-3 partitions over all of them)
    #[arg(long, value_name = "N", default_value = "1", value_parser = crate::args::parse_count)]
    nodes: usize,

    /// The Python that runs DeepSpeed [default: the Python the `deepnvme` console script runs in, else $VIRTUAL_ENV/bin/python, else python3]
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,

    /// Only these sections (comma-separated): config, buffers, engine, memlock, filesystem, stripe, device, sharing, gds,
    /// frontend, bench
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_section)]
    only: Vec<&'static str>,

    /// Skip the bench section
    #[arg(long)]
    no_bench: bool,

    /// Bytes per bench pass (k, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_positive_size_u64)]
    bench_size: u64,

    /// The GB/s (10^9 B/s) the bench must reach, reads and writes [default: the device kind's floor: 1 for an NVMe
    /// drive, that of the device under a loop device, else none]
    #[arg(long, value_name = "GB/S", value_parser = parse_positive_f64)]
    min_gbps: Option<f64>,

    /// A training step's time budget in seconds: the swaps of one step (needs --model-params) must fit in it
    #[arg(long, value_name = "SECONDS", value_parser = parse_positive_f64)]
    step_time: Option<f64>,

    /// One JSON object on stdout instead of text
    #[arg(long)]
    json: bool,
}

/// A folder DeepSpeed's I/O goes to, and the config keys (or `--dir`) that name it.
#[derive(Clone, Debug)]
pub struct Target {
    /// As given; a relative path is taken from the current directory, as
    /// DeepSpeed takes it from the job's.
    pub path: PathBuf,
    /// `path`, or its nearest existing ancestor when it does not exist yet.
    pub probe_dir: PathBuf,
    pub keys: Vec<String>,
}

impl Target {
    fn new(path: PathBuf, keys: Vec<String>) -> Target {
        let probe_dir = nearest_existing(&path);
        Target { path, probe_dir, keys }
    }
    pub fn key(&self) -> String {
        self.keys.join(", ")
    }
    /// Stamps a finding with the folder and its keys.
    pub fn stamp(&self, mut f: Finding) -> Finding {
        f.path = Some(self.path.display().to_string());
        if f.key.is_none() {
            f.key = Some(self.key());
        }
        f
    }
    /// The device number of the file system holding it.
    pub fn dev(&self) -> Option<u64> {
        std::fs::metadata(&self.probe_dir).ok().map(|m| m.dev())
    }
}

/// What the sections share.
pub struct Context {
    /// The folders to check, config's first.
    pub targets: Vec<Target>,
    pub config: Option<DsConfig>,
    pub model: Model,
    pub bench_size: u64,
    pub min_gbps: Option<f64>,
    pub step_time: Option<f64>,
    sections: Vec<&'static str>,
    python: PathBuf,
    probe: OnceCell<Result<frontend::PythonInfo, String>>,
}

impl Context {
    /// The aio knobs: the config's, else DeepSpeed's `aio` defaults.
    pub fn aio(&self) -> Aio {
        self.config.as_ref().map(|c| c.aio.clone()).unwrap_or_default()
    }

    /// Whether `section` runs in this invocation.
    pub fn runs(&self, section: &str) -> bool {
        self.sections.contains(&section)
    }

    /// The Python probe's report (with the config validated by DeepSpeed
    /// when there is one), run once, when first needed.
    pub fn python_probe(&self) -> &Result<frontend::PythonInfo, String> {
        self.probe.get_or_init(|| frontend::probe(&self.python, self.config.as_ref().map(|c| c.path.as_path())))
    }

    pub fn python(&self) -> Option<&frontend::PythonInfo> {
        self.python_probe().as_ref().ok()
    }

    /// Runs `check` on every folder and stamps its findings with it.
    pub fn per_target(&self, check: impl Fn(&Context, &Target) -> Vec<Finding>) -> Vec<Finding> {
        self.targets.iter().flat_map(|t| check(self, t).into_iter().map(|f| t.stamp(f))).collect()
    }
}

fn nearest_existing(dir: &Path) -> PathBuf {
    let mut p = dir.to_path_buf();
    while !p.is_dir() {
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    p
}

/// Whether the command line asks `doctor` for JSON (for errors clap finds
/// before the options are parsed).
pub fn wants_json(args: impl Iterator<Item = String>) -> bool {
    let args: Vec<String> = args.collect();
    args.iter().any(|a| a == "doctor") && args.iter().any(|a| a == "--json")
}

/// The JSON document of a run that could not start.
pub fn print_json_error(error: &str) {
    if let Ok(text) = serde_json::to_string_pretty(&report::ErrorReport::new(error)) {
        println!("{text}");
    }
}

/// The folders: every nvme_path of the config, then each `--dir` (merged
/// with a config path it names).
fn targets(args: &DoctorArgs, config: Option<&DsConfig>) -> Result<Vec<Target>, String> {
    let mut out: Vec<(PathBuf, Vec<String>)> = config.map(|c| c.paths()).unwrap_or_default();
    let same = |a: &Path, b: &Path| {
        a == b || std::fs::canonicalize(a).ok().is_some_and(|x| std::fs::canonicalize(b).ok() == Some(x))
    };
    for d in &args.dir {
        if d.exists() && !d.is_dir() {
            return Err(format!("--dir {} is not a folder", d.display()));
        }
        match out.iter_mut().find(|(p, _)| same(p, d)) {
            Some((_, keys)) => keys.push("--dir".into()),
            None => out.push((d.clone(), vec!["--dir".into()])),
        }
    }
    if out.is_empty() && config.is_none_or(|c| !c.swaps()) {
        out.push((PathBuf::from("."), vec!["--dir".into()]));
    }
    Ok(out.into_iter().map(|(p, k)| Target::new(p, k)).collect())
}

/// Runs `deepnvme doctor`.
pub fn main(args: DoctorArgs) -> Result<(), CliError> {
    let not_run = |msg: String| {
        if args.json {
            print_json_error(&msg);
        }
        CliError::NotRun(msg)
    };
    let python = args.python.clone().unwrap_or_else(frontend::default_python);
    let config = match &args.config {
        Some(p) => Some(DsConfig::load(p, &python).map_err(not_run)?),
        None => None,
    };
    let targets = targets(&args, config.as_ref()).map_err(not_run)?;
    let mut sections: Vec<&'static str> =
        if args.only.is_empty() { SECTIONS.iter().map(|(n, _)| *n).collect() } else { args.only.clone() };
    // The config and buffers sections read the config: without one they have nothing to say.
    let skipped = |s: &str| (args.no_bench && s == "bench") || (matches!(s, "config" | "buffers") && config.is_none());
    sections.retain(|s| !skipped(s));
    let ctx = Context {
        targets,
        config,
        model: Model {
            params: args.model_params,
            largest: args.largest_param,
            world_size: args.world_size as u64,
            nodes: args.nodes as u64,
        },
        bench_size: args.bench_size,
        min_gbps: args.min_gbps,
        step_time: args.step_time,
        sections: sections.clone(),
        python,
        probe: OnceCell::new(),
    };

    if !args.json {
        let folders: Vec<String> = ctx.targets.iter().map(|t| format!("{} ({})", t.path.display(), t.key())).collect();
        println!("deepnvme doctor {}: {}", env!("CARGO_PKG_VERSION"), folders.join("; "));
        if let Some(c) = &ctx.config {
            println!("config: {}", c.path.display());
        }
        let m = ctx.model;
        if m.params.is_some() || m.largest.is_some() {
            println!(
                "model: {} parameters, the largest {} elements; {} rank(s) per node, {} node(s)",
                m.params.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
                m.largest.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
                m.world_size,
                m.nodes
            );
        }
    }
    let mut findings = Vec::new();
    for (name, check) in SECTIONS.iter().filter(|(n, _)| sections.contains(n)) {
        let found = check(&ctx);
        if !args.json {
            report::print_section(name, &found);
        }
        findings.extend(found);
    }

    let counts = report::counts(&findings);
    let worst = findings.iter().map(|f| f.status).max().unwrap_or(Status::Ok);
    if args.json {
        let dirs: Vec<String> = ctx
            .targets
            .iter()
            .map(|t| std::fs::canonicalize(&t.probe_dir).unwrap_or(t.probe_dir.clone()).display().to_string())
            .collect();
        crate::bench::print_json(&report::Report {
            command: "doctor",
            version: env!("CARGO_PKG_VERSION"),
            dir: dirs.first().cloned().unwrap_or_default(),
            dirs,
            config: ctx.config.as_ref().map(|c| c.path.display().to_string()),
            status: worst,
            counts,
            checks: &findings,
        })?;
    } else {
        println!("\nsummary: {} ok, {} skipped, {} warn, {} fail", counts.ok, counts.skip, counts.warn, counts.fail);
    }
    let failed: Vec<String> =
        findings.iter().filter(|f| f.status == Status::Fail).map(|f| format!("{}/{}", f.section, f.check)).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!("doctor: {} check(s) failed: {}", failed.len(), failed.join(", "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts() {
        assert_eq!(parse_params("125000000"), Ok(125_000_000));
        assert_eq!(parse_params("350M"), Ok(350_000_000));
        assert_eq!(parse_params("7B"), Ok(7_000_000_000));
        assert_eq!(parse_params("1.3b"), Ok(1_300_000_000));
        assert_eq!(parse_params("1e9"), Ok(1_000_000_000));
        assert!(parse_params("0").is_err());
        assert!(parse_params("lots").is_err());
    }

    #[test]
    fn sections() {
        assert_eq!(parse_section("GDS"), Ok("gds"));
        assert!(parse_section("disk").unwrap_err().contains("filesystem"));
    }

    #[test]
    fn missing_directories_are_checked_where_they_would_be_created() {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert_eq!(nearest_existing(&here.join("no/such/dir")), here);
        assert_eq!(nearest_existing(here), here);
    }
}
