//! `deepnvme bench`: writes and then reads a file with one set of handle
//! knobs, and reports GB/s and CPU seconds per GB for each direction, as a
//! table or (`--json`) as one JSON object on stdout.

use std::path::Path;

use clap::Args;
use serde::Serialize;

use crate::args::{fmt_size, fmt_size_short, parse_bool, parse_count, parse_positive_size, CliError, Common, KNOBS, MOVE};
use crate::core_api::Direction;
use crate::progress::{Progress, ProgressMode};
use crate::runner::{self, BenchFile, BenchBuffer, AioConfig, Summary, GB};

pub const DEFAULT_SIZE: u64 = 1 << 30;
pub const DEFAULT_BUFFER: usize = 256 << 20;

pub const ABOUT: &str = "Write then read a file with O_DIRECT and locked buffers; report GB/s and CPU seconds per GB";

pub const LONG_ABOUT: &str = "\
Writes and then reads a file with O_DIRECT through a DeepNVMe handle and
locked buffers, and reports GB/s (1 GB = 10^9 bytes) and CPU seconds per GB
(user + system time of the whole process) for each direction. The transfer
is cut into ops of --buffer-size submitted at increasing offsets.

Default: a 1 GiB temp file in the current directory, removed afterwards.
Handle knobs default to DeepSpeed's aio_handle() defaults.";

pub const AFTER_HELP: &str = "\
Note: the ZeRO-Infinity \"aio\" config section has other defaults
(queue_depth 8, overlap_events true); pass them to measure those.

SIZE takes a suffix k, M, G or T (powers of 1024): 4k, 1M, 1.5G.";

/// `deepnvme bench`'s options. The shared ones are in [`Common`]; this
/// command gives `--size` its own default and `--read-only` a rule.
#[derive(Args, Debug)]
#[command(mut_arg("size", |a| a.help("Bytes per pass [default: 1G; with --read-only on an existing --file: the file's size]")))]
pub struct BenchArgs {
    /// Bytes per I/O request [default: 1M]
    #[arg(short, long, value_name = "SIZE", value_parser = parse_positive_size, help_heading = KNOBS)]
    block_size: Option<usize>,

    /// Requests in flight per worker [default: 128]
    #[arg(long, value_name = "N", value_parser = parse_count, help_heading = KNOBS)]
    queue_depth: Option<usize>,

    /// One submit syscall per request [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_bool, overrides_with = "no_single_submit", help_heading = KNOBS)]
    single_submit: Option<bool>,

    /// Keep the queue topped up [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_bool, overrides_with = "no_overlap_events", help_heading = KNOBS)]
    overlap_events: Option<bool>,

    /// intra_op_parallelism: worker threads per handle [default: 1]
    #[arg(short, long, visible_alias = "intra-op-parallelism", value_name = "N", value_parser = parse_count,
          help_heading = KNOBS)]
    parallelism: Option<usize>,

    /// --single-submit=false
    #[arg(long, overrides_with = "single_submit", help_heading = KNOBS)]
    no_single_submit: bool,

    /// --overlap-events=false
    #[arg(long, overrides_with = "overlap_events", help_heading = KNOBS)]
    no_overlap_events: bool,

    #[command(flatten)]
    common: Common,

    /// Time the first write into the new, empty file (includes block allocation); by default a file
    /// shorter than --size is first written once, untimed, so timed writes overwrite
    #[arg(long, conflicts_with = "read_only", help_heading = MOVE)]
    no_prepare: bool,
}

impl BenchArgs {
    /// The knobs: DeepSpeed's handle defaults, overridden by the flags.
    fn knobs(&self) -> AioConfig {
        let d = AioConfig::deepspeed_handle_defaults();
        AioConfig {
            block_size: self.block_size.unwrap_or(d.block_size),
            queue_depth: self.queue_depth.unwrap_or(d.queue_depth),
            single_submit: !self.no_single_submit && self.single_submit.unwrap_or(d.single_submit),
            overlap_events: !self.no_overlap_events && self.overlap_events.unwrap_or(d.overlap_events),
            parallelism: self.parallelism.unwrap_or(d.parallelism),
        }
    }
}

