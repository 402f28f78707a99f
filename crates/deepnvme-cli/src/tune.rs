//! `deepnvme tune`: sweeps block size, queue depth, intra_op_parallelism,
//! single_submit and overlap_events over one file, ranks the points, and
//! prints the best configuration as a DeepSpeed `"aio": {...}` config block,
//! choosing it as DeepSpeed's `ds_nvme_tune` does (highest read + write GB/s).

use clap::Args;
use serde::Serialize;

use crate::args::{dedup, fmt_size, fmt_size_short, parse_choice, parse_count, parse_positive_size, Choice, CliError, Common};
use crate::bench::{knobs_line, path_str, print_json, rounded, AioConfigJson, SummaryJson};
use crate::core_api::Direction;
use crate::progress::{Progress, ProgressMode};
use crate::runner::{self, BenchFile, BenchBuffer, AioConfig, Summary};

pub const DEFAULT_SIZE: u64 = 256 << 20;
const DEFAULT_BLOCKS: [usize; 4] = [128 << 10, 256 << 10, 1 << 20, 4 << 20];
const DEFAULT_DEPTHS: [usize; 3] = [8, 32, 128];
const DEFAULT_PARALLELISM: [usize; 4] = [1, 2, 4, 8];

const GRIDS: &str = "Grids (comma-separated lists)";

pub const ABOUT: &str = "Sweep the handle knobs; print a ranked table and the best DeepSpeed \"aio\" config block";

pub const LONG_ABOUT: &str = "\
Measures every combination of the handle knobs below on one file (write,
then read, per point), prints the points ranked by read + write GB/s, the
best for each direction, and the best overall as a DeepSpeed \"aio\" config
block (the criterion of DeepSpeed's ds_nvme_tune).";

pub const AFTER_HELP: &str = "\
SIZE takes a suffix k, M, G or T (powers of 1024): 4k, 1M, 1.5G.
A quick sweep: deepnvme tune --size 64M --block-size 1M --queue-depth 8,32";

/// `deepnvme tune`'s options: the grid, the shared options (with this
/// command's defaults and meanings) and the table's length.
#[derive(Args, Debug)]
#[command(
    mut_arg("size", |a| a.help("Bytes per pass [default: 256M]")),
    mut_arg("buffer_size", |a| a.help("Bytes per op [default: 256M, or --size when smaller]")),
    mut_arg("file", |a| a.help("Use this file: an existing one is never removed; a new one is unless --keep")),
    mut_arg("engine", |a| a.help("Transfer engine [default: the process default]").help_heading(GRIDS)),
    mut_arg("loops", |a| a.help("Measure each point N times, keep the best")),
    mut_arg("read_only", |a| a.help("Rank by read GB/s only")),
    mut_arg("write_only", |a| a.help("Rank by write GB/s only")),
    mut_arg("json", |a| a.help("One JSON object on stdout instead of text")),
)]
pub struct TuneArgs {
    /// Bytes per I/O request [default: 128K,256K,1M,4M]
    #[arg(short, long, alias = "block-sizes", value_name = "LIST", value_delimiter = ',',
          value_parser = parse_positive_size, help_heading = GRIDS)]
    block_size: Vec<usize>,

    /// Requests in flight per worker [default: 8,32,128]
    #[arg(long, alias = "queue-depths", value_name = "LIST", value_delimiter = ',', value_parser = parse_count,
          help_heading = GRIDS)]
    queue_depth: Vec<usize>,

    /// intra_op_parallelism: workers [default: 1,2,4,8, capped at twice the CPU count]
    #[arg(short, long, visible_alias = "intra-op-parallelism", value_name = "LIST", value_delimiter = ',',
          value_parser = parse_count, help_heading = GRIDS)]
    parallelism: Vec<usize>,

    /// One submit syscall per request: true, false or both [default: both]
    #[arg(long, value_name = "CHOICE", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_choice, overrides_with = "no_single_submit", help_heading = GRIDS)]
    single_submit: Option<Choice>,

    /// Keep the queue topped up: true, false or both [default: both]
    #[arg(long, value_name = "CHOICE", num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = parse_choice, overrides_with = "no_overlap_events", help_heading = GRIDS)]
    overlap_events: Option<Choice>,

    /// --single-submit=false
    #[arg(long, overrides_with = "single_submit", help_heading = GRIDS)]
    no_single_submit: bool,

    /// --overlap-events=false
    #[arg(long, overrides_with = "overlap_events", help_heading = GRIDS)]
    no_overlap_events: bool,

    #[command(flatten)]
    common: Common,

    /// Rows of the ranked table, 0 = all
    #[arg(long, value_name = "N", default_value = "10", help_heading = crate::args::OUTPUT)]
    top: usize,
}

