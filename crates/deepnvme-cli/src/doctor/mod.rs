//! `deepnvme doctor`: checks that this machine, a directory and (with
//! `--config`) a DeepSpeed config are fit for NVMe offload through
//! deepnvme. Every finding says ok, warn or fail, why, and what to do; the
//! exit status is 1 when any check fails.
//!
//! This file owns the options, the [`Context`] the sections share, their
//! order and the output. One concern per sibling module:
//! * `report`: [`report::Finding`] and [`report::Status`], text and JSON output;
//! * `config`: the DeepSpeed config, and what its swap buffers lock and write;
//! * `engine`: io_uring allowed or not, and why (sysctl, seccomp, kernel);
//! * `memlock`: RLIMIT_MEMLOCK and CAP_IPC_LOCK against the locked buffers;
//! * `filesystem`: the directory's mount, O_DIRECT, statx alignment, free space;
//! * `device`: the block device: model, transport, rotational, scheduler, nr_requests;
//! * `gds`: libcufile and libcuda, nvidia-fs or P2PDMA, cufile.json, compatibility mode;
//! * `frontend`: which front end DeepSpeed will load and why (runs `frontend_probe.py`);
//! * `bench`: a short deepnvme pass per engine, and fio, on one file.

mod bench;
mod config;
mod device;
mod engine;
mod filesystem;
mod frontend;
mod gds;
mod memlock;
mod report;

use std::cell::OnceCell;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::args::{parse_positive_size_u64, CliError};
use config::{Aio, DsConfig, Model};
use report::{Finding, Status};

pub const ABOUT: &str =
    "Check io_uring, memlock, the file system, the device, GDS and the Python front end for NVMe offload";

pub const LONG_ABOUT: &str = "\
Checks what NVMe offload through deepnvme needs on this machine, and says
for each finding ok, WARN or FAIL, why, and what to do:

  config      the DeepSpeed config's aio and offload blocks (with --config)
  engine      io_uring allowed (kernel.io_uring_disabled, seccomp), the psync fallback
  memlock     RLIMIT_MEMLOCK against what the config's swap buffers lock
  filesystem  the directory's file system: type, O_DIRECT, statx alignment, free space
  device      the block device: model, transport, rotational, scheduler, nr_requests
  gds         GPUDirect Storage: libcufile, libcuda, nvidia-fs or P2PDMA, cufile.json
  frontend    which front end DeepSpeed loads and why; torch, DeepSpeed, pybind11
  bench       a short deepnvme bench per engine, and fio, on the same file

The exit status is 1 when any check fails, 0 otherwise (warnings included).";

pub const AFTER_HELP: &str = "\
Sizes that depend on the model (the optimizer's swap buffers, the swap
files) are bounds unless --model-params gives the parameter count.
Example: deepnvme doctor --config ds_config.json --model-params 7B";

/// The sections, in the order they run and print.
const SECTIONS: [&str; 8] = ["config", "engine", "memlock", "filesystem", "device", "gds", "frontend", "bench"];

fn parse_section(s: &str) -> Result<&'static str, String> {
    let s = s.trim().to_ascii_lowercase();
    SECTIONS.iter().copied().find(|n| *n == s).ok_or_else(|| format!("expected one of {}", SECTIONS.join(", ")))
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

/// `deepnvme doctor`'s options.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Directory to check [default: the config's nvme_path, else the current directory]
    #[arg(short, long, value_name = "DIR")]
    dir: Option<PathBuf>,

    /// DeepSpeed config (JSON) whose aio block and NVMe offload to check
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// The model's parameter count (125000000, 350M, 7B), for the sizes that depend on it
    #[arg(long, value_name = "N", value_parser = parse_params)]
    model_params: Option<u64>,

    /// Data-parallel ranks on this machine (they share its memory and nvme_path)
    #[arg(long, value_name = "N", default_value = "1", value_parser = crate::args::parse_count)]
    world_size: usize,

    /// The Python that runs DeepSpeed [default: $VIRTUAL_ENV/bin/python, else python3]
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,

    /// Only these sections (comma-separated): config, engine, memlock, filesystem, device, gds, frontend, bench
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_section)]
    only: Vec<&'static str>,

    /// Skip the bench section
    #[arg(long)]
    no_bench: bool,

    /// Bytes per bench pass (k, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_positive_size_u64)]
    bench_size: u64,

    /// One JSON object on stdout instead of text
    #[arg(long)]
    json: bool,
}

/// What the sections share.
pub struct Context {
    /// The directory asked about.
    pub dir: PathBuf,
    /// `dir`, or its nearest existing ancestor when it does not exist yet.
    pub probe_dir: PathBuf,
    pub config: Option<DsConfig>,
    pub model: Option<Model>,
    pub bench_size: u64,
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

    /// The Python probe's report, run once, when first needed.
    pub fn python_probe(&self) -> &Result<frontend::PythonInfo, String> {
        self.probe.get_or_init(|| frontend::probe(&self.python))
    }