/// Runs `deepnvme bench`.
pub fn main(args: BenchArgs) -> Result<(), CliError> {
    let knobs = args.knobs();
    let BenchArgs { common, no_prepare, .. } = args;
    knobs.check(common.engine).map_err(|m| CliError::usage("bench", m))?;
    runner::install_interrupt_handler();

    let file = BenchFile::open(common.file.as_deref(), common.dir.as_deref(), common.keep, "bench")?;
    let size = match common.size {
        Some(s) => s,
        None if common.read_only && file.existed() && file.len() > 0 => file.len(),
        None => DEFAULT_SIZE,
    };
    let op_bytes = common.buffer_size.unwrap_or(DEFAULT_BUFFER).min(usize::try_from(size).unwrap_or(usize::MAX));
    runner::check_split(size, op_bytes as u64, knobs.parallelism).map_err(|m| CliError::usage("bench", m))?;
    let short = file.len() < size;
    if common.read_only && short && file.existed() {
        return Err(CliError::Failed(format!(
            "{} holds {} bytes, fewer than the {} to read (--size)",
            file.path().display(),
            file.len(),
            size
        )));
    }
    // A file shorter than a pass is written once, untimed, first: reads
    // need data, and timed writes then overwrite allocated blocks (as NVMe
    // offload does in steady state, and as fio does on an existing file).
    let must_prepare = short && (common.read_only || !no_prepare);
    if common.do_write() || must_prepare {
        file.check_space(size)?;
    }

    let mut buffer = BenchBuffer::new(op_bytes)?;
    if let Some(why) = buffer.lock_error() {
        crate::progress::info(&format!(
            "could not lock the {} buffer ({why}); benchmarking with unlocked page-aligned memory, \
             which O_DIRECT still reads and writes directly",
            fmt_size(op_bytes as u64)
        ));
    }
    let handle = knobs.open_handle(common.engine)?;
    let engine = handle.engine_kind().name();
    let mode = ProgressMode::detect(common.quiet, common.progress);

    if !common.json {
        print_header(&knobs, engine, &file, size, &buffer);
        if must_prepare {
            println!("file: shorter than a pass, so written once first (untimed)");
        }
    }
    if must_prepare {
        let mut progress = Progress::new(mode, "preparing (write)");
        runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Write, &mut progress)?;
        file.warn_if_sparse(size);
    }

    let mut writes = Summary { passes: Vec::new() };
    let mut reads = Summary { passes: Vec::new() };
    for round in 0..common.loops {
        let tag = if common.loops > 1 { format!(" {}/{}", round + 1, common.loops) } else { String::new() };
        if common.do_write() {
            let mut progress = Progress::new(mode, format!("write{tag}"));
            writes.passes.push(runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Write, &mut progress)?);
            if round == 0 {
                file.warn_if_sparse(size);
            }
        }
        if common.do_read() {
            let mut progress = Progress::new(mode, format!("read{tag}"));
            reads.passes.push(runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Read, &mut progress)?);
        }
    }
    drop(handle);

    if common.json {
        print_json(&BenchReport {
            command: "bench",
            version: env!("CARGO_PKG_VERSION"),
            engine,
            file: path_str(file.path()),
            file_removed: file.removed_after(),
            size_bytes: size,
            buffer_bytes: buffer.len(),
            buffer_locked: buffer.locked(),
            loops: common.loops,
            gb_bytes: GB as u64,
            knobs: AioConfigJson::from(&knobs),
            write: summary_json(&writes),
            read: summary_json(&reads),
        })?;
    } else {
        print_table(&writes, &reads, common.loops);
        if !file.removed_after() && !file.existed() {
            println!("kept {}", file.path().display());
        }
    }
    Ok(())
}