struct Grid {
    blocks: Vec<usize>,
    depths: Vec<usize>,
    parallelism: Vec<usize>,
    single_submit: Vec<bool>,
    overlap_events: Vec<bool>,
}

impl Grid {
    /// The flags' lists (repeats dropped), else the defaults.
    fn from_args(a: &TuneArgs) -> Grid {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let or = |v: &Vec<usize>, d: Vec<usize>| if v.is_empty() { d } else { dedup(v.clone()) };
        let choice = |no: bool, c: Option<Choice>| if no { vec![false] } else { c.unwrap_or(Choice::Both).values() };
        Grid {
            blocks: or(&a.block_size, DEFAULT_BLOCKS.to_vec()),
            depths: or(&a.queue_depth, DEFAULT_DEPTHS.to_vec()),
            parallelism: or(
                &a.parallelism,
                DEFAULT_PARALLELISM.iter().copied().filter(|&p| p == 1 || p <= 2 * cpus).collect(),
            ),
            single_submit: choice(a.no_single_submit, a.single_submit),
            overlap_events: choice(a.no_overlap_events, a.overlap_events),
        }
    }

    fn points(&self) -> Vec<AioConfig> {
        let mut out = Vec::new();
        for &block_size in &self.blocks {
            for &queue_depth in &self.depths {
                for &parallelism in &self.parallelism {
                    for &single_submit in &self.single_submit {
                        for &overlap_events in &self.overlap_events {
                            out.push(AioConfig { block_size, queue_depth, single_submit, overlap_events, parallelism });
                        }
                    }
                }
            }
        }
        out
    }
}

/// One measured point: best pass of each direction.
struct Point {
    knobs: AioConfig,
    write: Option<Summary>,
    read: Option<Summary>,
}

impl Point {
    fn write_gbps(&self) -> f64 {
        self.write.as_ref().map_or(0.0, Summary::best_gb_per_s)
    }
    fn read_gbps(&self) -> f64 {
        self.read.as_ref().map_or(0.0, Summary::best_gb_per_s)
    }
    /// ds_nvme_tune's criterion: read + write GB/s (one direction when only
    /// one is measured).
    fn score(&self) -> f64 {
        self.read_gbps() + self.write_gbps()
    }
}