    pub fn python(&self) -> Option<&frontend::PythonInfo> {
        self.python_probe().as_ref().ok()
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

/// The `config` section: what the config asks for, and what DeepSpeed
/// will not do as written.
fn config_findings(cfg: &DsConfig) -> Vec<Finding> {
    let offload = |name: &str, o: &Option<config::NvmeOffload>| match o {
        Some(o) => format!(
            "{name} to {} ({} buffers{})",
            o.nvme_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "?".into()),
            o.buffer_count,
            if name == "parameters" { format!(" of {} elements", o.buffer_size) } else { String::new() }
        ),
        None => format!("{name} not to NVMe"),
    };
    let a = &cfg.aio;
    let mut out = vec![Finding::ok(
        "config",
        "offload",
        format!(
            "ZeRO stage {}: {}; {}",
            cfg.stage.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
            offload("parameters", &cfg.param),
            offload("optimizer state", &cfg.optimizer)
        ),
    )
    .why(format!(
        "aio{}: block_size {}, queue_depth {}, intra_op_parallelism {}, single_submit {}, overlap_events {}, \
         use_gds {}; \
         model dtype {}",
        if cfg.aio_given { "" } else { " (no block: DeepSpeed's defaults)" },
        a.block_size,
        a.queue_depth,
        a.intra_op_parallelism,
        a.single_submit,
        a.overlap_events,
        a.use_gds,
        cfg.model_dtype
    ))];
    if !cfg.swaps() {
        out[0].status = Status::Warn;
        out[0] = out[0].clone().why("nothing goes to NVMe: no offload_param or offload_optimizer has device nvme");
    }
    for note in &cfg.notes {
        out.push(Finding::warn("config", "config", note.clone()).fix(format!("edit {}", cfg.path.display())));
    }
    out
}

/// Runs `deepnvme doctor`.
pub fn main(args: DoctorArgs) -> Result<(), CliError> {
    let config = match &args.config {
        Some(p) => Some(DsConfig::load(p).map_err(CliError::Failed)?),
        None => None,
    };
    let dir = args
        .dir
        .clone()
        .or_else(|| config.as_ref().and_then(|c| c.nvme_path().map(Path::to_path_buf)))
        .unwrap_or_else(|| PathBuf::from("."));
    if dir.exists() && !dir.is_dir() {
        return Err(CliError::Failed(format!("{} is not a directory", dir.display())));
    }
    let probe_dir = nearest_existing(&dir);
    let mut sections: Vec<&'static str> = if args.only.is_empty() { SECTIONS.to_vec() } else { args.only.clone() };
    let skipped = |s: &str| (args.no_bench && s == "bench") || (s == "config" && config.is_none());
    sections.retain(|s| !skipped(s));
    let ctx = Context {
        dir: dir.clone(),
        probe_dir,
        config,
        model: args.model_params.map(|params| Model { params, world_size: args.world_size as u64 }),
        bench_size: args.bench_size,
        sections: sections.clone(),
        python: args.python.clone().unwrap_or_else(frontend::default_python),
        probe: OnceCell::new(),
    };

    let shown = std::fs::canonicalize(&ctx.probe_dir).unwrap_or(ctx.probe_dir.clone());
    if !args.json {
        println!("deepnvme doctor {}: {}", env!("CARGO_PKG_VERSION"), dir.display());
        if let Some(c) = &ctx.config {
            println!("config: {}", c.path.display());
        }
        if let Some(m) = ctx.model {
            println!("model: {} parameters, {} rank(s)", m.params, m.world_size);
        }
    }
    let mut findings = Vec::new();
    for section in SECTIONS.iter().filter(|s| sections.contains(s)) {
        let found = match *section {
            "config" => config_findings(ctx.config.as_ref().expect("config runs only with --config")),
            "engine" => engine::check(&ctx),
            "memlock" => memlock::check(&ctx),
            "filesystem" => filesystem::check(&ctx),
            "device" => device::check(&ctx),
            "gds" => gds::check(&ctx),
            "frontend" => frontend::check(&ctx),
            "bench" => bench::check(&ctx),
            _ => unreachable!("SECTIONS lists every section"),
        };
        if !args.json {
            report::print_section(section, &found);
        }
        findings.extend(found);
    }

    let counts = report::counts(&findings);
    let worst = findings.iter().map(|f| f.status).max().unwrap_or(Status::Ok);
    if args.json {
        crate::bench::print_json(&report::Report {
            command: "doctor",
            version: env!("CARGO_PKG_VERSION"),
            dir: shown.display().to_string(),
            config: ctx.config.as_ref().map(|c| c.path.display().to_string()),
            status: worst,
            counts,
            checks: &findings,
        })?;
    } else {
        println!("\nsummary: {} ok, {} warn, {} fail", counts.ok, counts.warn, counts.fail);
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