pub fn knobs_line(k: &AioConfig) -> String {
    format!(
        "block_size {}, queue_depth {}, single_submit {}, overlap_events {}, intra_op_parallelism {}",
        fmt_size_short(k.block_size as u64),
        k.queue_depth,
        k.single_submit,
        k.overlap_events,
        k.parallelism
    )
}

fn print_header(k: &AioConfig, engine: &str, file: &BenchFile, size: u64, buffer: &BenchBuffer) {
    let fate = if file.removed_after() { "removed afterwards" } else { "kept" };
    println!("deepnvme bench: {} per pass, file {} ({fate})", fmt_size(size), file.path().display());
    println!("handle: engine {engine}, {}", knobs_line(k));
    println!(
        "buffer: {} per op, {}",
        fmt_size(buffer.len() as u64),
        if buffer.locked() { "locked (pinned memory manager)" } else { "NOT locked (RLIMIT_MEMLOCK too low)" }
    );
}

fn print_table(writes: &Summary, reads: &Summary, loops: usize) {
    println!();
    println!("{:<6} {:>10} {:>10} {:>10} {:>6}", "op", "GB/s best", "GB/s mean", "CPU s/GB", "loops");
    for (name, s) in [("write", writes), ("read", reads)] {
        if s.passes.is_empty() {
            continue;
        }
        println!(
            "{:<6} {:>10.3} {:>10.3} {:>10.3} {:>6}",
            name,
            s.best_gb_per_s(),
            s.mean_gb_per_s(),
            s.cpu_per_gb(),
            loops
        );
    }
    println!("(1 GB = 10^9 bytes; CPU = user + system time of all threads)");
}

/// `bench --json`: field names and order are the tool's output format.
#[derive(Serialize)]
struct BenchReport<'a> {
    command: &'static str,
    version: &'static str,
    engine: &'a str,
    file: String,
    file_removed: bool,
    size_bytes: u64,
    buffer_bytes: usize,
    buffer_locked: bool,
    loops: usize,
    gb_bytes: u64,
    knobs: AioConfigJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    write: Option<SummaryJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read: Option<SummaryJson>,
}

/// The knobs of a measurement, as `bench --json` and `tune --json` name them.
#[derive(Serialize)]
pub struct AioConfigJson {
    block_size: usize,
    queue_depth: usize,
    single_submit: bool,
    overlap_events: bool,
    intra_op_parallelism: usize,
}

impl From<&AioConfig> for AioConfigJson {
    fn from(k: &AioConfig) -> AioConfigJson {
        AioConfigJson {
            block_size: k.block_size,
            queue_depth: k.queue_depth,
            single_submit: k.single_submit,
            overlap_events: k.overlap_events,
            intra_op_parallelism: k.parallelism,
        }
    }
}

/// One direction's passes: best and mean GB/s, CPU s/GB, and each pass's
/// wall and CPU seconds. Non-finite numbers are written as `null`.
#[derive(Serialize)]
pub struct SummaryJson {
    gb_per_s_best: f64,
    gb_per_s_mean: f64,
    cpu_s_per_gb: f64,
    seconds: Vec<f64>,
    cpu_seconds: Vec<f64>,
}

impl From<&Summary> for SummaryJson {
    fn from(s: &Summary) -> SummaryJson {
        SummaryJson {
            gb_per_s_best: rounded(s.best_gb_per_s(), 4),
            gb_per_s_mean: rounded(s.mean_gb_per_s(), 4),
            cpu_s_per_gb: rounded(s.cpu_per_gb(), 4),
            seconds: s.passes.iter().map(|p| rounded(p.secs, 6)).collect(),
            cpu_seconds: s.passes.iter().map(|p| rounded(p.cpu_secs, 6)).collect(),
        }
    }
}

/// `v` rounded to `decimals` places, for readable output.
pub fn rounded(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// Prints `value` as indented JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| CliError::Failed(format!("writing JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

fn summary_json(s: &Summary) -> Option<SummaryJson> {
    (!s.passes.is_empty()).then(|| SummaryJson::from(s))
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}