/// Runs `deepnvme tune`.
pub fn main(args: TuneArgs) -> Result<(), CliError> {
    let grid = Grid::from_args(&args);
    let TuneArgs { common, top, .. } = args;
    for k in grid.points() {
        k.check(common.engine).map_err(|m| CliError::usage("tune", m))?;
    }
    runner::install_interrupt_handler();
    let size = common.size.unwrap_or(DEFAULT_SIZE);
    let op_bytes = common.buffer_size.unwrap_or(crate::bench::DEFAULT_BUFFER).min(usize::try_from(size).unwrap_or(usize::MAX));
    for &p in &grid.parallelism {
        runner::check_split(size, op_bytes as u64, p).map_err(|m| CliError::usage("tune", m))?;
    }
    let points = grid.points();
    let file = BenchFile::open(common.file.as_deref(), common.dir.as_deref(), common.keep, "tune")?;
    if file.existed() && file.len() < size && !common.do_write() {
        return Err(CliError::Failed(format!(
            "{} holds {} bytes, fewer than the {} to read (--size)",
            file.path().display(),
            file.len(),
            size
        )));
    }
    file.check_space(size)?;
    let mut buffer = BenchBuffer::new(op_bytes)?;
    if let Some(why) = buffer.lock_error() {
        crate::progress::info(&format!(
            "could not lock the {} buffer ({why}); tuning with unlocked page-aligned memory",
            fmt_size(op_bytes as u64)
        ));
    }
    let mode = ProgressMode::detect(common.quiet, common.progress);

    // Write the whole file once, untimed, so that no point pays for block
    // allocation and every read finds data.
    let defaults = AioConfig::deepspeed_handle_defaults();
    let engine = {
        let handle = defaults.open_handle(common.engine)?;
        if file.len() < size {
            let mut progress = Progress::new(mode, "preparing (write)");
            runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Write, &mut progress)?;
        }
        file.warn_if_sparse(size);
        handle.engine_kind().name()
    };

    if !common.json {
        let fate = if file.removed_after() { "removed afterwards" } else { "kept" };
        println!(
            "deepnvme tune: {} points, {} per pass in ops of {}, engine {engine}, file {} ({fate})",
            points.len(),
            fmt_size(size),
            fmt_size(op_bytes as u64),
            file.path().display()
        );
    }

    let mut results: Vec<Point> = Vec::with_capacity(points.len());
    let width = points.len().to_string().len();
    for (i, knobs) in points.iter().enumerate() {
        let handle = knobs.open_handle(common.engine)?;
        let mut point = Point { knobs: *knobs, write: None, read: None };
        let label = format!("[{:>width$}/{}]", i + 1, points.len());
        for _ in 0..common.loops {
            if common.do_write() {
                let mut progress = Progress::new(mode, format!("{label} write"));
                let pass = runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Write, &mut progress)?;
                point.write.get_or_insert_with(|| Summary { passes: Vec::new() }).passes.push(pass);
            }
            if common.do_read() {
                let mut progress = Progress::new(mode, format!("{label} read"));
                let pass = runner::run_pass(&handle, &mut buffer, file.path(), size, Direction::Read, &mut progress)?;
                point.read.get_or_insert_with(|| Summary { passes: Vec::new() }).passes.push(pass);
            }
        }
        drop(handle);
        if !common.json {
            println!("{label} {}", point_cells(&point));
        }
        results.push(point);
    }

    // Rank: stable sort keeps grid order among equal scores.
    let mut ranked: Vec<&Point> = results.iter().collect();
    ranked.sort_by(|a, b| b.score().total_cmp(&a.score()));
    let best_read = results.iter().filter(|p| p.read.is_some()).max_by(|a, b| a.read_gbps().total_cmp(&b.read_gbps()));
    let best_write =
        results.iter().filter(|p| p.write.is_some()).max_by(|a, b| a.write_gbps().total_cmp(&b.write_gbps()));
    let Some(best) = ranked.first().copied() else {
        return Err(CliError::Failed("the sweep measured nothing".into()));
    };

    if common.json {
        return print_json(&TuneReport {
            command: "tune",
            version: env!("CARGO_PKG_VERSION"),
            engine,
            file: path_str(file.path()),
            file_removed: file.removed_after(),
            size_bytes: size,
            buffer_bytes: buffer.len(),
            buffer_locked: buffer.locked(),
            loops: common.loops,
            criterion: criterion(&common),
            points: ranked.iter().map(|p| PointJson::from(*p)).collect(),
            best_read: best_read.map(PointJson::from),
            best_write: best_write.map(PointJson::from),
            best_overall: PointJson::from(best),
            aio: AioBlock::from(&best.knobs),
        });
    }

    let shown = if top == 0 { ranked.len() } else { top.min(ranked.len()) };
    println!();
    println!("Top {shown} of {} by {} (GB = 10^9 bytes; best of {} loop(s)):", ranked.len(), criterion(&common), common.loops);
    println!(
        "{:>4} {:>6} {:>5} {:>4} {:>7} {:>8} {:>10} {:>10} {:>8}",
        "rank", "block", "qd", "par", "single", "overlap", "read GB/s", "write GB/s", "sum"
    );
    for (i, p) in ranked.iter().take(shown).enumerate() {
        let k = &p.knobs;
        println!(
            "{:>4} {:>6} {:>5} {:>4} {:>7} {:>8} {:>10} {:>10} {:>8.3}",
            i + 1,
            fmt_size_short(k.block_size as u64),
            k.queue_depth,
            k.parallelism,
            k.single_submit,
            k.overlap_events,
            rate_cell(p.read.as_ref()),
            rate_cell(p.write.as_ref()),
            p.score()
        );
    }
    println!();
    if let Some(p) = best_read {
        println!("Best read:  {:.3} GB/s with {}", p.read_gbps(), knobs_line(&p.knobs));
    }
    if let Some(p) = best_write {
        println!("Best write: {:.3} GB/s with {}", p.write_gbps(), knobs_line(&p.knobs));
    }
    println!(
        "Best overall ({}): read = {}, write = {} GB/s",
        criterion(&common),
        rate_cell(best.read.as_ref()),
        rate_cell(best.write.as_ref())
    );
    println!("DeepSpeed config:");
    print_json(&DeepSpeedConfig { aio: AioBlock::from(&best.knobs) })?;
    Ok(())
}

fn criterion(common: &Common) -> &'static str {
    match (common.do_read(), common.do_write()) {
        (true, true) => "read + write GB/s",
        (true, false) => "read GB/s",
        _ => "write GB/s",
    }
}

fn rate_cell(s: Option<&Summary>) -> String {
    s.map_or_else(|| "-".to_string(), |s| format!("{:.3}", s.best_gb_per_s()))
}

fn point_cells(p: &Point) -> String {
    let k = &p.knobs;
    let mut s = format!(
        "block {:>5} qd {:>4} par {:>2} single_submit {:<5} overlap_events {:<5}",
        fmt_size_short(k.block_size as u64),
        k.queue_depth,
        k.parallelism,
        k.single_submit,
        k.overlap_events
    );
    if p.write.is_some() {
        s.push_str(&format!("  write {:>7}", rate_cell(p.write.as_ref())));
    }
    if p.read.is_some() {
        s.push_str(&format!("  read {:>7}", rate_cell(p.read.as_ref())));
    }
    s
}

/// `tune --json`: field names and order are the tool's output format.
#[derive(Serialize)]
struct TuneReport<'a> {
    command: &'static str,
    version: &'static str,
    engine: &'a str,
    file: String,
    file_removed: bool,
    size_bytes: u64,
    buffer_bytes: usize,
    buffer_locked: bool,
    loops: usize,
    criterion: &'static str,
    /// Ranked, best first.
    points: Vec<PointJson>,
    best_read: Option<PointJson>,
    best_write: Option<PointJson>,
    best_overall: PointJson,
    aio: AioBlock,
}

#[derive(Serialize)]
struct PointJson {
    knobs: AioConfigJson,
    score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    write: Option<SummaryJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read: Option<SummaryJson>,
}

impl From<&Point> for PointJson {
    fn from(p: &Point) -> PointJson {
        PointJson {
            knobs: AioConfigJson::from(&p.knobs),
            score: rounded(p.score(), 4),
            write: p.write.as_ref().map(SummaryJson::from),
            read: p.read.as_ref().map(SummaryJson::from),
        }
    }
}

/// `{"aio": {...}}`, the section of a DeepSpeed config.
#[derive(Serialize)]
struct DeepSpeedConfig {
    aio: AioBlock,
}

/// The DeepSpeed `"aio"` section for these knobs (its key names and order;
/// booleans as JSON booleans, which DeepSpeed's config parser expects).
#[derive(Serialize)]
struct AioBlock {
    block_size: usize,
    queue_depth: usize,
    intra_op_parallelism: usize,
    single_submit: bool,
    overlap_events: bool,
    use_gds: bool,
}

impl From<&AioConfig> for AioBlock {
    fn from(k: &AioConfig) -> AioBlock {
        AioBlock {
            block_size: k.block_size,
            queue_depth: k.queue_depth,
            intra_op_parallelism: k.parallelism,
            single_submit: k.single_submit,
            overlap_events: k.overlap_events,
            use_gds: false,
        }
    }
}
